"""The operations of docs/spec.md over framework arrays.

Each function checks its Python-level arguments (array types, scalar types) and hands everything to
the extension, which asks the library for the shapes of the outputs (its table's shape rules: they are
written once, in the library), has the caller's framework allocate them, and runs the op with one call.
"""

from . import _arrays, _backends, _expanse, _finite, _params


class _DtypeOf:
    """An output allocated in the dtype of the given input (when it is given)."""

    def __init__(self, name):
        self.name = name


def _call(op, inputs, outputs, *, backend, required, check_finite, in_place=None, exchange=None, **params):
    """Runs `op`. inputs: {name: array or None}, the first one the anchor whose framework and device
    the outputs take; outputs: {name: dtype to allocate: "" for the library's default, a dtype name,
    or _DtypeOf(input)}, in the shapes the library derives; in_place: {name: array} written in place;
    required: names that must not be None; check_finite: the call's argument (None: the
    process-wide setting); exchange: power_attention_backward's callable(stream) for
    expanse_power_attention_backward_exchange; params: the op's parameters by name (None: left at
    the library's default)."""
    check_finite = _finite.resolve(op, check_finite)
    for n in required:
        x = inputs[n] if n in inputs else in_place[n]
        if x is None:
            raise TypeError(f"{op}: argument '{n}' must be an array, got None")
    given = {n: _arrays.prepare(op, n, x) for n, x in inputs.items() if x is not None}
    written = {n: _arrays.prepare(op, n, x) for n, x in (in_place or {}).items() if x is not None}
    anchor = next(iter(given.values()))
    fw = _arrays.framework_of(anchor)
    device_type, device = fw.device(anchor)
    name = _backends.resolve(backend, device_type, op)

    requested = dict(written)
    for n, dtype in outputs.items():
        if isinstance(dtype, _DtypeOf):
            like = given.get(dtype.name)
            dtype = _arrays.framework_of(like).dtype(like) if like is not None else ""
        requested[n] = dtype

    def allocate(shape, dtype):
        return fw.empty(tuple(shape), dtype, anchor, name, device)

    params = {k: (int(v) if isinstance(v, bool) else v) for k, v in params.items() if v is not None}
    return _expanse.run(op, name, device, device_type, fw.stream(anchor), given, requested, allocate, params,
                        check_finite=check_finite, exchange=exchange)


def power_attention(q, k, v, log_g=None, *, p=2, scale=None, chunk_size=None, normalize=True,
                    initial_state=None, output_final_state=False, layout="sympow", backend=None,
                    check_finite=None):
    """Gated power attention: attention with the weights (scale q_i . k_j)^p, causal, optionally
    gated and normalized (docs/spec.md). For query i and keys j <= i of the same batch and kv head::

        A_ij = (scale * q_i . k_j)^p * exp(G_i - G_j)        G_i = log_g_1 + ... + log_g_i
        o_i  = sum_j A_ij v_j / sum_j A_ij                   normalize=True (o_i = 0 where the sum is 0)
        o_i  = sum_j A_ij v_j                                normalize=False

    Args:
        q: queries [b, t, hq, d].
        k: keys [b, t, h, d]. hq must be a multiple of h (grouped-query attention: query head i
            reads kv head i // (hq // h)).
        v: values [b, t, h, e].
        log_g: optional log of the per-token decay [b, t, h] (e.g. logsigmoid of a gate, <= 0),
            float32 (float64 with float64 inputs). None: no gating. -inf at a token is a reset: the
            tokens (and the initial state) before it no longer contribute.
        p: degree of the power, 1..4 (p = 1 is linear attention). normalize=True needs an even p.
        scale: query scale; None: 1/sqrt(d).
        chunk_size: None (the default, or -1, the same): the library chooses the form and the chunk
            size by sequence length and backend (the quadratic form for short sequences, the
            chunked algorithm for long ones). 0: the quadratic form. An int c >= 1: the chunked
            algorithm with chunks of c tokens (t need not be a multiple of c). Every choice
            computes the same function; only speed and rounding differ.
        normalize: divide by the sum of the weights (only for even p).
        initial_state: optional state (S0, z0) entering the sequence, as returned by
            output_final_state=True: S0 [b, h, D, e], z0 [b, h, D] (z0 may be None, or S0 given
            alone, when normalize=False). Its terms phi(scale q_i)^T S0 exp(G_i) join the
            numerator and phi(scale q_i)^T z0 exp(G_i) the denominator.
        output_final_state: also return the state after the last token.
        layout: feature-map layout of the states: 'sympow' (exact, D = C(d+p-1, p)), 'tensor'
            (D = d^p) or 'tiled:N' (tensor-core blocks, d % N == 0). Only matters for states.
        backend: backend name ('reference', 'cuda', ...); None: see set_default_backend().
        check_finite: first scan the floating inputs for NaN and infinities (log_g may hold -inf)
            and raise expanse.InvalidArgumentError naming the first non-finite input and the index
            of the element. None: the process-wide setting (set_check_finite(), off by default).
            Without the check, non-finite inputs give non-finite outputs and no error.

    dtypes: q, k and v share one dtype: float16, bfloat16 or float32 on every backend, float64 on
    the reference. Arrays may be numpy arrays or DLPack tensors (torch, cupy, jax), with any
    non-negative strides; they are never copied, and GPU tensors are used on their device and the
    framework's current stream. With torch tensors the call goes through the operator
    torch.ops.expanse.power_attention: differentiable (the gradients of power_attention_backward
    reach q, k, v, log_g and the initial state) and traced by torch.compile without a graph break.

    Returns:
        o [b, t, hq, e] in v's dtype, as an array of q's framework on q's device. With
        output_final_state=True, (o, (S, z)): S [b, h, D, e] and z [b, h, D] (None when
        normalize=False), float32 for float16, bfloat16 and float32 inputs and float64 for float64
        inputs, on every backend (or initial_state's dtype when one is given).

    Raises:
        TypeError: an argument is not an array, or has a dtype expanse does not take.
        ValueError: a bad value: shapes, ranks, dtypes, devices, p, layout, chunk_size, scale, and
            non-finite inputs with check_finite (expanse.InvalidArgumentError).
        NotImplementedError: the backend does not implement this problem, or a torch input requires
            grad (expanse.UnsupportedError, also a RuntimeError).
        RuntimeError: the backend is missing or unavailable (expanse.BackendError).

    Example::

        >>> rng = np.random.default_rng(0)
        >>> q, k, v = (rng.standard_normal((1, 100, 4, 16)) for _ in range(3))
        >>> log_g = np.log(rng.uniform(0.9, 1.0, (1, 100, 4)))
        >>> o = expanse.power_attention(q, k, v, log_g, p=2)                   # [1, 100, 4, 16]
        >>> o2, (S, z) = expanse.power_attention(q, k, v, log_g, chunk_size=32, output_final_state=True)
        >>> S.shape, z.shape                                                   # D = C(16+1, 2) = 136
        ((1, 4, 136, 16), (1, 4, 136))
    """
    if _arrays.is_torch(q):
        from . import _torch_ops
        return _torch_ops.call_power_attention(
            q, k, v, log_g, p=p, scale=scale, chunk_size=chunk_size, normalize=normalize, initial_state=initial_state,
            output_final_state=output_final_state, layout=layout, backend=backend,
            check_finite=_finite.resolve("power_attention", check_finite))
    return _power_attention(q, k, v, log_g, p=p, scale=scale, chunk_size=chunk_size, normalize=normalize,
                            initial_state=initial_state, output_final_state=output_final_state, layout=layout,
                            backend=backend, check_finite=check_finite)


def _power_attention(q, k, v, log_g, *, p, scale, chunk_size, normalize, initial_state, output_final_state, layout,
                     backend, check_finite):
    op = "power_attention"
    p = _params.degree(op, p)
    normalize = _params.flag(op, "normalize", normalize)
    output_final_state = _params.flag(op, "output_final_state", output_final_state)
    lay = _params.layout(op, layout)
    S0, z0 = _state_pair(op, "initial_state", initial_state, required=False)

    outputs = {"o": ""}
    if output_final_state:  # in the initial state's dtype when one is given
        outputs["final_S"] = _DtypeOf("initial_S")
        if normalize:
            outputs["final_z"] = _DtypeOf("initial_S")

    r = _call(op, {"q": q, "k": k, "v": v, "log_g": log_g, "initial_S": S0, "initial_z": z0}, outputs,
              backend=backend, required=("q", "k", "v"), check_finite=check_finite, p=p,
              scale=_params.scale(op, scale), chunk_size=_params.auto_chunk_size(op, chunk_size),
              normalize=normalize, layout=lay)
    if output_final_state:
        return r["o"], (r["final_S"], r.get("final_z"))
    return r["o"]


def power_attention_backward(q, k, v, log_g, do, *, p=2, scale=None, chunk_size=None, normalize=True,
                             initial_state=None, dfinal_state=None, o=None, layout="sympow", backend=None,
                             check_finite=None):
    """The gradients of power_attention (docs/spec.md "Gradients"): of the loss
    L = sum(do * o) + <dS, S_final> + <dz, z_final> with respect to q, k, v, log_g and the initial
    state, for the forward power_attention(q, k, v, log_g, p=p, scale=scale, normalize=normalize,
    initial_state=initial_state, layout=layout).

    Args:
        q, k, v, log_g, p, scale, chunk_size, normalize, initial_state, layout, backend,
            check_finite: the forward's arguments (log_g may be None). chunk_size only picks the
            form; the gradients do not depend on it.
        do: the cotangent of the forward's output o [b, t, hq, e], in q's dtype (the C ABI's dout).
        dfinal_state: optional cotangent (dS, dz) of the forward's final state (dz may be None, or
            dS given alone); None: the final state was not used.
        o: the forward's output, which normalize=True needs; None: computed here by a forward call
            (pass the output you have to save that call). Ignored when normalize=False.

    Returns:
        (dq, dk, dv, dlog_g): gradients in the dtypes of q, k, v and float32 (float64 with float64
        inputs) for dlog_g, which is None when log_g is None (0 at a reset, log_g = -inf). With
        initial_state, a fifth item (dS0, dz0), dz0 None when the initial state has no z0.

    Example::

        >>> o = expanse.power_attention(q, k, v, log_g)
        >>> dq, dk, dv, dlog_g = expanse.power_attention_backward(q, k, v, log_g, np.ones_like(o), o=o)

    In PyTorch, expanse.power_attention is differentiable itself (it calls this through autograd).
    """
    op = "power_attention_backward"
    if do is None:
        raise TypeError(f"{op}: argument 'do' must be an array, got None")
    p = _params.degree(op, p)
    normalize = _params.flag(op, "normalize", normalize)
    lay = _params.layout(op, layout)
    S0, z0 = _state_pair(op, "initial_state", initial_state, required=False)
    dS, dz = _state_pair(op, "dfinal_state", dfinal_state, required=False)
    if normalize and o is None:
        o = _power_attention(q, k, v, log_g, p=p, scale=scale, chunk_size=chunk_size, normalize=True,
                             initial_state=initial_state, output_final_state=False, layout=layout, backend=backend,
                             check_finite=check_finite)
    outputs = {"dq": "", "dk": "", "dv": ""}
    if log_g is not None:
        outputs["dlog_g"] = ""
    if S0 is not None:
        outputs["dinitial_S"] = _DtypeOf("initial_S")
        if z0 is not None:
            outputs["dinitial_z"] = _DtypeOf("initial_S")
    r = _call(op, {"q": q, "k": k, "v": v, "log_g": log_g, "initial_S": S0, "initial_z": z0,
                   "o": o if normalize else None, "dout": do, "dfinal_S": dS, "dfinal_z": dz}, outputs,
              backend=backend, required=("q", "k", "v", "dout"), check_finite=check_finite, p=p,
              scale=_params.scale(op, scale), chunk_size=_params.auto_chunk_size(op, chunk_size),
              normalize=normalize, layout=lay)
    grads = (r["dq"], r["dk"], r["dv"], r.get("dlog_g"))
    if S0 is not None:
        return grads + ((r["dinitial_S"], r.get("dinitial_z")),)
    return grads


def _power_attention_exchange(q, k, v, log_g, *, initial, final, exchange, p, scale, chunk_size, normalize, layout,
                              backend):
    """power_attention whose initial state arrives during the call (expanse_power_attention_exchange,
    docs/spec.md "Context parallelism"): final (S, z) receives the piece's final state from zero; then
    exchange(stream) must write initial (S, z) in place; then o comes from that initial state. z parts
    are None unless normalize. Returns o."""
    op = "power_attention"
    r = _call(op, {"q": q, "k": k, "v": v, "log_g": log_g, "initial_S": initial[0], "initial_z": initial[1]},
              {"o": ""}, in_place={"final_S": final[0], "final_z": final[1]}, exchange=exchange, backend=backend,
              required=("q", "k", "v"), check_finite=None, p=p, scale=_params.scale(op, scale),
              chunk_size=_params.auto_chunk_size(op, chunk_size), normalize=normalize,
              layout=_params.layout(op, layout))
    return r["o"]


def _power_attention_backward_exchange(q, k, v, log_g, o, do, *, initial_state, dinitial, dfinal, exchange, p,
                                       scale, chunk_size, normalize, layout, backend):
    """power_attention_backward whose final-state cotangent arrives during the call
    (expanse_power_attention_backward_exchange, docs/spec.md "Context parallelism"): dinitial (dS, dz)
    receives the initial state's cotangent without dfinal; then exchange(stream) must write dfinal
    (dS, dz) in place; then every gradient comes as with that dfinal, dinitial included. z parts are
    None unless normalize. Returns (dq, dk, dv, dlog_g)."""
    op = "power_attention_backward"
    outputs = {"dq": "", "dk": "", "dv": ""}
    if log_g is not None:
        outputs["dlog_g"] = ""
    r = _call(op, {"q": q, "k": k, "v": v, "log_g": log_g, "initial_S": initial_state[0],
                   "initial_z": initial_state[1], "o": o if normalize else None, "dout": do, "dfinal_S": dfinal[0],
                   "dfinal_z": dfinal[1]}, outputs,
              in_place={"dinitial_S": dinitial[0], "dinitial_z": dinitial[1]}, exchange=exchange, backend=backend,
              required=("q", "k", "v", "dout"), check_finite=None, p=p, scale=_params.scale(op, scale),
              chunk_size=_params.auto_chunk_size(op, chunk_size), normalize=normalize,
              layout=_params.layout(op, layout))
    return r["dq"], r["dk"], r["dv"], r.get("dlog_g")


def power_attention_step(q, k, v, log_g=None, *, state, p=2, scale=None, normalize=True, layout="sympow",
                         backend=None, check_finite=None):
    """A decoding step of power attention: updates the state in place with t new tokens and returns
    their outputs (the recurrent form of docs/spec.md), token by token::

        S <- exp(log_g_i) S + phi(k_i) v_i^T        z <- exp(log_g_i) z + phi(k_i)
        o_i = phi(scale q_i)^T S / phi(scale q_i)^T z      (normalize=False: o_i = phi(scale q_i)^T S)

    One token is the usual decoding step; several (t > 1: the draft tokens of speculative decoding,
    or a prompt appended to a state) give the same as power_attention with the state as its initial
    and final state, which is how the GPU backends run them.

    Args:
        q: [b, t, hq, d] the new tokens' queries; for one token also [b, hq, d].
        k: [b, t, h, d] (or [b, h, d]).
        v: [b, t, h, e] (or [b, h, e]).
        log_g: optional [b, t, h] (or [b, h]) log of the decay, float32 (float64 with float64 inputs).
        state: (S, z), S [b, h, D, e] and z [b, h, D], float32 (float64 for float64 inputs), both
            writable and updated in place: e.g. the final state of power_attention(...,
            output_final_state=True), or zeros to start a sequence. z may be None (or S given
            alone) when normalize=False. Nothing is written when the call raises.
        p, scale, normalize, layout, backend, check_finite: as in power_attention (layout must be
            the state's). Without check_finite, a NaN or infinity in the inputs or the state gives
            non-finite outputs and state, and no error.

    Returns:
        o in v's dtype, [b, t, hq, e] ([b, hq, e] when q has no token axis), as an array of q's
        framework.

    Example::

        >>> o, state = expanse.power_attention(q, k, v, log_g, output_final_state=True)
        >>> o_next = expanse.power_attention_step(q_new, k_new, v_new, g_new, state=state)  # q_new [b, hq, d]
        >>> o_draft = expanse.power_attention_step(q4, k4, v4, g4, state=state)  # 4 draft tokens: [b, 4, hq, d]
    """
    op = "power_attention_step"
    p = _params.degree(op, p)
    normalize = _params.flag(op, "normalize", normalize)
    lay = _params.layout(op, layout)
    S, z = _state_pair(op, "state", state, required=True)

    r = _call(op, {"q": q, "k": k, "v": v, "log_g": log_g}, {"o": ""}, backend=backend, in_place={"S": S, "z": z},
              required=("q", "k", "v", "S"), check_finite=check_finite,
              p=p, scale=_params.scale(op, scale), normalize=normalize, layout=lay)
    return r["o"]


def sympow_expand(x, *, p=2, layout="sympow", backend=None, check_finite=None):
    """The feature map phi: the symmetric power expansion, with <phi(a), phi(b)> = (a . b)^p.

    Args:
        x: [..., d] any number of leading dimensions.
        p: degree, 1..6.
        layout: 'sympow' (exact: one entry per multiset of p indices i1 <= ... <= ip, in
            lexicographic order, times sqrt(p! / prod(multiplicity!)); D = C(d+p-1, p)),
            'tensor' (all d^p products, row-major) or 'tiled:N' (blocks of N^p, d % N == 0).
        backend, check_finite: as in power_attention.

    Returns:
        phi(x) [..., D] in x's dtype.

    Example::

        >>> a, b = np.random.default_rng(0).standard_normal((2, 8))
        >>> pa, pb = expanse.sympow_expand(np.stack([a, b]), p=3)           # [2, C(10, 3) = 120]
        >>> np.allclose(pa @ pb, (a @ b) ** 3)
        True
    """
    op = "sympow_expand"
    p = _params.degree(op, p)
    lay = _params.layout(op, layout)

    return _call(op, {"x": x}, {"out": ""}, backend=backend, required=("x",), check_finite=check_finite, p=p,
                 layout=lay)["out"]


def update_state(k, v, log_g=None, *, p=2, chunk_size=_params.DEFAULT_CHUNK, layout="sympow", backend=None,
                 check_finite=None):
    """Chunk states (step 1 of the chunked algorithm): for each chunk m of chunk_size tokens, with
    Gc_j the cumulative sum of log_g inside the chunk and A_m its total::

        S_m = sum_{j in m} exp(A_m - Gc_j) phi(k_j) v_j^T        z_m = sum_{j in m} exp(A_m - Gc_j) phi(k_j)

    Args:
        k: [b, t, h, d].  v: [b, t, h, e].  log_g: optional [b, t, h], float32 (float64 with float64 inputs).
        p: 1..4.  chunk_size: c >= 1 (the last chunk may be shorter).  layout: as in sympow_expand.
        backend, check_finite: as in power_attention.

    Returns:
        (S, z): S [b, n, h, D, e] and z [b, n, h, D], n = ceil(t / chunk_size), float32 (float64
        for float64 inputs).
    """
    if _arrays.is_torch(k):
        from . import _torch_ops
        return _torch_ops.call_update_state(k, v, log_g, p=p, chunk_size=chunk_size, layout=layout, backend=backend,
                                            check_finite=_finite.resolve("update_state", check_finite))
    return _update_state(k, v, log_g, p=p, chunk_size=chunk_size, layout=layout, backend=backend,
                         check_finite=check_finite)


def _update_state(k, v, log_g, *, p, chunk_size, layout, backend, check_finite):
    op = "update_state"
    p = _params.degree(op, p)
    c = _params.chunk_size(op, chunk_size, expected=">= 1")
    lay = _params.layout(op, layout)

    r = _call(op, {"k": k, "v": v, "log_g": log_g}, {"S": "", "z": ""}, backend=backend, required=("k", "v"),
              check_finite=check_finite, p=p, chunk_size=c, layout=lay)
    return r["S"], r["z"]


def discumsum(X, A, Y_init=None, *, backend=None, check_finite=None):
    """Discounted cumulative sum over chunks (step 2 of the chunked algorithm)::

        Y_0 = Y_init (zeros when None)        Y_{m+1} = exp(A_m) Y_m + X_m

    Args:
        X: [b, n, h, ...] any trailing dimensions (e.g. the chunk states S_m of update_state).
        A: [b, n, h] log-decays, float32 (float64 with float64 X), e.g. each chunk's total log_g
            (-inf: a reset).
        Y_init: optional [b, h, ...] starting value.
        backend, check_finite: as in power_attention.

    Returns:
        Y [b, n+1, h, ...]: Y[:, m] is the state entering chunk m, Y[:, n] the final state;
        float32 (float64 for float64 X).
    """
    if _arrays.is_torch(X):
        from . import _torch_ops
        return _torch_ops.call_discumsum(X, A, Y_init, backend=backend,
                                         check_finite=_finite.resolve("discumsum", check_finite))
    return _discumsum(X, A, Y_init, backend=backend, check_finite=check_finite)


def _discumsum(X, A, Y_init, *, backend, check_finite):
    op = "discumsum"

    return _call(op, {"X": X, "A": A, "Y_init": Y_init}, {"Y": ""}, backend=backend, required=("X", "A"),
                 check_finite=check_finite)["Y"]


def sequence_state(k, v, log_g=None, *, p=2, chunk_size=_params.DEFAULT_CHUNK, layout="sympow", backend=None,
                   check_finite=None):
    """The state a sequence leaves when it starts from zero, and its total log decay: what a piece of
    a longer sequence contributes to the pieces after it (context parallelism, docs/spec.md)::

        S = sum_j exp(G_t - G_j) phi(k_j) v_j^T      z = sum_j exp(G_t - G_j) phi(k_j)      A = G_t

    with G the cumulative sum of log_g (A = -inf where the sequence holds a reset, 0 without log_g).
    The state entering piece r + 1 is then exp(A_r) Y_r + S_r (discumsum over the pieces).

    Args:
        k: [b, t, h, d].  v: [b, t, h, e].  log_g: optional [b, t, h], float32 (float64 with float64 inputs).
        p: 1..4.  chunk_size: c >= 1, the chunks it is computed by (update_state's, then discumsum).
        layout: as in sympow_expand.  backend, check_finite: as in power_attention.

    Returns:
        (S [b, h, D, e], z [b, h, D], A [b, h]), float32 (float64 for float64 inputs). Not
        differentiable with torch tensors (compose update_state and discumsum for that).

    Example::

        >>> S, z, A = expanse.sequence_state(k, v, log_g)
        >>> o, (S2, z2) = expanse.power_attention(q, k, v, log_g, output_final_state=True)
        >>> np.allclose(S, S2, atol=1e-4)   # power_attention's final state from zero
        True
    """
    op = "sequence_state"
    p = _params.degree(op, p)
    c = _params.chunk_size(op, chunk_size, expected=">= 1")
    lay = _params.layout(op, layout)

    r = _call(op, {"k": k, "v": v, "log_g": log_g}, {"S": "", "z": "", "A": ""}, backend=backend,
              required=("k", "v"), check_finite=check_finite, p=p, chunk_size=c, layout=lay)
    return r["S"], r["z"], r["A"]


def query_state(q, S, z=None, log_g=None, *, intra=None, p=2, scale=None, chunk_size=_params.DEFAULT_CHUNK,
                normalize=True, layout="sympow", backend=None, check_finite=None):
    """The inter-chunk term (step 3 of the chunked algorithm), optionally combined with the
    intra-chunk result into the final output. For query i in chunk m (Gc_i: cumulative log_g inside
    the chunk)::

        num_i = phi(scale q_i)^T S_m exp(Gc_i)  [+ y_i exp(rowmax_i)]
        den_i = phi(scale q_i)^T z_m exp(Gc_i)  [+ l_i exp(rowmax_i)]
        o_i   = num_i / den_i   (normalize=True)        o_i = num_i   (normalize=False)

    Args:
        q: [b, t, hq, d].
        S: [b, n, h, D, e] the states entering each chunk (discumsum's Y[:, :n]), float32/float64.
        z: [b, n, h, D]; required when normalize=True.
        log_g: optional [b, t, h].
        intra: optional (y, l, rowmax) from chunk_attention with the same chunk_size.
        p, scale, layout, backend, check_finite: as in power_attention.  chunk_size: c >= 1, as
            used for S.

    Returns:
        o [b, t, hq, e] in q's dtype.
    """
    if _arrays.is_torch(q):
        from . import _torch_ops
        return _torch_ops.call_query_state(q, S, z, log_g, intra=intra, p=p, scale=scale, chunk_size=chunk_size,
                                           normalize=normalize, layout=layout, backend=backend,
                                           check_finite=_finite.resolve("query_state", check_finite))
    return _query_state(q, S, z, log_g, intra=intra, p=p, scale=scale, chunk_size=chunk_size, normalize=normalize,
                        layout=layout, backend=backend, check_finite=check_finite)


def _query_state(q, S, z, log_g, *, intra, p, scale, chunk_size, normalize, layout, backend, check_finite):
    op = "query_state"
    p = _params.degree(op, p)
    c = _params.chunk_size(op, chunk_size, expected=">= 1")
    normalize = _params.flag(op, "normalize", normalize)
    lay = _params.layout(op, layout)
    y, l, rowmax = _intra(op, intra)

    r = _call(op, {"q": q, "S": S, "z": z, "log_g": log_g, "y": y, "l": l, "rowmax": rowmax}, {"o": ""},
              backend=backend, required=("q", "S"), check_finite=check_finite, p=p, scale=_params.scale(op, scale),
              chunk_size=c, normalize=normalize, layout=lay)
    return r["o"]


def chunk_attention(q, k, v, log_g=None, *, p=2, scale=None, chunk_size=_params.DEFAULT_CHUNK, backend=None,
                    check_finite=None):
    """Causal power attention inside each chunk (step 4 of the chunked algorithm), stabilized in
    log space so that large p never overflows. For i, j in the same chunk, j <= i::

        s_ij = p log|scale q_i . k_j| + Gc_i - Gc_j      rowmax_i = max_j s_ij
        y_i  = sum_j sign_ij exp(s_ij - rowmax_i) v_j     l_i = sum_j sign_ij exp(s_ij - rowmax_i)

    (sign_ij = sign(q_i . k_j)^p), so the true numerator is y_i exp(rowmax_i) and the denominator
    l_i exp(rowmax_i).

    Args:
        q: [b, t, hq, d].  k: [b, t, h, d].  v: [b, t, h, e].  log_g: optional [b, t, h].
        p: 1..4.  scale: None for 1/sqrt(d).
        chunk_size: c >= 1; 0 or None: one chunk spanning the whole sequence (quadratic attention).
        backend, check_finite: as in power_attention.

    Returns:
        (y, l, rowmax): y [b, t, hq, e], l and rowmax [b, t, hq], float32 (float64 for float64 inputs).
    """
    if _arrays.is_torch(q):
        from . import _torch_ops
        return _torch_ops.call_chunk_attention(q, k, v, log_g, p=p, scale=scale, chunk_size=chunk_size, backend=backend,
                                               check_finite=_finite.resolve("chunk_attention", check_finite))
    return _chunk_attention(q, k, v, log_g, p=p, scale=scale, chunk_size=chunk_size, backend=backend,
                            check_finite=check_finite)


def _chunk_attention(q, k, v, log_g, *, p, scale, chunk_size, backend, check_finite):
    op = "chunk_attention"
    p = _params.degree(op, p)
    # None: one chunk over the whole sequence, which the C ABI spells 0.
    c = 0 if chunk_size is None else _params.chunk_size(op, chunk_size, expected=">= 0 (0: one chunk)")

    r = _call(op, {"q": q, "k": k, "v": v, "log_g": log_g}, {"y": "", "l": "", "rowmax": ""}, backend=backend, required=("q", "k", "v"),
              check_finite=check_finite, p=p, scale=_params.scale(op, scale), chunk_size=c)
    return r["y"], r["l"], r["rowmax"]


# ---------------------------------------------------------------- the core operations' gradients
# Each takes its forward's arguments and the cotangents of its outputs and returns the gradients of
# its differentiable inputs (docs/spec.md "Gradients"), for users who compose the core operations.


def update_state_backward(k, v, log_g, dS, dz=None, *, p=2, chunk_size=_params.DEFAULT_CHUNK, layout="sympow",
                          backend=None, check_finite=None):
    """The gradients of update_state: from the cotangents dS [b, n, h, D, e] and dz [b, n, h, D]
    (None: zero) of its states, (dk, dv, dlog_g): dk, dv in k's and v's dtypes, dlog_g float32
    (float64 with float64 inputs), None when log_g is None."""
    op = "update_state_backward"
    outputs = {"dk": "", "dv": ""}
    if log_g is not None:
        outputs["dlog_g"] = ""
    r = _call(op, {"k": k, "v": v, "log_g": log_g, "dS": dS, "dz": dz}, outputs, backend=backend,
              required=("k", "v", "dS"), check_finite=check_finite, p=_params.degree(op, p),
              chunk_size=_params.chunk_size(op, chunk_size, expected=">= 1"), layout=_params.layout(op, layout))
    return r["dk"], r["dv"], r.get("dlog_g")


def discumsum_backward(X, A, dY, Y_init=None, *, backend=None, check_finite=None):
    """The gradients of discumsum: from the cotangent dY [b, n+1, h, ...] of its output,
    (dX, dA, dY_init): dX in X's dtype, dA float32 (float64 with float64 inputs), dY_init in
    Y_init's dtype (None when Y_init is None)."""
    op = "discumsum_backward"
    outputs = {"dX": "", "dA": ""}
    if Y_init is not None:
        outputs["dY_init"] = _DtypeOf("Y_init")
    r = _call(op, {"X": X, "A": A, "Y_init": Y_init, "dY": dY}, outputs, backend=backend, required=("X", "A", "dY"),
              check_finite=check_finite)
    return r["dX"], r["dA"], r.get("dY_init")


def query_state_backward(q, S, z, log_g, do, *, intra=None, o=None, p=2, scale=None,
                         chunk_size=_params.DEFAULT_CHUNK, normalize=True, layout="sympow", backend=None,
                         check_finite=None):
    """The gradients of query_state: from the cotangent do of its output o (which normalize=True
    needs: None computes it), (dq, dS, dz, dlog_g, dintra): dz None without z, dlog_g None without
    log_g, dintra = (dy, dl) with intra (rowmax is a stabilizer and gets no gradient), else None."""
    op = "query_state_backward"
    normalize = _params.flag(op, "normalize", normalize)
    y, l, rowmax = _intra(op, intra)
    if normalize and o is None:
        o = _query_state(q, S, z, log_g, intra=intra, p=p, scale=scale, chunk_size=chunk_size, normalize=True,
                         layout=layout, backend=backend, check_finite=check_finite)
    outputs = {"dq": "", "dS": ""}
    for name, given in (("dz", z), ("dlog_g", log_g), ("dy", y), ("dl", l)):
        if given is not None:
            outputs[name] = ""
    r = _call(op, {"q": q, "S": S, "z": z, "log_g": log_g, "y": y, "l": l, "rowmax": rowmax,
                   "o": o if normalize else None, "dout": do}, outputs, backend=backend,
              required=("q", "S", "dout"), check_finite=check_finite, p=_params.degree(op, p),
              scale=_params.scale(op, scale), chunk_size=_params.chunk_size(op, chunk_size, expected=">= 1"),
              normalize=normalize, layout=_params.layout(op, layout))
    dintra = (r["dy"], r.get("dl")) if y is not None else None
    return r["dq"], r["dS"], r.get("dz"), r.get("dlog_g"), dintra


def chunk_attention_backward(q, k, v, log_g, rowmax, dy, dl=None, *, p=2, scale=None,
                             chunk_size=_params.DEFAULT_CHUNK, backend=None, check_finite=None):
    """The gradients of chunk_attention with rowmax held at the forward's value (pass the rowmax it
    returned): from the cotangents dy and dl (None: zero) of y and l, (dq, dk, dv, dlog_g), dlog_g
    None when log_g is None."""
    op = "chunk_attention_backward"
    c = 0 if chunk_size is None else _params.chunk_size(op, chunk_size, expected=">= 0 (0: one chunk)")
    outputs = {"dq": "", "dk": "", "dv": ""}
    if log_g is not None:
        outputs["dlog_g"] = ""
    r = _call(op, {"q": q, "k": k, "v": v, "log_g": log_g, "rowmax": rowmax, "dy": dy, "dl": dl}, outputs,
              backend=backend, required=("q", "k", "v", "rowmax", "dy"), check_finite=check_finite,
              p=_params.degree(op, p), scale=_params.scale(op, scale), chunk_size=c)
    return r["dq"], r["dk"], r["dv"], r.get("dlog_g")

def _expanded_dim_of(d, p, layout):
    """D for head dim d, degree p and a layout text (torch's fake tensors need it)."""
    kind, d_tile = _params.layout("expanded_dim", layout)
    return _expanse.expanded_dim(p, d, kind, d_tile)


def _state_pair(op, name, state, *, required):
    """(S, z) from a tuple/list of two, or a bare S (z = None)."""
    if state is None:
        if required:
            raise TypeError(f"{op}: '{name}' is required: a state (S, z)")
        return None, None
    if isinstance(state, (tuple, list)):
        if len(state) != 2:
            raise TypeError(f"{op}: '{name}' must be (S, z) or S alone, got a sequence of {len(state)}")
        return state[0], state[1]
    return state, None


def _intra(op, intra):
    if intra is None:
        return None, None, None
    if not isinstance(intra, (tuple, list)) or len(intra) != 3:
        raise TypeError(f"{op}: 'intra' must be the (y, l, rowmax) of chunk_attention")
    return tuple(intra)

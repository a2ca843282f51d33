"""PyTorch operators for expanse's differentiable operations (imported on the first call with torch
tensors, so that `import expanse` does not import torch).

power_attention, update_state, discumsum, query_state and chunk_attention, and their backwards, are
torch.library custom operators (expanse::<name>): with fake (meta) implementations, so torch.compile
traces a model that calls them into one graph, and with the backward registered as the forward's
autograd formula. Each runs the
library on the tensors' device through the same path as numpy arrays (the tensors it receives never
require grad). Absent optional outputs are empty tensors, as an operator's schema is fixed.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _ops, _params


def _none_if_empty(x):
    return None if x is None or x.numel() == 0 and x.dim() == 1 else x


def _empty(like):
    return like.new_empty((0,))


def _state_dtype(q, initial_S):
    if initial_S is not None:
        return initial_S.dtype
    return torch.float64 if q.dtype == torch.float64 else torch.float32


@torch.library.custom_op("expanse::power_attention", mutates_args=())
def power_attention(q: Tensor, k: Tensor, v: Tensor, log_g: Optional[Tensor], initial_S: Optional[Tensor],
                    initial_z: Optional[Tensor], p: int, scale: float, chunk_size: int, normalize: bool, layout: str,
                    output_final_state: bool, backend: str, check_finite: bool) -> Tuple[Tensor, Tensor, Tensor]:
    initial = None if initial_S is None else (initial_S, initial_z)
    r = _ops._power_attention(q, k, v, log_g, p=p, scale=scale or None, chunk_size=chunk_size, normalize=normalize,
                              initial_state=initial, output_final_state=output_final_state, layout=layout,
                              backend=backend or None, check_finite=check_finite)
    if not output_final_state:
        return r, _empty(q), _empty(q)
    o, (S, z) = r
    return o, S, z if z is not None else _empty(q)


@power_attention.register_fake
def _(q, k, v, log_g, initial_S, initial_z, p, scale, chunk_size, normalize, layout, output_final_state, backend,
      check_finite):
    b, t, hq, _ = q.shape
    h, e = v.shape[2], v.shape[3]
    o = q.new_empty((b, t, hq, e), dtype=v.dtype)
    if not output_final_state:
        return o, _empty(q), _empty(q)
    D = _ops._expanded_dim_of(q.shape[3], p, layout)
    st = _state_dtype(q, initial_S)
    z = q.new_empty((b, h, D), dtype=st) if normalize else _empty(q)
    return o, q.new_empty((b, h, D, e), dtype=st), z


@torch.library.custom_op("expanse::power_attention_backward", mutates_args=())
def power_attention_backward(q: Tensor, k: Tensor, v: Tensor, log_g: Optional[Tensor], initial_S: Optional[Tensor],
                             initial_z: Optional[Tensor], o: Tensor, do: Tensor, dfinal_S: Optional[Tensor],
                             dfinal_z: Optional[Tensor], p: int, scale: float, chunk_size: int, normalize: bool,
                             layout: str, backend: str,
                             check_finite: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    initial = None if initial_S is None else (initial_S, initial_z)
    dfinal = None if dfinal_S is None and dfinal_z is None else (dfinal_S, dfinal_z)
    r = _ops.power_attention_backward(q, k, v, log_g, do, p=p, scale=scale or None, chunk_size=chunk_size,
                                      normalize=normalize, initial_state=initial, dfinal_state=dfinal, o=o,
                                      layout=layout, backend=backend or None, check_finite=check_finite)
    dq, dk, dv, dlog_g = r[:4]
    dS0, dz0 = r[4] if len(r) > 4 else (None, None)
    return tuple(x if x is not None else _empty(q) for x in (dq, dk, dv, dlog_g, dS0, dz0))


@power_attention_backward.register_fake
def _(q, k, v, log_g, initial_S, initial_z, o, do, dfinal_S, dfinal_z, p, scale, chunk_size, normalize, layout,
      backend, check_finite):
    like = lambda x: torch.empty_like(x) if x is not None else _empty(q)  # noqa: E731
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), like(log_g), like(initial_S),
            like(initial_z))


def _setup_context(ctx, inputs, output):
    q, k, v, log_g, initial_S, initial_z, p, scale, chunk_size, normalize, layout, _, backend, check_finite = inputs
    ctx.save_for_backward(q, k, v, log_g, initial_S, initial_z, output[0])
    ctx.params = (p, scale, chunk_size, normalize, layout, backend, check_finite)


def _backward(ctx, do, dS, dz):
    q, k, v, log_g, initial_S, initial_z, o = ctx.saved_tensors
    p, scale, chunk_size, normalize, layout, backend, check_finite = ctx.params
    do = do.to(q.dtype) if do is not None else torch.zeros_like(o, dtype=q.dtype)
    dq, dk, dv, dlog_g, dS0, dz0 = power_attention_backward(
        q, k, v, log_g, initial_S, initial_z, o, do, _none_if_empty(dS), _none_if_empty(dz), p, scale, chunk_size,
        normalize, layout, backend, check_finite)
    return (dq, dk, dv, dlog_g if log_g is not None else None, dS0 if initial_S is not None else None,
            dz0 if initial_z is not None else None, None, None, None, None, None, None, None, None)


power_attention.register_autograd(_backward, setup_context=_setup_context)


def call_power_attention(q, k, v, log_g, *, p, scale, chunk_size, normalize, initial_state, output_final_state,
                         layout, backend, check_finite):
    """expanse.power_attention on torch tensors, through the operator (differentiable, traceable)."""
    op = "power_attention"
    S0, z0 = _ops._state_pair(op, "initial_state", initial_state, required=False)
    o, S, z = power_attention(q, k, v, log_g, S0, z0, _params.degree(op, p), float(_params.scale(op, scale) or 0.0),
                              _params.auto_chunk_size(op, chunk_size), bool(normalize), layout,
                              bool(output_final_state), backend or "", bool(check_finite))
    if output_final_state:
        return o, (S, z if normalize else None)
    return o


# ---------------------------------------------------------------- the core operations
# Each as an operator with its fake implementation and its backward (an operator too, so that
# torch.compile traces the backward graph as well).

def _chunks(t, c):
    return -(-t // c) if c > 0 else 1


@torch.library.custom_op("expanse::update_state", mutates_args=())
def update_state(k: Tensor, v: Tensor, log_g: Optional[Tensor], p: int, chunk_size: int, layout: str, backend: str,
                 check_finite: bool) -> Tuple[Tensor, Tensor]:
    return _ops._update_state(k, v, log_g, p=p, chunk_size=chunk_size, layout=layout, backend=backend or None,
                              check_finite=check_finite)


@update_state.register_fake
def _(k, v, log_g, p, chunk_size, layout, backend, check_finite):
    b, t, h, d = k.shape
    n, D, st = _chunks(t, chunk_size), _ops._expanded_dim_of(d, p, layout), _state_dtype(k, None)
    return k.new_empty((b, n, h, D, v.shape[3]), dtype=st), k.new_empty((b, n, h, D), dtype=st)


@torch.library.custom_op("expanse::update_state_backward", mutates_args=())
def update_state_backward(k: Tensor, v: Tensor, log_g: Optional[Tensor], dS: Tensor, dz: Optional[Tensor], p: int,
                          chunk_size: int, layout: str, backend: str,
                          check_finite: bool) -> Tuple[Tensor, Tensor, Tensor]:
    dk, dv, dlog_g = _ops.update_state_backward(k, v, log_g, dS, dz, p=p, chunk_size=chunk_size, layout=layout,
                                                backend=backend or None, check_finite=check_finite)
    return dk, dv, dlog_g if dlog_g is not None else _empty(k)


@update_state_backward.register_fake
def _(k, v, log_g, dS, dz, p, chunk_size, layout, backend, check_finite):
    return torch.empty_like(k), torch.empty_like(v), torch.empty_like(log_g) if log_g is not None else _empty(k)


def _update_state_setup(ctx, inputs, output):
    k, v, log_g, p, chunk_size, layout, backend, check_finite = inputs
    ctx.save_for_backward(k, v, log_g)
    ctx.params = (p, chunk_size, layout, backend, check_finite)


def _update_state_backward(ctx, dS, dz):
    k, v, log_g = ctx.saved_tensors
    dS = dS if dS is not None else torch.zeros(0)
    dk, dv, dlog_g = update_state_backward(k, v, log_g, dS, dz, *ctx.params)
    return dk, dv, dlog_g if log_g is not None else None, None, None, None, None, None


update_state.register_autograd(_update_state_backward, setup_context=_update_state_setup)


@torch.library.custom_op("expanse::discumsum", mutates_args=())
def discumsum(X: Tensor, A: Tensor, Y_init: Optional[Tensor], backend: str, check_finite: bool) -> Tensor:
    return _ops._discumsum(X, A, Y_init, backend=backend or None, check_finite=check_finite)


@discumsum.register_fake
def _(X, A, Y_init, backend, check_finite):
    shape = list(X.shape)
    shape[1] += 1
    return X.new_empty(shape, dtype=_state_dtype(X, None))


@torch.library.custom_op("expanse::discumsum_backward", mutates_args=())
def discumsum_backward(X: Tensor, A: Tensor, Y_init: Optional[Tensor], dY: Tensor, backend: str,
                       check_finite: bool) -> Tuple[Tensor, Tensor, Tensor]:
    dX, dA, dY_init = _ops.discumsum_backward(X, A, dY, Y_init, backend=backend or None, check_finite=check_finite)
    return dX, dA, dY_init if dY_init is not None else _empty(X)


@discumsum_backward.register_fake
def _(X, A, Y_init, dY, backend, check_finite):
    return torch.empty_like(X), torch.empty_like(A), torch.empty_like(Y_init) if Y_init is not None else _empty(X)


def _discumsum_setup(ctx, inputs, output):
    X, A, Y_init, backend, check_finite = inputs
    ctx.save_for_backward(X, A, Y_init)
    ctx.params = (backend, check_finite)


def _discumsum_backward(ctx, dY):
    X, A, Y_init = ctx.saved_tensors
    dX, dA, dY_init = discumsum_backward(X, A, Y_init, dY, *ctx.params)
    return dX, dA, dY_init if Y_init is not None else None, None, None


discumsum.register_autograd(_discumsum_backward, setup_context=_discumsum_setup)


@torch.library.custom_op("expanse::query_state", mutates_args=())
def query_state(q: Tensor, S: Tensor, z: Optional[Tensor], log_g: Optional[Tensor], y: Optional[Tensor],
                l: Optional[Tensor], rowmax: Optional[Tensor], p: int, scale: float, chunk_size: int, normalize: bool,
                layout: str, backend: str, check_finite: bool) -> Tensor:
    intra = None if y is None else (y, l, rowmax)
    return _ops._query_state(q, S, z, log_g, intra=intra, p=p, scale=scale or None, chunk_size=chunk_size,
                             normalize=normalize, layout=layout, backend=backend or None, check_finite=check_finite)


@query_state.register_fake
def _(q, S, z, log_g, y, l, rowmax, p, scale, chunk_size, normalize, layout, backend, check_finite):
    return q.new_empty((*q.shape[:3], S.shape[4]))


@torch.library.custom_op("expanse::query_state_backward", mutates_args=())
def query_state_backward(q: Tensor, S: Tensor, z: Optional[Tensor], log_g: Optional[Tensor], y: Optional[Tensor],
                         l: Optional[Tensor], rowmax: Optional[Tensor], o: Tensor, do: Tensor, p: int, scale: float,
                         chunk_size: int, normalize: bool, layout: str, backend: str,
                         check_finite: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    intra = None if y is None else (y, l, rowmax)
    dq, dS, dz, dlog_g, dintra = _ops.query_state_backward(
        q, S, z, log_g, do, intra=intra, o=o, p=p, scale=scale or None, chunk_size=chunk_size, normalize=normalize,
        layout=layout, backend=backend or None, check_finite=check_finite)
    dy, dl = dintra if dintra is not None else (None, None)
    return tuple(x if x is not None else _empty(q) for x in (dq, dS, dz, dlog_g, dy, dl))


@query_state_backward.register_fake
def _(q, S, z, log_g, y, l, rowmax, o, do, p, scale, chunk_size, normalize, layout, backend, check_finite):
    like = lambda x: torch.empty_like(x) if x is not None else _empty(q)  # noqa: E731
    return torch.empty_like(q), torch.empty_like(S), like(z), like(log_g), like(y), like(l)


def _query_state_setup(ctx, inputs, output):
    q, S, z, log_g, y, l, rowmax, p, scale, chunk_size, normalize, layout, backend, check_finite = inputs
    ctx.save_for_backward(q, S, z, log_g, y, l, rowmax, output)
    ctx.params = (p, scale, chunk_size, normalize, layout, backend, check_finite)


def _query_state_backward(ctx, do):
    q, S, z, log_g, y, l, rowmax, o = ctx.saved_tensors
    dq, dS, dz, dlog_g, dy, dl = query_state_backward(q, S, z, log_g, y, l, rowmax, o, do.to(q.dtype), *ctx.params)
    keep = lambda g, x: g if x is not None else None  # noqa: E731
    return (dq, dS, keep(dz, z), keep(dlog_g, log_g), keep(dy, y), keep(dl, l), None, None, None, None, None, None,
            None, None)


query_state.register_autograd(_query_state_backward, setup_context=_query_state_setup)


@torch.library.custom_op("expanse::chunk_attention", mutates_args=())
def chunk_attention(q: Tensor, k: Tensor, v: Tensor, log_g: Optional[Tensor], p: int, scale: float, chunk_size: int,
                    backend: str, check_finite: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return _ops._chunk_attention(q, k, v, log_g, p=p, scale=scale or None, chunk_size=chunk_size,
                                 backend=backend or None, check_finite=check_finite)


@chunk_attention.register_fake
def _(q, k, v, log_g, p, scale, chunk_size, backend, check_finite):
    st = _state_dtype(q, None)
    return (q.new_empty((*q.shape[:3], v.shape[3]), dtype=st), q.new_empty(q.shape[:3], dtype=st),
            q.new_empty(q.shape[:3], dtype=st))


@torch.library.custom_op("expanse::chunk_attention_backward", mutates_args=())
def chunk_attention_backward(q: Tensor, k: Tensor, v: Tensor, log_g: Optional[Tensor], rowmax: Tensor, dy: Tensor,
                             dl: Optional[Tensor], p: int, scale: float, chunk_size: int, backend: str,
                             check_finite: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv, dlog_g = _ops.chunk_attention_backward(q, k, v, log_g, rowmax, dy, dl, p=p, scale=scale or None,
                                                       chunk_size=chunk_size, backend=backend or None,
                                                       check_finite=check_finite)
    return dq, dk, dv, dlog_g if dlog_g is not None else _empty(q)


@chunk_attention_backward.register_fake
def _(q, k, v, log_g, rowmax, dy, dl, p, scale, chunk_size, backend, check_finite):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            torch.empty_like(log_g) if log_g is not None else _empty(q))


def _chunk_attention_setup(ctx, inputs, output):
    q, k, v, log_g, p, scale, chunk_size, backend, check_finite = inputs
    ctx.mark_non_differentiable(output[2])  # rowmax: a stabilizer (docs/spec.md)
    ctx.save_for_backward(q, k, v, log_g, output[2])
    ctx.params = (p, scale, chunk_size, backend, check_finite)


def _chunk_attention_backward(ctx, dy, dl, _drowmax):
    q, k, v, log_g, rowmax = ctx.saved_tensors
    dy = dy if dy is not None else torch.zeros_like(rowmax).unsqueeze(-1).expand(*rowmax.shape, v.shape[3])
    dq, dk, dv, dlog_g = chunk_attention_backward(q, k, v, log_g, rowmax, dy, dl, *ctx.params)
    return dq, dk, dv, dlog_g if log_g is not None else None, None, None, None, None, None


chunk_attention.register_autograd(_chunk_attention_backward, setup_context=_chunk_attention_setup)


def call_update_state(k, v, log_g, *, p, chunk_size, layout, backend, check_finite):
    op = "update_state"
    return update_state(k, v, log_g, _params.degree(op, p), _params.chunk_size(op, chunk_size, expected=">= 1"), layout,
                        backend or "", bool(check_finite))


def call_discumsum(X, A, Y_init, *, backend, check_finite):
    return discumsum(X, A, Y_init, backend or "", bool(check_finite))


def call_query_state(q, S, z, log_g, *, intra, p, scale, chunk_size, normalize, layout, backend, check_finite):
    op = "query_state"
    y, l, rowmax = _ops._intra(op, intra)
    return query_state(q, S, z, log_g, y, l, rowmax, _params.degree(op, p), float(_params.scale(op, scale) or 0.0),
                       _params.chunk_size(op, chunk_size, expected=">= 1"), bool(normalize), layout, backend or "",
                       bool(check_finite))


def call_chunk_attention(q, k, v, log_g, *, p, scale, chunk_size, backend, check_finite):
    op = "chunk_attention"
    c = 0 if chunk_size is None else _params.chunk_size(op, chunk_size, expected=">= 0 (0: one chunk)")
    return chunk_attention(q, k, v, log_g, _params.degree(op, p), float(_params.scale(op, scale) or 0.0), c,
                           backend or "", bool(check_finite))

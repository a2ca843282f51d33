"""PyTorch layers over expanse (imports torch).

PowerAttention is the layer a model starts from: query, key and value projections, a scalar gate per
kv head and token, grouped-query heads, expanse.power_attention (differentiable, and traced by
torch.compile without a graph break) and an output projection.

context_parallel_power_attention splits one sequence across the ranks of a torch.distributed
process group (docs/spec.md "Context parallelism"): each rank passes its piece of the tokens, and
the ranks exchange only states.

    >>> import torch, expanse.torch
    >>> layer = expanse.torch.PowerAttention(d_model=256, n_heads=4, head_dim=32)
    >>> x = torch.randn(2, 100, 256)
    >>> y = layer(x)                                       # [2, 100, 256]
    >>> y, state = layer(x, output_final_state=True)       # state: (S, z) to continue the sequence
    >>> y2 = layer(x, initial_state=state)
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import _ops, _params
from . import expanded_dim as _expanded_dim
from ._errors import InvalidArgumentError


class PowerAttention(torch.nn.Module):
    """Gated multi-head power attention (docs/spec.md), with grouped-query heads.

    Args:
        d_model: width of the input and output.
        n_heads: query heads hq.
        n_kv_heads: key/value heads h (hq % h == 0); None: n_heads.
        head_dim: d = e of each head; None: d_model // n_heads.
        p: degree of the power (2 or 4 to normalize; 1 is linear attention).
        gated: a per-token, per-kv-head decay log_g = logsigmoid(x W_g + b_g), its bias initialized so
            that the decay starts near `initial_decay`.
        normalize: divide by the sum of the weights (even p only).
        chunk_size: None: the library's choice; see expanse.power_attention.
        initial_decay: the decay exp(log_g) a gate starts at (on average).
        bias: biases of the q, k, v and output projections.
        backend: expanse backend; None: the tensors' device decides (reference on CPU, cuda on CUDA).
    """

    def __init__(self, d_model, n_heads, n_kv_heads=None, head_dim=None, *, p=2, gated=True, normalize=True,
                 chunk_size=None, initial_decay=0.99, bias=False, backend=None, device=None, dtype=None):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        head_dim = d_model // n_heads if head_dim is None else head_dim
        if n_heads % n_kv_heads != 0:
            raise InvalidArgumentError(f"PowerAttention: n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.p, self.normalize, self.chunk_size, self.backend = p, normalize, chunk_size, backend
        kw = dict(device=device, dtype=dtype)
        self.q_proj = torch.nn.Linear(d_model, n_heads * head_dim, bias=bias, **kw)
        self.k_proj = torch.nn.Linear(d_model, n_kv_heads * head_dim, bias=bias, **kw)
        self.v_proj = torch.nn.Linear(d_model, n_kv_heads * head_dim, bias=bias, **kw)
        self.o_proj = torch.nn.Linear(n_heads * head_dim, d_model, bias=bias, **kw)
        self.g_proj = None
        if gated:
            self.g_proj = torch.nn.Linear(d_model, n_kv_heads, bias=True, **kw)
            with torch.no_grad():  # sigmoid(bias) = initial_decay
                self.g_proj.weight.mul_(0.1)
                self.g_proj.bias.fill_(float(torch.logit(torch.tensor(initial_decay))))

    def forward(self, x, initial_state=None, output_final_state=False):
        """x [b, t, d_model] -> y [b, t, d_model]; with output_final_state, (y, (S, z))."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim)
        log_g = None
        if self.g_proj is not None:  # gates in f32 (f64 for an f64 model), as expanse takes them
            g = self.g_proj(x)
            log_g = F.logsigmoid(g.double() if x.dtype == torch.float64 else g.float())
        r = _ops.power_attention(q, k, v, log_g, p=self.p, chunk_size=self.chunk_size, normalize=self.normalize,
                                 initial_state=initial_state, output_final_state=output_final_state,
                                 backend=self.backend)
        o, state = r if output_final_state else (r, None)
        y = self.o_proj(o.reshape(b, t, self.n_heads * self.head_dim))
        return (y, state) if output_final_state else y


EXCHANGES = ("allgather", "ring")


def _global_rank(group, rank):
    """The global rank of `rank` in `group` (send and recv address global ranks)."""
    return rank if group is None else dist.get_global_rank(group, rank)


def _gather(x, group):
    """x [b, ...] of every rank of `group`, stacked as [b, R, ...]."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.stack(parts, dim=1)


def _enter_by_allgather(own, decay, initial, group):
    """The states entering this rank's piece and leaving the last, from one all-gather of every
    rank's own final state F_r and total log decay A_r (and rank 0's initial state): Y_0 = initial,
    Y_{r+1} = exp(A_r) Y_r + F_r. Tensors [b, h, w]; returns (Y_r, Y_R, every rank's A [b, R, h])."""
    parts = [own, decay[..., None]] + ([initial] if initial is not None else [])
    widths = [x.shape[2] for x in parts]
    gathered = _gather(torch.cat(parts, dim=2), group).split(widths, dim=3)  # each [b, R, h, w]
    F_all, A_all = gathered[0], gathered[1][..., 0].clone()  # A_all is kept for the backward, not the rest
    Y = gathered[2][:, 0].clone() if initial is not None else torch.zeros_like(own)
    entering = None
    for s in range(F_all.shape[1]):
        if s == dist.get_rank(group):
            entering = Y
        Y = torch.exp(A_all[:, s])[..., None] * Y + F_all[:, s]
    return entering, Y, A_all


def _enter_by_ring(own, decay, initial, group, want_final):
    """The same passed along the ranks in order: rank r receives Y_r from rank r - 1 (rank 0 starts
    from `initial`) and sends Y_{r+1} to rank r + 1; the last rank's Y_R is broadcast where wanted."""
    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    if rank == 0:
        Y = initial.clone() if initial is not None else torch.zeros_like(own)
    else:
        Y = torch.empty_like(own)
        dist.recv(Y, src=_global_rank(group, rank - 1), group=group)
    Y_next = torch.exp(decay)[..., None] * Y + own
    if rank + 1 < ranks:
        dist.send(Y_next.contiguous(), dst=_global_rank(group, rank + 1), group=group)
    final = Y_next if rank + 1 == ranks else torch.zeros_like(own)
    if want_final:
        dist.broadcast(final, src=_global_rank(group, ranks - 1), group=group)
    return Y, final


def _leaving_cotangent(L, decay, A_all, dfinal, group, exchange):
    """dF_r, the cotangent of the state leaving this rank's piece, from every rank's cotangent of its
    entering state without it (L_s): dY_R = dfinal (the sequence's final state's), dY_s = L_s +
    exp(A_s) dY_{s+1}, dF_r = dY_{r+1}. "allgather": every rank gathers the L and runs the recursion;
    "ring": rank r receives dY_{r+1} from rank r + 1 and sends dY_r to rank r - 1. Tensors [b, h, w]."""
    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    if exchange == "allgather":
        L_all = _gather(L, group)
        G = dfinal.clone()
        for s in range(ranks - 1, rank, -1):
            G = L_all[:, s] + torch.exp(A_all[:, s])[..., None] * G
        return G
    if rank + 1 == ranks:
        G = dfinal
    else:
        G = torch.empty_like(L)
        dist.recv(G, src=_global_rank(group, rank + 1), group=group)
    if rank > 0:
        dist.send((L + torch.exp(decay)[..., None] * G).contiguous(), dst=_global_rank(group, rank - 1), group=group)
    return G


class _ContextParallelPiece(torch.autograd.Function):
    """One rank's piece of a sequence split across a process group: forward as docs/spec.md
    "Context parallelism" (this piece's own final state, the exchange, the piece from its entering
    state); backward in one power_attention_backward of the piece from its entering state whose
    final-state cotangent arrives during the call (expanse_power_attention_backward_exchange): the
    callback passes the entering states' cotangents between the ranks. Outputs o, then, with
    opts["want_final"], the sequence's final S (and z where normalized)."""

    @staticmethod
    def forward(ctx, q, k, v, log_g, S0, z0, opts):
        group, normalize = opts["group"], opts["normalize"]
        rank = dist.get_rank(group)
        b, h, d, e = k.shape[0], k.shape[2], k.shape[3], v.shape[3]
        De = _expanded_dim(d, p=opts["p"], layout=opts["layout"]) * e
        sd = torch.float64 if q.dtype == torch.float64 else torch.float32  # the states' dtype
        state = lambda: torch.empty((b, h, De // e, e), dtype=sd, device=k.device)  # noqa: E731
        normalizer = lambda: torch.empty((b, h, De // e), dtype=sd, device=k.device) if normalize else None  # noqa: E731
        F_S, F_z, S_e, z_e = state(), normalizer(), state(), normalizer()
        decay = log_g.sum(dim=1).to(sd) if log_g is not None else torch.zeros((b, h), dtype=sd, device=k.device)
        initial = None
        if S0 is not None:  # rank 0's counts; the others pass zeros
            initial = [(S0 if rank == 0 else torch.zeros_like(S0)).to(sd).reshape(b, h, De)]
            if normalize:
                initial.append((z0 if rank == 0 else torch.zeros_like(z0)).to(sd))
            initial = torch.cat(initial, dim=2)
        held = {}

        def exchange(stream):  # F holds this piece's own final state: pass it on, take the entering one
            own = torch.cat([F_S.reshape(b, h, De)] + ([F_z] if normalize else []), dim=2)
            if opts["exchange"] == "allgather":
                entering, held["final"], held["A_all"] = _enter_by_allgather(own, decay, initial, group)
            else:
                entering, held["final"] = _enter_by_ring(own, decay, initial, group, opts["want_final"])
            S_e.copy_(entering[..., :De].reshape(S_e.shape))
            if normalize:
                z_e.copy_(entering[..., De:])

        # One call: the piece's own final state (F), the exchange, the piece from its entering state
        # (rank 0's too, zero without an initial state: every rank's backward reaches the exchange).
        o = _ops._power_attention_exchange(q, k, v, log_g, initial=(S_e, z_e), final=(F_S, F_z), exchange=exchange,
                                           p=opts["p"], scale=opts["scale"], chunk_size=opts["chunk_size"],
                                           normalize=normalize, layout=opts["layout"], backend=opts["backend"])
        ctx.save_for_backward(q, k, v, log_g, o, S_e, z_e, decay, held.get("A_all"), S0, z0)
        ctx.opts, ctx.De = opts, De
        if not opts["want_final"]:
            return o
        final = held["final"]
        S_f = final[..., :De].reshape(S_e.shape).contiguous()
        return (o, S_f, final[..., De:].contiguous()) if normalize else (o, S_f)

    @staticmethod
    def backward(ctx, do, *dfinal_parts):
        q, k, v, log_g, o, S_e, z_e, decay, A_all, S0, z0 = ctx.saved_tensors
        opts, group, De = ctx.opts, ctx.opts["group"], ctx.De
        rank, normalize = dist.get_rank(group), opts["normalize"]
        b, h = S_e.shape[0], S_e.shape[1]
        # The sequence's final state's cotangent: every rank returns that state, so its cotangent is
        # the sum of the ranks' (each loss may take it from any rank).
        dfinal = torch.zeros((b, h, De + (z_e.shape[2] if normalize else 0)), dtype=S_e.dtype, device=S_e.device)
        if opts["want_final"]:
            for part, (lo, hi) in zip(dfinal_parts, [(0, De), (De, dfinal.shape[2])]):
                if part is not None:
                    dfinal[..., lo:hi] = part.reshape(b, h, hi - lo).to(dfinal.dtype)
            dist.all_reduce(dfinal, group=group)
        L_S, dF_S = torch.empty_like(S_e), torch.empty_like(S_e)
        L_z, dF_z = (torch.empty_like(z_e), torch.empty_like(z_e)) if normalize else (None, None)

        def exchange(stream):  # L holds this piece's entering-state cotangent without dF: pass it on
            L = torch.cat([L_S.reshape(b, h, De)] + ([L_z] if normalize else []), dim=2)
            G = _leaving_cotangent(L, decay, A_all, dfinal, group, opts["exchange"])
            dF_S.copy_(G[..., :De].reshape(dF_S.shape))
            if normalize:
                dF_z.copy_(G[..., De:])

        dq, dk, dv, dlog_g = _ops._power_attention_backward_exchange(
            q, k, v, log_g, o, do.contiguous(), initial_state=(S_e, z_e), dinitial=(L_S, L_z), dfinal=(dF_S, dF_z),
            exchange=exchange, p=opts["p"], scale=opts["scale"], chunk_size=opts["chunk_size"], normalize=normalize,
            layout=opts["layout"], backend=opts["backend"])
        # L now holds the whole cotangent of this piece's entering state: rank 0's is the initial state's.
        dS0 = dz0 = None
        if S0 is not None:
            dS0 = L_S.to(S0.dtype) if rank == 0 else torch.zeros_like(S0)
            if z0 is not None:
                dz0 = L_z.to(z0.dtype) if rank == 0 else torch.zeros_like(z0)
        return dq, dk, dv, dlog_g, dS0, dz0, None


def context_parallel_power_attention(q, k, v, log_g=None, *, group=None, p=2, scale=None, chunk_size=None,
                                     normalize=True, initial_state=None, output_final_state=False, layout="sympow",
                                     backend=None, exchange="allgather"):
    """expanse.power_attention of one sequence split across the ranks of a torch.distributed group.

    Rank r passes tokens [t_r, t_{r+1}) of the sequence (ranks in order, any lengths >= 1, the same
    b, heads and options on every rank) and gets their outputs, equal to those of one
    expanse.power_attention call over the whole sequence; gradients flow as they would there
    (differentiable, eager mode). What the ranks exchange is states, not tokens (docs/spec.md
    "Context parallelism"): each rank's final state from zero and total log decay (D*e + D + 1 values
    per batch entry and kv head), from which the state entering each piece is their decayed prefix
    sum; each rank runs its piece from it.

    Args:
        q, k, v, log_g: this rank's piece, shaped as for expanse.power_attention.
        group: the process group (None: the default group), NCCL for CUDA tensors, gloo on the CPU.
        initial_state: the sequence's initial state (S, z), on every rank or on none; rank 0's is
            used (its gradient goes there), the others' only tell that there is one.
        output_final_state: also return the sequence's final state (S, z), on every rank; a loss
            should take it from one rank (its gradient reaches every rank through the exchange).
            Every rank must run the backward (each takes part in the exchange's).
        exchange: "allgather" (one collective each way; every rank combines all the states before
            it) or "ring" (rank r waits for rank r - 1's entering state and passes its own on: R - 1
            dependent steps each way, each rank receiving one state).
        p, scale, chunk_size, normalize, layout, backend: as for expanse.power_attention.

    Forward and backward are one call each per rank, during which the ranks pass on states
    (expanse_power_attention_exchange: the piece's own final state out, its entering state in) and
    their cotangents (expanse_power_attention_backward_exchange).

    Returns:
        o for this rank's tokens; with output_final_state, (o, (S, z)) (z None unless normalize).

        >>> # on each of R ranks, after dist.init_process_group(...):
        >>> o = expanse.torch.context_parallel_power_attention(q_piece, k_piece, v_piece, log_g_piece)
    """
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError("context_parallel_power_attention: torch.distributed is not initialized "
                                   "(call dist.init_process_group first)")
    if exchange not in EXCHANGES:
        raise InvalidArgumentError(f"context_parallel_power_attention: argument 'exchange' must be one of "
                                   f"{', '.join(EXCHANGES)}, got {exchange!r}")
    S0, z0 = initial_state if initial_state is not None else (None, None)
    opts = {"group": group, "p": p, "scale": scale, "chunk_size": chunk_size, "normalize": bool(normalize),
            "layout": layout, "backend": backend, "exchange": exchange, "want_final": bool(output_final_state)}
    r = _ContextParallelPiece.apply(q, k, v, log_g, S0, z0 if normalize else None, opts)
    if not output_final_state:
        return r
    return r[0], (r[1], r[2] if normalize else None)

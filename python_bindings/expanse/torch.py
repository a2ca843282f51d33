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


# A piece's own final state is summed by update_state chunks, each of which keeps a D x e state (f32)
# until the backward: 35 GB at P1 for 1M tokens in chunks of 128. Bounding their number bounds that
# memory; the sum does not depend on the chunking beyond rounding.
_MAX_STATE_CHUNKS = 256


def _state_chunk(t, chunk_size):
    """The chunk size of a piece of t tokens' state: chunk_size (128 for None or 0), doubled until
    the piece has at most _MAX_STATE_CHUNKS chunks."""
    c = chunk_size if chunk_size is not None and chunk_size > 0 else _params.DEFAULT_CHUNK
    while -(-t // c) > _MAX_STATE_CHUNKS:
        c *= 2
    return c


class _GatherRanks(torch.autograd.Function):
    """x [b, ...] of every rank of `group`, stacked as [b, R, ...]. Every rank's loss may depend on
    every slot, so the gradient of this rank's x is the sum over the ranks of their gradients of its
    slot (an all-reduce, then this rank's slot)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[:, dist.get_rank(ctx.group)], None


class _RingPass(torch.autograd.Function):
    """The states entering and leaving this rank's piece, passed along the ranks in order: rank r
    receives Y_r from rank r - 1 (rank 0 starts from `initial`), sends Y_{r+1} = exp(A_r) Y_r + F_r to
    rank r + 1, and with `want_final` the last rank's Y_R is broadcast. The backward runs the other
    way: rank r receives the cotangent of Y_{r+1} from rank r + 1 (the last rank: the final state's,
    summed over the ranks) and sends that of Y_r to rank r - 1. Every tensor is [b, h, w]."""

    @staticmethod
    def forward(ctx, F_r, A_r, initial, group, want_final):
        rank, ranks = dist.get_rank(group), dist.get_world_size(group)
        if rank == 0:
            Y = initial.clone() if initial is not None else torch.zeros_like(F_r)
        else:
            Y = torch.empty_like(F_r)
            dist.recv(Y, src=_global_rank(group, rank - 1), group=group)
        decay = torch.exp(A_r)[..., None]
        Y_next = decay * Y + F_r
        if rank + 1 < ranks:
            dist.send(Y_next.contiguous(), dst=_global_rank(group, rank + 1), group=group)
        final = Y_next if rank + 1 == ranks else torch.zeros_like(F_r)
        if want_final:
            dist.broadcast(final, src=_global_rank(group, ranks - 1), group=group)
        ctx.save_for_backward(Y, decay)
        ctx.group, ctx.want_final, ctx.has_initial = group, want_final, initial is not None
        return Y, final

    @staticmethod
    def backward(ctx, dY, dfinal):
        Y, decay = ctx.saved_tensors
        group = ctx.group
        rank, ranks = dist.get_rank(group), dist.get_world_size(group)
        if ctx.want_final:  # every rank's share of the final state's cotangent
            dfinal = dfinal.contiguous()
            dist.all_reduce(dfinal, group=group)
        if rank + 1 == ranks:
            dY_next = dfinal if ctx.want_final else torch.zeros_like(Y)
        else:
            dY_next = torch.empty_like(Y)
            dist.recv(dY_next, src=_global_rank(group, rank + 1), group=group)
        dA = decay[..., 0] * (Y * dY_next).sum(dim=-1)
        dY_total = dY + decay * dY_next
        if rank > 0:
            dist.send(dY_total.contiguous(), dst=_global_rank(group, rank - 1), group=group)
        d_initial = dY_total if rank == 0 and ctx.has_initial else None
        return dY_next, dA, d_initial, None, None


def _global_rank(group, rank):
    """The global rank of `rank` in `group` (send and recv address global ranks)."""
    return rank if group is None else dist.get_global_rank(group, rank)


def _allgather_prefix(F_r, A_r, initial, group, backend):
    """The states entering and leaving this rank's piece from one all-gather of every rank's F_r,
    A_r (and rank 0's initial state): Y_0 = initial, Y_{r+1} = exp(A_r) Y_r + F_r, by discumsum over
    the ranks. Every tensor is [b, h, w]; returns (Y_r, Y_R)."""
    parts = [F_r, A_r[..., None]] + ([initial] if initial is not None else [])
    widths = [x.shape[2] for x in parts]
    gathered = _GatherRanks.apply(torch.cat(parts, dim=2), group).split(widths, dim=3)  # each [b, R, h, w]
    F, A = gathered[0], gathered[1][..., 0]
    Y = _ops.discumsum(F, A, gathered[2][:, 0] if initial is not None else None, backend=backend)
    return Y[:, dist.get_rank(group)], Y[:, Y.shape[1] - 1]


EXCHANGES = ("allgather", "ring")


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
        p, scale, chunk_size, normalize, layout, backend: as for expanse.power_attention. The
            piece's own state is summed by chunks of chunk_size tokens (128 for None or 0), doubled
            until the piece has at most 256 of them (one D x e state each is kept for the backward).

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
    rank = dist.get_rank(group)
    b, t, h = k.shape[0], k.shape[1], k.shape[2]
    c = _state_chunk(t, chunk_size)
    # 1. This piece's final state from zero, F_r: its chunk states summed over the chunks with their
    # decays; and its total log decay A_r. Packed as [b, h, D e (+ D)] for the exchange.
    X, Xz = _ops.update_state(k, v, log_g, p=p, chunk_size=c, layout=layout, backend=backend)
    n, D, e = X.shape[1], X.shape[3], X.shape[4]
    if log_g is None:
        chunk_decay, piece_decay = X.new_zeros((b, n, h)), X.new_zeros((b, h))
    else:
        padded = F.pad(log_g, (0, 0, 0, n * c - t))  # zeros past the last token: no decay
        chunk_decay, piece_decay = padded.view(b, n, c, h).sum(dim=2), log_g.sum(dim=1).to(X.dtype)
    own = [_ops.discumsum(X, chunk_decay, backend=backend)[:, n].reshape(b, h, D * e)]
    if normalize:
        own.append(_ops.discumsum(Xz, chunk_decay, backend=backend)[:, n])
    own = torch.cat(own, dim=2)
    initial = None
    if initial_state is not None:  # rank 0's counts; the others pass zeros
        S0, z0 = initial_state
        initial = [(S0 if rank == 0 else torch.zeros_like(S0)).to(X.dtype).reshape(b, h, D * e)]
        if normalize:
            initial.append((z0 if rank == 0 else torch.zeros_like(z0)).to(X.dtype))
        initial = torch.cat(initial, dim=2)
    # 2. The exchange: the states entering this piece and leaving the last, Y_0 the initial state and
    # Y_{r+1} = exp(A_r) Y_r + F_r.
    if exchange == "allgather":
        entering, final = _allgather_prefix(own, piece_decay, initial, group, backend)
    else:
        entering, final = _RingPass.apply(own, piece_decay, initial, group, output_final_state)

    def unpack(Y):  # [b, h, D e (+ D)] -> (S, z), contiguous as power_attention's own states are
        return Y[..., :D * e].reshape(b, h, D, e).contiguous(), (Y[..., D * e:].contiguous() if normalize else None)

    # 3. This piece from its entering state (rank 0's too, zero without an initial state: every rank's
    # backward then reaches the exchange once).
    o = _ops.power_attention(q, k, v, log_g, p=p, scale=scale, chunk_size=chunk_size, normalize=normalize,
                             initial_state=unpack(entering), layout=layout, backend=backend)
    return (o, unpack(final)) if output_final_state else o

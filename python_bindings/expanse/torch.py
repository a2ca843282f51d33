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


def context_parallel_power_attention(q, k, v, log_g=None, *, group=None, p=2, scale=None, chunk_size=None,
                                     normalize=True, initial_state=None, output_final_state=False, layout="sympow",
                                     backend=None):
    """expanse.power_attention of one sequence split across the ranks of a torch.distributed group.

    Rank r passes tokens [t_r, t_{r+1}) of the sequence (ranks in order, any lengths >= 1, the same
    b, heads and options on every rank) and gets their outputs, equal to those of one
    expanse.power_attention call over the whole sequence; gradients flow as they would there
    (differentiable, eager mode). What the ranks exchange is states, not tokens (docs/spec.md
    "Context parallelism"): each rank's final state from zero and total log decay (D*e + D + 1 values
    per batch entry and kv head) are all-gathered, the state entering each piece is their decayed
    prefix sum (expanse.discumsum over the ranks), and each rank runs its piece from it.

    Args:
        q, k, v, log_g: this rank's piece, shaped as for expanse.power_attention.
        group: the process group (None: the default group), NCCL for CUDA tensors, gloo on the CPU.
        initial_state: the sequence's initial state (S, z), on every rank or on none; rank 0's is
            used (its gradient goes there), the others' only tell that there is one.
        output_final_state: also return the sequence's final state (S, z), on every rank; a loss
            should take it from one rank (its gradient reaches every rank through the exchange).
            Every rank must run the backward (each takes part in the exchange's).
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
    rank = dist.get_rank(group)
    b, t, h = k.shape[0], k.shape[1], k.shape[2]
    c = _state_chunk(t, chunk_size)
    # 1. This piece's final state from zero: its chunk states summed over the chunks with their decays;
    # and its total log decay.
    X, Xz = _ops.update_state(k, v, log_g, p=p, chunk_size=c, layout=layout, backend=backend)
    n, D, e = X.shape[1], X.shape[3], X.shape[4]
    if log_g is None:
        chunk_decay, piece_decay = X.new_zeros((b, n, h)), X.new_zeros((b, h))
    else:
        padded = F.pad(log_g, (0, 0, 0, n * c - t))  # zeros past the last token: no decay
        chunk_decay, piece_decay = padded.view(b, n, c, h).sum(dim=2), log_g.sum(dim=1).to(X.dtype)
    parts = [_ops.discumsum(X, chunk_decay, backend=backend)[:, n].reshape(b, h, D * e)]
    if normalize:
        parts.append(_ops.discumsum(Xz, chunk_decay, backend=backend)[:, n])
    parts.append(piece_decay[..., None])
    if initial_state is not None:  # rank 0's counts; the others send zeros
        S0, z0 = initial_state
        parts.append((S0 if rank == 0 else torch.zeros_like(S0)).to(X.dtype).reshape(b, h, D * e))
        if normalize:
            parts.append((z0 if rank == 0 else torch.zeros_like(z0)).to(X.dtype))
    # 2. One exchange of everything (one collective each way, in the same order on every rank).
    widths = [x.shape[2] for x in parts]
    gathered = _GatherRanks.apply(torch.cat(parts, dim=2), group).split(widths, dim=3)  # each [b, R, h, w]
    F_S = gathered[0].reshape(b, -1, h, D, e)
    F_z = gathered[1] if normalize else None
    A = gathered[2 if normalize else 1][..., 0]
    S0 = z0 = None
    if initial_state is not None:
        S0 = gathered[-2 if normalize else -1][:, 0].reshape(b, h, D, e)
        z0 = gathered[-1][:, 0] if normalize else None
    # 3. The states entering the pieces: Y_0 the initial state, Y_{r+1} = exp(A_r) Y_r + F_r.
    Y_S = _ops.discumsum(F_S, A, S0, backend=backend)
    Y_z = _ops.discumsum(F_z, A, z0, backend=backend) if normalize else None
    # 4. This piece from its entering state (rank 0's too, zero without an initial state: every rank's
    # backward then reaches the exchange once).
    entering = (Y_S[:, rank], Y_z[:, rank] if normalize else None)
    o = _ops.power_attention(q, k, v, log_g, p=p, scale=scale, chunk_size=chunk_size, normalize=normalize,
                             initial_state=entering, layout=layout, backend=backend)
    if output_final_state:
        R = Y_S.shape[1] - 1
        return o, (Y_S[:, R], Y_z[:, R] if normalize else None)
    return o

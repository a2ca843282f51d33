"""PyTorch layers over expanse (imports torch).

PowerAttention is the layer a model starts from: query, key and value projections, a scalar gate per
kv head and token, grouped-query heads, expanse.power_attention (differentiable, and traced by
torch.compile without a graph break) and an output projection.

    >>> import torch, expanse.torch
    >>> layer = expanse.torch.PowerAttention(d_model=256, n_heads=4, head_dim=32)
    >>> x = torch.randn(2, 100, 256)
    >>> y = layer(x)                                       # [2, 100, 256]
    >>> y, state = layer(x, output_final_state=True)       # state: (S, z) to continue the sequence
    >>> y2 = layer(x, initial_state=state)
"""

import torch
import torch.nn.functional as F

from . import _ops
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

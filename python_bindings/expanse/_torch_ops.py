"""PyTorch operators for expanse's differentiable operations (imported on the first call with torch
tensors, so that `import expanse` does not import torch).

expanse::power_attention and expanse::power_attention_backward are torch.library custom operators:
with fake (meta) implementations, so torch.compile traces a model that calls expanse.power_attention
into one graph, and with the backward registered as the forward's autograd formula. Each runs the
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

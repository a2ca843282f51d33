"""expanse: power attention and gated chunked linear attention, over the expanse C++ library.

The functions mirror the library's operations (docs/spec.md) with the argument names of FLA and
retention. Token tensors are sequence-major: q [b, t, hq, d], k [b, t, h, d], v [b, t, h, e],
log_g [b, t, h]; states S [b, h, D, e] and z [b, h, D], where D is the expanded dimension of the
symmetric power feature map phi (C(d+p-1, p) in the default 'sympow' layout).

Arrays are numpy arrays or DLPack tensors (PyTorch, CuPy, JAX), used in place without copies, with
any non-negative strides; CUDA tensors stay on their device and run on the framework's current
stream. Results come back in the framework of the first array argument. Inputs are float16,
bfloat16 or float32 (float64 on the reference backend); states are float32 for float16, bfloat16 and
float32 inputs and float64 for float64 inputs, on every backend. With torch tensors power_attention
and the core operations (update_state, discumsum, query_state, chunk_attention) are differentiable;
the *_backward functions give the same gradients to any array. sympow_expand and power_attention_step
have no backward and refuse torch tensors that require grad while gradients are enabled (pass
x.detach()).

    >>> import numpy as np, expanse
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((2, 256, 4, 32), dtype=np.float32) for _ in range(3))
    >>> o = expanse.power_attention(q, k, v, p=2)                     # o: [2, 256, 4, 32] float32; form chosen by t
    >>> o, (S, z) = expanse.power_attention(q, k, v, chunk_size=64, output_final_state=True)
    >>> [b.name for b in expanse.backends() if b.available]
    ['reference']
    >>> expanse.check("power_attention", backend="reference", t=100, chunk_size=32).passed
    True

Operations: power_attention, power_attention_backward, power_attention_step, sympow_expand,
update_state, discumsum, query_state, chunk_attention and their *_backward gradients; sequence_state
(a sequence's state from zero, for context parallelism); expanse.torch.PowerAttention (a layer) and
expanse.torch.context_parallel_power_attention. Backends: backends(), devices(), set_default_backend(). Validation
against the reference (and of the reference against a naive oracle): check().

Non-finite inputs (NaN, or an infinity other than -inf in log_g, which is a reset) give non-finite
outputs and no error, unless the finite check is on: check_finite=True on a call, or
set_check_finite(True) for the process; then the call raises expanse.InvalidArgumentError naming the
first non-finite input and the index of the element.

Errors: TypeError for arguments that are not arrays (or of an unsupported dtype) and for scalars of
the wrong type; ValueError (expanse.InvalidArgumentError) for every bad value: shapes, dtypes,
devices, p, layout, chunk_size, scale, out-of-range integers; NotImplementedError
(expanse.UnsupportedError, also a RuntimeError) when the backend does not implement a problem or a
torch input requires grad; RuntimeError (expanse.BackendError) for a missing or unavailable backend.
The messages name the operation and the offending argument.
"""

from . import _expanse
from ._errors import (BackendError, ExpanseError, InternalError, InvalidArgumentError, OutOfMemoryError,
                      UnsupportedError, WorkspaceError)
from ._backends import (BackendInfo, DeviceInfo, available_backends, backends, devices, get_default_backend,
                        set_default_backend)
from ._ops import (chunk_attention, chunk_attention_backward, discumsum, discumsum_backward, power_attention,
                   power_attention_backward, power_attention_step, query_state, query_state_backward, sequence_state,
                   sympow_expand, update_state, update_state_backward)
from ._check import CheckResult, TOLERANCES, check
from ._finite import get_check_finite, set_check_finite

__version__ = _expanse.version()


def expanded_dim(d: int, p: int = 2, layout: str = "sympow") -> int:
    """The expanded dimension D of phi for head dim d, degree p and a layout ('sympow':
    C(d+p-1, p), 'tensor': d^p, 'tiled:N': C(d/N+p-1, p) N^p).

    >>> expanse.expanded_dim(64, p=2)
    2080
    """
    from . import _params
    op = "expanded_dim"
    p = _params.integer(op, "p", p, bounds=_params.INT32, expected=">= 1")
    d = _params.integer(op, "d", d, expected=">= 1")
    lay = _params.layout(op, layout)
    return _expanse.expanded_dim(p, d, lay[0], lay[1])


__all__ = [
    "power_attention", "power_attention_backward", "power_attention_step", "sympow_expand", "update_state",
    "discumsum", "query_state", "chunk_attention", "update_state_backward", "discumsum_backward",
    "query_state_backward", "chunk_attention_backward", "sequence_state", "expanded_dim",
    "backends", "available_backends", "devices", "set_default_backend", "get_default_backend",
    "set_check_finite", "get_check_finite",
    "BackendInfo", "DeviceInfo",
    "check", "CheckResult", "TOLERANCES",
    "ExpanseError", "InvalidArgumentError", "UnsupportedError", "BackendError", "OutOfMemoryError",
    "WorkspaceError", "InternalError",
    "__version__",
]

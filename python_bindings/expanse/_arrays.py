"""Arrays of any framework: what expanse reads from them, and how results are made in the caller's
framework.

Inputs are never copied: numpy arrays and DLPack producers (PyTorch, CuPy, JAX, ...) are handed to
the C library as views of their own memory, with their strides. Outputs are allocated by the
framework of the call's first array (its "anchor"), on the anchor's device: numpy arrays for numpy
input, torch tensors for torch input (on the tensor's device, with PyTorch's caching allocator),
CuPy arrays for CuPy input. For other producers, results are numpy arrays on the CPU and
DLPack-capable arrays owned by expanse on a GPU (convert them with e.g. ``jax.numpy.from_dlpack``).
GPU work runs on the framework's current stream (PyTorch, CuPy), else on the default stream.
"""

import sys

import numpy as np

from . import _expanse
from ._errors import InvalidArgumentError, UnsupportedError

# DLPack device codes, which the C ABI uses too (expanse_device_type).
CPU, CUDA, ROCM = 1, 2, 10
DEVICE_NAMES = {CPU: "cpu", CUDA: "cuda", ROCM: "rocm"}

_NUMPY_DTYPES = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "u8": np.uint8}
_FROM_NUMPY = {np.dtype(np.float16): "f16", np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def _type_error(op, name, x):
    return TypeError(
        f"{op}: argument '{name}' must be an array (numpy.ndarray, or a DLPack tensor such as "
        f"torch.Tensor, cupy.ndarray or jax.Array), got {type(x).__module__}.{type(x).__qualname__}"
    )


def _dtype_error(op, name, dtype):
    return TypeError(
        f"{op}: argument '{name}' has dtype {dtype}; expanse takes float16, bfloat16, float32 or "
        "float64 arrays (bfloat16 through PyTorch or another DLPack producer: numpy has none)"
    )


class _Numpy:
    name = "numpy"

    @staticmethod
    def matches(x):
        return isinstance(x, np.ndarray)

    @staticmethod
    def prepare(op, name, x):
        if x.dtype not in _FROM_NUMPY:
            if x.dtype.kind == "f" and not x.dtype.isnative:
                raise TypeError(
                    f"{op}: argument '{name}' has non-native byte order ({x.dtype.str}); "
                    "use x.astype(x.dtype.newbyteorder('='))"
                )
            raise _dtype_error(op, name, x.dtype)
        return x

    @staticmethod
    def dtype(x):
        return _FROM_NUMPY[x.dtype]

    @staticmethod
    def shape(x):
        return x.shape

    @staticmethod
    def device(x):
        return CPU, 0

    @staticmethod
    def stream(x):
        return 0

    @staticmethod
    def empty(shape, dtype, like, backend, device):
        if dtype in _NUMPY_DTYPES:
            return np.empty(shape, dtype=_NUMPY_DTYPES[dtype])
        return _expanse.alloc(backend, device, list(shape), dtype)


class _Torch:
    name = "torch"

    @staticmethod
    def matches(x):
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(x, torch.Tensor)

    @staticmethod
    def _dtypes():
        torch = sys.modules["torch"]
        return {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64"}

    @staticmethod
    def prepare(op, name, x):
        if x.dtype not in _Torch._dtypes():
            raise _dtype_error(op, name, x.dtype)
        if x.device.type not in ("cpu", "cuda"):
            raise InvalidArgumentError(f"{op}: argument '{name}' is on device '{x.device}', for which expanse "
                                       "has no backend")
        if not x.requires_grad:
            return x
        torch = sys.modules["torch"]
        # An operation without a backward (sympow_expand, power_attention_step) records no autograd
        # graph, so its result would silently carry no gradient. (The differentiable ones reach here
        # inside their autograd-registered operators, where gradients are off.) Under torch.no_grad()
        # no graph is wanted.
        if torch.is_grad_enabled():
            raise UnsupportedError(f"{op}: argument '{name}' requires grad, but {op} has no backward pass; "
                                   f"pass {name}.detach() to run without gradients")
        return x.detach()  # a view of the same memory; DLPack refuses tensors that require grad

    @staticmethod
    def dtype(x):
        return _Torch._dtypes()[x.dtype]

    @staticmethod
    def shape(x):
        return tuple(x.shape)

    @staticmethod
    def device(x):
        if x.device.type == "cpu":
            return CPU, 0
        torch = sys.modules["torch"]
        return (ROCM if torch.version.hip else CUDA), x.device.index if x.device.index is not None else 0

    @staticmethod
    def stream(x):
        if x.device.type != "cuda":
            return 0
        torch = sys.modules["torch"]
        return torch.cuda.current_stream(x.device).cuda_stream

    @staticmethod
    def empty(shape, dtype, like, backend, device):
        torch = sys.modules["torch"]
        types = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
                 "u8": torch.uint8}
        return torch.empty(tuple(shape), dtype=types[dtype], device=like.device)


class _Cupy:
    name = "cupy"

    @staticmethod
    def matches(x):
        cupy = sys.modules.get("cupy")
        return cupy is not None and isinstance(x, cupy.ndarray)

    @staticmethod
    def prepare(op, name, x):
        if np.dtype(x.dtype) not in _FROM_NUMPY:
            raise _dtype_error(op, name, x.dtype)
        return x

    @staticmethod
    def dtype(x):
        return _FROM_NUMPY[np.dtype(x.dtype)]

    @staticmethod
    def shape(x):
        return tuple(x.shape)

    @staticmethod
    def device(x):
        cupy = sys.modules["cupy"]
        return (ROCM if cupy.cuda.runtime.is_hip else CUDA), x.device.id

    @staticmethod
    def stream(x):
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(x.device.id):
            return cupy.cuda.get_current_stream().ptr

    @staticmethod
    def empty(shape, dtype, like, backend, device):
        cupy = sys.modules["cupy"]
        if dtype not in _NUMPY_DTYPES:
            return _expanse.alloc(backend, device, list(shape), dtype)
        with cupy.cuda.Device(like.device.id):
            return cupy.empty(tuple(shape), dtype=_NUMPY_DTYPES[dtype])


class _DLPack:
    """Any other producer of __dlpack__ (JAX, expanse's own arrays, ...), read through the extension."""

    name = "dlpack"

    @staticmethod
    def matches(x):
        return hasattr(x, "__dlpack__")

    @staticmethod
    def prepare(op, name, x):
        try:
            info = _expanse.describe(x)
        except TypeError:
            raise _type_error(op, name, x) from None
        if not info["supported"]:
            raise _dtype_error(op, name, info["dtype"])
        return x

    @staticmethod
    def dtype(x):
        return _expanse.describe(x)["dtype"]

    @staticmethod
    def shape(x):
        return tuple(_expanse.describe(x)["shape"])

    @staticmethod
    def device(x):
        info = _expanse.describe(x)
        return info["device_type"], (info["device_id"] if info["device_type"] != CPU else 0)

    @staticmethod
    def stream(x):
        return 0

    @staticmethod
    def empty(shape, dtype, like, backend, device):
        if _DLPack.device(like)[0] == CPU and dtype in _NUMPY_DTYPES:
            return np.empty(shape, dtype=_NUMPY_DTYPES[dtype])
        return _expanse.alloc(backend, device, list(shape), dtype)


_FRAMEWORKS = (_Numpy, _Torch, _Cupy, _DLPack)


def is_torch(x):
    """Whether x is a torch tensor (without importing torch)."""
    return _Torch.matches(x)


def framework_of(x):
    """The adapter of an array that prepare() accepted."""
    for fw in _FRAMEWORKS:
        if fw.matches(x):
            return fw
    raise AssertionError("framework_of() called on a non-array")


def prepare(op, name, x):
    """Checks that x is an array of a dtype expanse takes and returns what to hand to the extension
    (the same memory). Raises TypeError otherwise; never copies."""
    for fw in _FRAMEWORKS:
        if fw.matches(x):
            return fw.prepare(op, name, x)
    raise _type_error(op, name, x)

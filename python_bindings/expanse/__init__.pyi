# Type stubs of the public API of expanse (the docstrings of expanse/_ops.py describe each function).
# Arrays are numpy.ndarray or any DLPack tensor (torch.Tensor, cupy.ndarray, jax.Array, ...); results
# take the framework of the first array argument. States are float32 for float16, bfloat16 and float32
# inputs, float64 for float64 inputs.
#
# power_attention's chunk_size: None (the default) lets the library choose the form and the chunk size
# by sequence length and backend; -1 is the same as None; 0 is the quadratic form; c >= 1 the chunked
# algorithm. check_finite: None follows set_check_finite() (off by default); without the check,
# non-finite inputs give non-finite outputs and no error.
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional, Protocol, Tuple, Union, overload

import numpy as np

class _DLPackArray(Protocol):
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

Array = Union[np.ndarray, _DLPackArray]
State = Union[Tuple[Array, Optional[Array]], Array]

__version__: str
TOLERANCES: Dict[str, float]

@overload
def power_attention(q: Array, k: Array, v: Array, log_g: Optional[Array] = None, *, p: int = 2,
                    scale: Optional[float] = None, chunk_size: Optional[int] = None, normalize: bool = True,
                    initial_state: Optional[State] = None, output_final_state: Literal[False] = False,
                    layout: str = "sympow", backend: Optional[str] = None,
                    check_finite: Optional[bool] = None) -> Any: ...
@overload
def power_attention(q: Array, k: Array, v: Array, log_g: Optional[Array] = None, *, p: int = 2,
                    scale: Optional[float] = None, chunk_size: Optional[int] = None, normalize: bool = True,
                    initial_state: Optional[State] = None, output_final_state: Literal[True] = True,
                    layout: str = "sympow", backend: Optional[str] = None,
                    check_finite: Optional[bool] = None) -> Tuple[Any, Tuple[Any, Optional[Any]]]: ...
def power_attention(q: Array, k: Array, v: Array, log_g: Optional[Array] = None, *, p: int = 2,
                    scale: Optional[float] = None, chunk_size: Optional[int] = None, normalize: bool = True,
                    initial_state: Optional[State] = None, output_final_state: bool = False,
                    layout: str = "sympow", backend: Optional[str] = None,
                    check_finite: Optional[bool] = None) -> Any:
    """o [b, t, hq, e], or (o, (S [b, h, D, e], z [b, h, D] | None)) with output_final_state=True.
    chunk_size None or -1: chosen by the library; 0: quadratic; c >= 1: chunked."""

def power_attention_backward(q: Array, k: Array, v: Array, log_g: Optional[Array], do: Array, *, p: int = 2,
                             scale: Optional[float] = None, chunk_size: Optional[int] = None, normalize: bool = True,
                             initial_state: Optional[State] = None, dfinal_state: Optional[State] = None,
                             o: Optional[Array] = None, layout: str = "sympow", backend: Optional[str] = None,
                             check_finite: Optional[bool] = None) -> Tuple[Any, ...]:
    """(dq, dk, dv, dlog_g | None), and (dS0, dz0 | None) as a fifth item with initial_state."""

def update_state_backward(k: Array, v: Array, log_g: Optional[Array], dS: Array, dz: Optional[Array] = None, *,
                          p: int = 2, chunk_size: int = 128, layout: str = "sympow", backend: Optional[str] = None,
                          check_finite: Optional[bool] = None) -> Tuple[Any, Any, Optional[Any]]:
    """(dk, dv, dlog_g | None)."""

def discumsum_backward(X: Array, A: Array, dY: Array, Y_init: Optional[Array] = None, *,
                       backend: Optional[str] = None,
                       check_finite: Optional[bool] = None) -> Tuple[Any, Any, Optional[Any]]:
    """(dX, dA, dY_init | None)."""

def query_state_backward(q: Array, S: Array, z: Optional[Array], log_g: Optional[Array], do: Array, *,
                         intra: Optional[Tuple[Array, Array, Array]] = None, o: Optional[Array] = None, p: int = 2,
                         scale: Optional[float] = None, chunk_size: int = 128, normalize: bool = True,
                         layout: str = "sympow", backend: Optional[str] = None,
                         check_finite: Optional[bool] = None) -> Tuple[Any, ...]:
    """(dq, dS, dz | None, dlog_g | None, (dy, dl) | None)."""

def chunk_attention_backward(q: Array, k: Array, v: Array, log_g: Optional[Array], rowmax: Array, dy: Array,
                             dl: Optional[Array] = None, *, p: int = 2, scale: Optional[float] = None,
                             chunk_size: Optional[int] = 128, backend: Optional[str] = None,
                             check_finite: Optional[bool] = None) -> Tuple[Any, Any, Any, Optional[Any]]:
    """(dq, dk, dv, dlog_g | None), rowmax held at the forward's value."""

def power_attention_step(q: Array, k: Array, v: Array, log_g: Optional[Array] = None, *, state: State,
                         p: int = 2, scale: Optional[float] = None, normalize: bool = True, layout: str = "sympow",
                         backend: Optional[str] = None, check_finite: Optional[bool] = None) -> Any:
    """o [b, hq, e] (or [b, 1, hq, e]); the state (S, z) is updated in place."""

def sympow_expand(x: Array, *, p: int = 2, layout: str = "sympow", backend: Optional[str] = None,
                  check_finite: Optional[bool] = None) -> Any:
    """phi(x) [..., D] in x's dtype."""

def update_state(k: Array, v: Array, log_g: Optional[Array] = None, *, p: int = 2, chunk_size: int = 128,
                 layout: str = "sympow", backend: Optional[str] = None,
                 check_finite: Optional[bool] = None) -> Tuple[Any, Any]:
    """(S [b, n, h, D, e], z [b, n, h, D])."""

def sequence_state(k: Array, v: Array, log_g: Optional[Array] = None, *, p: int = 2, chunk_size: int = 128,
                   layout: str = "sympow", backend: Optional[str] = None,
                   check_finite: Optional[bool] = None) -> Tuple[Any, Any, Any]:
    """(S [b, h, D, e], z [b, h, D], A [b, h])."""

def discumsum(X: Array, A: Array, Y_init: Optional[Array] = None, *, backend: Optional[str] = None,
              check_finite: Optional[bool] = None) -> Any:
    """Y [b, n+1, h, ...]."""

def query_state(q: Array, S: Array, z: Optional[Array] = None, log_g: Optional[Array] = None, *,
                intra: Optional[Tuple[Array, Array, Array]] = None, p: int = 2, scale: Optional[float] = None,
                chunk_size: int = 128, normalize: bool = True, layout: str = "sympow",
                backend: Optional[str] = None, check_finite: Optional[bool] = None) -> Any:
    """o [b, t, hq, e] in q's dtype."""

def chunk_attention(q: Array, k: Array, v: Array, log_g: Optional[Array] = None, *, p: int = 2,
                    scale: Optional[float] = None, chunk_size: Optional[int] = 128,
                    backend: Optional[str] = None, check_finite: Optional[bool] = None) -> Tuple[Any, Any, Any]:
    """(y [b, t, hq, e], l [b, t, hq], rowmax [b, t, hq])."""

def expanded_dim(d: int, p: int = 2, layout: str = "sympow") -> int: ...

@dataclass(frozen=True)
class BackendInfo:
    name: str
    available: bool
    reason: str
    device_count: int
    path: str
    abi_version: int

@dataclass(frozen=True)
class DeviceInfo:
    backend: str
    index: int
    name: str
    kind: str
    compute_capability: Optional[Tuple[int, int]]
    multiprocessors: int
    memory_bytes: int

def backends() -> List[BackendInfo]: ...
def available_backends() -> List[str]: ...
def devices(backend: Optional[str] = None) -> List[DeviceInfo]: ...
def set_default_backend(name: Optional[str]) -> None: ...
def get_default_backend() -> Optional[str]: ...
def set_check_finite(enabled: bool) -> None: ...
def get_check_finite() -> bool: ...

@dataclass
class CheckResult:
    op: str
    backend: str
    dtype: str
    seed: int
    config: Dict[str, object]
    tolerance: float
    status: str
    errors: Dict[str, float]
    nonfinite: Dict[str, int]
    reason: str
    oracle: str
    repro: str
    @property
    def passed(self) -> bool: ...
    def __bool__(self) -> bool: ...

@overload
def check(op: Literal["all"], backend: Optional[str] = None, *, dtype: str = "f32", seed: Optional[int] = None,
          tolerance: Optional[float] = None, device: int = 0, **config: Any) -> List[CheckResult]: ...
@overload
def check(op: str, backend: Optional[str] = None, *, dtype: str = "f32", seed: Optional[int] = None,
          tolerance: Optional[float] = None, device: int = 0, **config: Any) -> CheckResult: ...
def check(op: str, backend: Optional[str] = None, *, dtype: str = "f32", seed: Optional[int] = None,
          tolerance: Optional[float] = None, device: int = 0, **config: Any) -> Union[CheckResult, List[CheckResult]]:
    """Runs op on backend on fresh random inputs against its oracle, as `expanse check` does: the
    reference, or the naive f64 implementation for backend="reference"; relative error per output."""

class ExpanseError(Exception):
    status: str
class InvalidArgumentError(ExpanseError, ValueError): ...
class UnsupportedError(ExpanseError, NotImplementedError): ...
class BackendError(ExpanseError, RuntimeError): ...
class OutOfMemoryError(ExpanseError, MemoryError): ...
class WorkspaceError(ExpanseError, RuntimeError): ...
class InternalError(ExpanseError, RuntimeError): ...

"""Backends and devices, and which backend a call uses."""

import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

from . import _expanse
from ._arrays import CPU, CUDA, DEVICE_NAMES, ROCM
from ._errors import BackendError, InvalidArgumentError

# The backend for each device type when nothing else is asked for.
_BY_DEVICE = {CPU: "reference", CUDA: "cuda", ROCM: "hip"}
_default: Optional[str] = None


@dataclass(frozen=True)
class BackendInfo:
    """A backend the library knows: the built-in ``reference`` or a plugin module.

    ``available`` is False when the module could not be loaded or found no device; ``reason`` says
    why. ``path`` is the module's file ("" for the built-in reference)."""

    name: str
    available: bool
    reason: str
    device_count: int
    path: str
    abi_version: int

    def __str__(self):
        if self.available:
            return f"{self.name}: {self.device_count} device(s)" + (f" ({self.path})" if self.path else "")
        return f"{self.name}: not available: {self.reason}"


@dataclass(frozen=True)
class DeviceInfo:
    """A device of an available backend. ``kind`` is "cpu", "cuda" or "rocm";
    ``compute_capability`` is (major, minor) on GPUs, None on the CPU."""

    backend: str
    index: int
    name: str
    kind: str
    compute_capability: Optional[Tuple[int, int]]
    multiprocessors: int
    memory_bytes: int

    def __str__(self):
        cc = f", compute capability {self.compute_capability[0]}.{self.compute_capability[1]}" \
            if self.compute_capability else ""
        return (f"{self.backend}:{self.index}: {self.name} ({self.kind}, {self.multiprocessors} "
                f"multiprocessors, {self.memory_bytes / 2**30:.1f} GiB{cc})")


def backends() -> List[BackendInfo]:
    """Every backend the library found, the built-in ``reference`` first, then the plugin modules
    ``libexpanse-<name>.so`` found beside libexpanse.so (inside this package) and in the folders of
    ``$EXPANSE_BACKEND_PATH``; unavailable ones are listed with the reason.

    >>> [b.name for b in expanse.backends() if b.available]
    ['reference']
    """
    return [BackendInfo(d["name"], d["available"], d["reason"], d["device_count"], d["path"], d["abi_version"])
            for d in _expanse.backends()]


def available_backends() -> List[str]:
    """Names of the backends that can run now (loaded, with at least one device)."""
    return [b.name for b in backends() if b.available]


def devices(backend: Optional[str] = None) -> List[DeviceInfo]:
    """The devices of one backend, or of every available backend when ``backend`` is None.

    >>> expanse.devices("reference")[0].kind
    'cpu'
    """
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"devices: 'backend' must be a backend name or None, got {type(backend).__name__}")
    names = [backend] if backend is not None else available_backends()
    known = {b.name: b for b in backends()}
    out = []
    for name in names:
        info = known.get(name)
        count = info.device_count if info is not None and info.available else 1  # else: the library's error
        for index in range(count):
            d = _expanse.device_info(name, index)
            cc = (d["compute_major"], d["compute_minor"]) if d["device_type"] != CPU else None
            out.append(DeviceInfo(name, index, d["name"], DEVICE_NAMES.get(d["device_type"], str(d["device_type"])),
                                  cc, d["multiprocessors"], d["memory_bytes"]))
    return out


def set_default_backend(name: Optional[str]) -> None:
    """Makes ``name`` the backend of every call that passes ``backend=None``; ``None`` restores the
    automatic choice. Raises BackendError (a RuntimeError) when the backend is unknown or
    unavailable, with the reason.

    Without a default set here, a call uses ``$EXPANSE_BACKEND`` when set, else the backend of its
    arrays' device: ``reference`` for CPU arrays, ``cuda`` for CUDA tensors, ``hip`` for ROCm ones.
    """
    global _default
    if name is None:
        _default = None
        return
    if not isinstance(name, str):
        raise TypeError(f"set_default_backend: expected a backend name or None, got {type(name).__name__}")
    _require_available(name)
    _default = name


def get_default_backend() -> Optional[str]:
    """The backend set with set_default_backend(), else ``$EXPANSE_BACKEND``, else None (chosen by
    device at each call)."""
    return _default or os.environ.get("EXPANSE_BACKEND") or None


def _require_available(name):
    found = {b.name: b for b in backends()}
    if name not in found:
        raise BackendError(f"no backend named '{name}'; known backends: {', '.join(found)}. Plugins are "
                           "searched beside libexpanse.so and in $EXPANSE_BACKEND_PATH")
    if not found[name].available:
        raise BackendError(f"backend '{name}' is unavailable: {found[name].reason}")


def resolve(backend, device_type, op):
    """The backend name a call runs on (see set_default_backend)."""
    if backend is not None:
        if not isinstance(backend, str):
            raise TypeError(f"{op}: 'backend' must be a backend name or None, got {type(backend).__name__}")
        return backend
    chosen = get_default_backend()
    if chosen:
        return chosen
    if device_type not in _BY_DEVICE:
        raise InvalidArgumentError(f"{op}: the arrays are on DLPack device type {device_type}, for which expanse "
                                   "has no backend")
    return _BY_DEVICE[device_type]

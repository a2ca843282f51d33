"""PyTorch and expanse in one process, on the CPU (no GPU needed; skipped without PyTorch): check()
and the ops after `import torch`, and before it.

The crash these guard against: a toolchain that links libstdc++ statically into shared objects (the
GPU machines' /opt/gcc) left a private copy of it in libexpanse.so and in the extension, exported.
Beside PyTorch's libstdc++.so the dynamic linker bound references across the copies: `import torch`
then expanse.check() crashed in the harness, and `import expanse` then `import torch` crashed in
torch. The build keeps what shared objects take from static archives private (--exclude-libs,ALL in
the root CMakeLists.txt). Each scenario runs in a child process, so that a crash fails its test
instead of ending the pytest run."""

import ctypes
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

import expanse

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="skipped: PyTorch is not installed")

_SCRIPT = r"""
import {first}, {second}
import torch
for op in ("power_attention", "update_state", "chunk_attention", "power_attention_step"):
    r = expanse.check(op, backend="reference", dtype="f32", seed=11, t=40, d=8, e=8)
    print(r)
    assert r.status == "pass", r
q = torch.randn(1, 24, 2, 8, dtype=torch.float32, generator=torch.Generator().manual_seed(3))
o = expanse.power_attention(q, q, q, backend="reference")
assert isinstance(o, torch.Tensor) and o.shape == q.shape and bool(torch.isfinite(o).all())
print(expanse.check("discumsum", backend="reference", dtype="bf16", seed=12))
print("done")
"""


def _run(first, second):
    env = dict(os.environ)
    package_root = str(pathlib.Path(expanse.__file__).resolve().parents[1])  # the `expanse` the tests import
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.pop("EXPANSE_BACKEND", None)
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", _SCRIPT.format(first=first, second=second)],
                          env=env, capture_output=True, text=True, timeout=600)


@needs_torch
@pytest.mark.parametrize("first,second", [("torch", "expanse"), ("expanse", "torch")],
                         ids=["torch_first", "expanse_first"])
def test_check_with_torch_in_the_process(first, second):
    out = _run(first, second)
    assert out.returncode == 0, f"exit status {out.returncode}\n{out.stdout}\n{out.stderr}"
    assert out.stdout.count(": pass: ") == 5 and out.stdout.rstrip().endswith("done"), out.stdout


def _exporter(handle, name):
    """The file that defines `name` as seen from `handle` (the object first, then its dependencies),
    or None when no object there exports it."""
    libdl = ctypes.CDLL(None)
    libdl.dlsym.restype = ctypes.c_void_p
    libdl.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    address = libdl.dlsym(handle, name.encode())
    if not address:
        return None

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    info = DlInfo()
    libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    assert libdl.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) != 0
    return os.path.realpath(info.dli_fname.decode())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="skipped: ELF symbol tables (Linux)")
def test_no_runtime_symbols_exported():
    """Neither the extension nor libexpanse exports C++ runtime symbols (libstdc++, libsupc++): with
    a statically linked libstdc++ they would interpose on, or be bound to, another library's. The
    exporter of each is looked up from the extension's handle (the extension, then libexpanse, then
    their dependencies); it must be a runtime library, if any."""
    module = ctypes.CDLL(expanse._expanse.__file__)
    libexpanse = _exporter(module._handle, "expanse_version")
    assert libexpanse is not None and "libexpanse" in os.path.basename(libexpanse)
    ours = {os.path.realpath(expanse._expanse.__file__), libexpanse}
    for name in ("_ZNSt6locale5_ImplD1Ev", "_ZNSt6localeD1Ev", "_ZNSt6localeC1Ev", "_ZSt4cout",
                 "_ZNSt8ios_base4InitC1Ev", "_ZNKSt5ctypeIcE13_M_widen_initEv", "_ZSt20__throw_length_errorPKc",
                 "__cxa_throw", "__cxa_begin_catch", "__cxa_allocate_exception", "__gxx_personality_v0",
                 "_ZTISt9exception", "_Znwm", "_ZdlPv"):
        where = _exporter(module._handle, name)
        assert where not in ours, f"{os.path.basename(where)} exports {name}"

"""check(): an operation on any backend against the reference, on fresh random inputs.

The inputs are drawn in float64, rounded to the dtype under test, and given to both sides: the
backend gets them in that dtype (gates and states in float32), the reference gets the same rounded
values in float64 and computes every output in float64. Each output is compared by its relative
Frobenius error ||out - ref|| / ||ref|| against the SPEC tolerance of the dtype.
"""

from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np

from . import _expanse, _ops, _params
from ._arrays import CPU
from ._errors import UnsupportedError

# SPEC.md, "Numerical contract": any backend vs the reference, per output (f64: the reference's own
# oracle contract). Pass tolerance=5e-4 to check() for f32 kernels that use tf32 tensor cores.
TOLERANCES = {"f64": 1e-12, "f32": 1e-5, "f16": 2e-3, "bf16": 5e-3}

OPS = ("sympow_expand", "update_state", "discumsum", "query_state", "chunk_attention", "power_attention",
       "power_attention_step")

_DEFAULTS = dict(b=1, t=64, hq=2, h=2, d=16, e=16, p=2, chunk_size=None, layout="sympow", scale=None, gated=True,
                 normalize=True, initial_state=False, final_state=False, intra=False)
# Ops that need a chunk size get this one when none is given (power_attention: the quadratic form;
# chunk_attention: one chunk per sequence).
_CHUNKED_DEFAULT = 16


@dataclass
class CheckResult:
    """The outcome of check(): per output, the relative Frobenius error against the reference
    (``errors``) and the count of NaN/Inf where the reference is finite (``nonfinite``).

    ``status`` is "pass", "fail" or "skipped" (the backend declined the problem; ``reason`` says
    why). ``passed`` is True unless the status is "fail", as for ``expanse check``; ``seed`` and
    ``config`` reproduce the case: check(op, backend=..., dtype=..., seed=seed, **config)."""

    op: str
    backend: str
    dtype: str
    seed: int
    config: Dict[str, object]
    tolerance: float
    status: str
    errors: Dict[str, float] = field(default_factory=dict)
    nonfinite: Dict[str, int] = field(default_factory=dict)
    reason: str = ""

    @property
    def passed(self) -> bool:
        return self.status != "fail"

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        head = f"{self.op} on {self.backend} ({self.dtype}, seed {self.seed})"
        if self.status == "skipped":
            return f"{head}: skipped: {self.reason}"
        parts = []
        for name, err in self.errors.items():
            bad = f", {self.nonfinite[name]} non-finite" if self.nonfinite.get(name) else ""
            parts.append(f"{name} {err:.2e}{bad}")
        return f"{head}: {self.status}: " + ", ".join(parts) + f" (tolerance {self.tolerance:.0e})"


def check(op: str, backend: Optional[str] = None, *, dtype: str = "f32", seed: Optional[int] = None,
          tolerance: Optional[float] = None, device: int = 0, **config):
    """Runs one operation on ``backend`` and on the reference, on the same fresh random inputs,
    and returns the relative error of each output (a CheckResult; a list of them for op="all").

    Args:
        op: an operation name ('power_attention', 'power_attention_step', 'sympow_expand',
            'update_state', 'discumsum', 'query_state', 'chunk_attention') or 'all' (each once,
            with the given settings where they apply).
        backend: the backend under test; None: the default backend (set_default_backend,
            $EXPANSE_BACKEND, else 'reference').
        dtype: dtype of the token inputs on the backend: 'f32', 'f16', 'bf16' or 'f64'.
        seed: seed of the random inputs; None draws one (it is reported in the result).
        tolerance: overrides the SPEC tolerance of dtype (TOLERANCES).
        device: device index on the backend.
        **config: problem settings, defaults in brackets: b [1], t [64], hq [2], h [2], d [16],
            e [16], p [2], chunk_size [None: quadratic for power_attention, one chunk for
            chunk_attention, 16 for update_state/query_state/discumsum], layout ['sympow'],
            scale [None], gated [True] (random log_g), normalize [True], initial_state [False]
            (power_attention's S0/z0, discumsum's Y_init), final_state [False], intra [False]
            (query_state with chunk_attention's result).

    Example::

        >>> r = expanse.check("power_attention", backend="cuda", dtype="bf16", t=1000, chunk_size=128)
        >>> r.passed, r.errors
        (True, {'o': 0.0021...})
    """
    if not isinstance(op, str):
        raise TypeError(f"check: 'op' must be an operation name, got {type(op).__name__}")
    if dtype not in TOLERANCES:
        raise ValueError(f"check: unknown dtype '{dtype}' (expected one of {', '.join(TOLERANCES)})")
    unknown = set(config) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"check: unknown settings {sorted(unknown)}; known: {', '.join(_DEFAULTS)}")
    if backend is None:
        backend = _default_backend()
    if op == "all":
        return [check(name, backend, dtype=dtype, seed=seed, tolerance=tolerance, device=device, **config)
                for name in OPS]
    if op not in OPS:
        raise ValueError(f"check: unknown operation '{op}' (expected one of {', '.join(OPS)} or 'all')")
    cfg = {**_DEFAULTS, **config}
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % 2**63)
    tol = TOLERANCES[dtype] if tolerance is None else float(tolerance)
    case = _Case(op, cfg, dtype, backend, device, np.random.default_rng(seed))
    result = CheckResult(op, backend, dtype, seed, dict(config), tol, "pass")
    try:
        ref = case.run("reference", oracle=True)
        out = case.run(backend, oracle=False)
    except UnsupportedError as e:
        result.status, result.reason = "skipped", str(e)
        return result
    for name, r in ref.items():
        o = out[name]
        finite = np.isfinite(r)
        bad = int(np.count_nonzero(finite & ~np.isfinite(o)))
        ok = finite & np.isfinite(o)
        diff = np.linalg.norm((o - r)[ok])
        norm = np.linalg.norm(r[ok])
        result.errors[name] = float(diff / norm if norm > 0 else diff)
        result.nonfinite[name] = bad
        if bad or not result.errors[name] <= tol:
            result.status = "fail"
    return result


def _default_backend():
    from ._backends import get_default_backend
    return get_default_backend() or "reference"


# ---------------------------------------------------------------- inputs on any backend

_STORAGE = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "bf16": np.uint16}


def _round(x, dtype):
    """x (float64) rounded to dtype, returned as float64."""
    if dtype == "bf16":
        return _from_bf16_bits(_to_bf16_bits(x))
    return x.astype(_STORAGE[dtype]).astype(np.float64)


def _to_bf16_bits(x):
    # Round to nearest even on the float32 bit pattern (float64 -> float32 first: exact for values
    # that are already bf16, and the double rounding is harmless for random test data).
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _from_bf16_bits(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _to_backend(x, dtype, backend, device, on_host):
    """An array of dtype holding x (already rounded) in backend's memory: a numpy array for a CPU
    backend where numpy has the dtype, else memory the backend allocates."""
    host = _to_bf16_bits(x) if dtype == "bf16" else np.ascontiguousarray(x, dtype=_STORAGE[dtype])
    if on_host and dtype != "bf16":
        return host
    arr = _expanse.alloc(backend, device, list(x.shape), dtype)
    _expanse.copy(backend, device, arr, host)
    return arr


def _to_numpy(a, backend, device):
    """float64 numpy copy of an output (numpy, or expanse's own array on any device)."""
    if isinstance(a, np.ndarray):
        return a.astype(np.float64)
    info = _expanse.describe(a)
    host = np.empty(info["shape"], dtype=_STORAGE[info["dtype"]])
    _expanse.copy(backend, device, host, a)
    return _from_bf16_bits(host) if info["dtype"] == "bf16" else host.astype(np.float64)


class _Case:
    """One problem: float64 inputs (already rounded), runnable on the reference or any backend."""

    def __init__(self, op, cfg, dtype, backend, device, rng):
        self.op, self.cfg, self.dtype, self.backend, self.device = op, cfg, dtype, backend, device
        self.rng = rng
        self.state_dtype = _params.state_dtype(dtype)
        self.inputs = {}  # name -> (float64 values, "token" | "state")
        self._make_inputs()

    # -- random data
    def _normal(self, *shape):
        return self.rng.standard_normal(shape)

    def _log_gate(self, *shape):
        # log of a decay in (0, 1): logsigmoid of noise around 1, as the C++ harness draws it.
        return -np.log1p(np.exp(-self.rng.normal(1.0, 1.0, shape)))

    def _token(self, name, x):
        self.inputs[name] = (_round(x, self.dtype), "token")

    def _state(self, name, x):
        self.inputs[name] = (_round(x, self.state_dtype), "state")

    def _chunk(self):
        c = self.cfg["chunk_size"]
        return _CHUNKED_DEFAULT if c is None else c

    def _make_inputs(self):
        c, op = self.cfg, self.op
        b, t, hq, h, d, e = (c[n] for n in ("b", "t", "hq", "h", "d", "e"))
        if op == "sympow_expand":
            self._token("x", self._normal(b, t, d))
        elif op == "discumsum":
            n = -(-t // self._chunk())
            self._token("X", self._normal(b, n, h, d, e))
            self._state("A", self._log_gate(b, n, h))
            if c["initial_state"]:
                self._token("Y_init", self._normal(b, h, d, e))
        elif op == "power_attention_step":
            self._token("q", self._normal(b, hq, d))
            self._token("k", self._normal(b, h, d))
            self._token("v", self._normal(b, h, e))
            if c["gated"]:
                self._state("log_g", self._log_gate(b, h))
            S, z = self._random_state()
            self._state("S", S)
            if c["normalize"]:
                self._state("z", z)
        else:
            if op != "update_state":
                self._token("q", self._normal(b, t, hq, d))
            self._token("k", self._normal(b, t, h, d))
            self._token("v", self._normal(b, t, h, e))
            if c["gated"]:
                self._state("log_g", self._log_gate(b, t, h))
            if op == "power_attention" and c["initial_state"]:
                S, z = self._random_state()
                self._state("S0", S)
                if c["normalize"]:
                    self._state("z0", z)
            if op == "query_state":
                self._consistent_query_inputs()

    def _random_state(self):
        """A state as left by a short random gated sequence (realistic magnitudes and, for even p,
        a positive denominator), computed by the reference in float64."""
        c = self.cfg
        b, h, d, e, steps = c["b"], c["h"], c["d"], c["e"], 7
        k = self._normal(b, steps, h, d)
        g = self._log_gate(b, steps, h) if c["gated"] else None
        _, (S, z) = _ops.power_attention(k, k, self._normal(b, steps, h, e), g, p=c["p"], layout=c["layout"],
                                         normalize=True, output_final_state=True, backend="reference")
        return S, z

    def _consistent_query_inputs(self):
        """States entering each chunk, and the intra-chunk result, of one random sequence."""
        c, cs = self.cfg, self._chunk()
        q, k, v = (self.inputs[n][0] for n in ("q", "k", "v"))
        g = self.inputs["log_g"][0] if "log_g" in self.inputs else None
        S, z = _ops.update_state(k, v, g, p=c["p"], chunk_size=cs, layout=c["layout"], backend="reference")
        b, t, h = k.shape[:3]
        n = S.shape[1]
        A = np.zeros((b, n, h))
        if g is not None:
            for m in range(n):
                A[:, m] = g[:, m * cs:(m + 1) * cs].sum(axis=1)
        self._state("S", _ops.discumsum(S, A, backend="reference")[:, :n])
        if c["normalize"]:
            self._state("z", _ops.discumsum(z, A, backend="reference")[:, :n])
        if c["intra"]:
            y, l, rowmax = _ops.chunk_attention(q, k, v, g, p=c["p"], scale=c["scale"], chunk_size=cs,
                                                backend="reference")
            self._state("y", y)
            self._state("l", l)
            self._state("rowmax", rowmax)
        del self.inputs["k"], self.inputs["v"]

    # -- running
    def run(self, backend, *, oracle):
        """{output name: float64 numpy array} of the op on backend; oracle: the reference on float64
        numpy copies of the inputs (everything float64), else the inputs in the dtypes under test
        in the backend's memory."""

        args = {}
        for name, (x, kind) in self.inputs.items():
            if oracle:
                args[name] = x.copy()
            else:
                dt = self.dtype if kind == "token" else self.state_dtype
                on_host = _expanse.device_info(backend, self.device)["device_type"] == CPU
                args[name] = _to_backend(x, dt, backend, self.device, on_host)
        out = self._call(args, backend)
        return {n: (_to_numpy(a, backend, self.device) if not oracle else np.asarray(a, dtype=np.float64))
                for n, a in out.items()}

    def _call(self, a, backend):
        c, op = self.cfg, self.op
        g = a.get("log_g")
        common = dict(p=c["p"], backend=backend)
        if op == "sympow_expand":
            return {"out": _ops.sympow_expand(a["x"], layout=c["layout"], **common)}
        if op == "update_state":
            S, z = _ops.update_state(a["k"], a["v"], g, chunk_size=self._chunk(), layout=c["layout"], **common)
            return {"S": S, "z": z}
        if op == "discumsum":
            return {"Y": _ops.discumsum(a["X"], a["A"], a.get("Y_init"), backend=backend)}
        if op == "query_state":
            intra = (a["y"], a["l"], a["rowmax"]) if "y" in a else None
            return {"o": _ops.query_state(a["q"], a["S"], a.get("z"), g, intra=intra, scale=c["scale"],
                                          chunk_size=self._chunk(), normalize=c["normalize"], layout=c["layout"],
                                          **common)}
        if op == "chunk_attention":
            y, l, m = _ops.chunk_attention(a["q"], a["k"], a["v"], g, scale=c["scale"],
                                           chunk_size=c["chunk_size"], **common)
            return {"y": y, "l": l, "rowmax": m}
        if op == "power_attention":
            init = (a["S0"], a.get("z0")) if "S0" in a else None
            r = _ops.power_attention(a["q"], a["k"], a["v"], g, scale=c["scale"], chunk_size=c["chunk_size"],
                                     normalize=c["normalize"], initial_state=init,
                                     output_final_state=c["final_state"], layout=c["layout"], **common)
            if not c["final_state"]:
                return {"o": r}
            o, (S, z) = r
            return {"o": o, "S": S, **({"z": z} if z is not None else {})}
        # power_attention_step: the state is updated in place and compared too.
        S, z = a["S"], a.get("z")
        o = _ops.power_attention_step(a["q"], a["k"], a["v"], g, state=(S, z), scale=c["scale"],
                                      normalize=c["normalize"], layout=c["layout"], **common)
        return {"o": o, "S": S, **({"z": z} if z is not None else {})}

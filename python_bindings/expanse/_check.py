"""check(): an operation on any backend against its oracle, on fresh random inputs, as the command
`expanse check` does it.

This is a thin wrapper over the C++ harness (core/harness, expanse::harness::check_case), the code
behind `expanse check` and the C++ test suite: the harness draws the inputs in float64, rounds them to
the dtype under test and gives them to both sides. A backend other than the reference is compared with
the reference (float64 outputs on the same rounded inputs) at the docs/spec.md tolerance of the dtype;
the reference itself is compared with an independent naive float64 implementation
(core/harness/naive_oracle.cpp) at 1e-12. Each output is judged by its relative Frobenius error
||out - ref|| / ||ref|| and by its count of NaN/Inf where the oracle is finite.
"""

from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np

from . import _errors, _expanse, _params
from ._params import INT32, UINT64, invalid

# docs/spec.md, "Numerical contract": any backend vs the reference, per output; f64: the reference
# against the naive oracle. The harness's values. Pass tolerance=5e-4 to check() for f32 kernels that
# use tf32 tensor cores.
TOLERANCES = {dtype: _expanse.check_tolerance(dtype) for dtype in ("f64", "f32", "f16", "bf16")}

OPS = ("sympow_expand", "update_state", "discumsum", "query_state", "chunk_attention", "power_attention",
       "power_attention_step", "sequence_state")

# Problem settings: default and, for integers, the bounds of the command's case options
# (core/cli/case_options.cpp), which keep the harness's host tensors within reason.
_SIZES = dict(b=(1, (0, 2**20)), t=(64, (0, 2**32)), hq=(2, (1, 2**16)), h=(2, (1, 2**16)), d=(16, (1, 2**16)),
              e=(16, (1, 2**16)), p=(2, (1, 16)))
_FLAGS = dict(gated=True, resets=False, initial_state=False, final_state=False, intra=False)
_SETTINGS = (*_SIZES, "chunk_size", "layout", "scale", "normalize", *_FLAGS)
# chunk_size None: the library's choice for power_attention (as its own default), one chunk per
# sequence for chunk_attention, and 16 for the ops that need chunks (the command takes 128 there; at
# the default t = 64, 16 gives 4 chunks).
_CHUNK_DEFAULTS = dict(power_attention=_params.CHUNK_AUTO, update_state=16, query_state=16, discumsum=16,
                       sequence_state=16)


@dataclass
class CheckResult:
    """The outcome of check(): per output, the relative Frobenius error against the oracle
    (``errors``) and the count of NaN/Inf where the oracle is finite (``nonfinite``).

    ``status`` is "pass", "fail" or "skipped" (the backend declined the problem; ``reason`` says
    why; for a backend that failed to run the case, the status is "fail" and ``reason`` the error).
    ``passed`` is True unless the status is "fail", as for ``expanse check``; ``seed`` and
    ``config`` reproduce the case: check(op, backend=..., dtype=..., seed=seed, **config).
    ``oracle`` is "reference", or "naive f64" when the reference itself was checked; ``repro`` is the
    ``expanse check`` command line that runs the same case."""

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
    oracle: str = ""
    repro: str = ""

    @property
    def passed(self) -> bool:
        return self.status != "fail"

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        head = f"{self.op} on {self.backend} ({self.dtype}, seed {self.seed})"
        if self.reason:
            return f"{head}: {self.status}: {self.reason}"
        parts = []
        for name, err in self.errors.items():
            bad = f", {self.nonfinite[name]} non-finite" if self.nonfinite.get(name) else ""
            parts.append(f"{name} {err:.2e}{bad}")
        return (f"{head}: {self.status}: " + ", ".join(parts) +
                f" (tolerance {self.tolerance:.0e}, vs {self.oracle})")


def check(op: str, backend: Optional[str] = None, *, dtype: str = "f32", seed: Optional[int] = None,
          tolerance: Optional[float] = None, device: int = 0, **config):
    """Runs one operation on ``backend`` on fresh random inputs and compares each output with the
    oracle, as ``expanse check`` does (the same C++ harness): the reference backend for any other
    backend, or, for ``backend="reference"``, an independent naive float64 implementation at 1e-12.
    Returns a CheckResult (a list of them for op="all").

    Args:
        op: an operation name ('power_attention', 'power_attention_step', 'sympow_expand',
            'update_state', 'discumsum', 'query_state', 'chunk_attention', 'sequence_state') or 'all' (each once,
            with the given settings where they apply).
        backend: the backend under test; None: the default backend (set_default_backend,
            $EXPANSE_BACKEND, else 'reference').
        dtype: dtype of the token inputs on the backend: 'f32', 'f16', 'bf16' or 'f64' (gates and
            states are float32, float64 for 'f64').
        seed: seed of the random inputs; None draws one (it is reported in the result).
        tolerance: overrides the tolerance (TOLERANCES[dtype] against the reference, 1e-12 for the
            reference against the naive oracle).
        device: device index on the backend.
        **config: problem settings, defaults in brackets: b [1], t [64] (rows for sympow_expand),
            hq [2, or h when h is given], h [2], d [16], e [16], p [2], chunk_size [None: the
            library's choice for power_attention (-1 is the same), one chunk for chunk_attention,
            16 for update_state/query_state/discumsum], layout ['sympow'], scale [None], gated [True]
            (random log_g), resets [False] (with gated: some gates exactly 0, log_g = -inf, a
            reset), normalize [True for even p], initial_state [False] (power_attention's
            S0/z0, discumsum's Y_init), final_state [False], intra [False] (query_state with
            chunk_attention's result).

    Raises:
        TypeError: an unknown setting, or a setting of the wrong type.
        ValueError: a bad value, or a problem the library refuses (expanse.InvalidArgumentError).
        RuntimeError: the backend is missing or unavailable (expanse.BackendError). A backend that
            fails to run a valid case (a kernel error, memory) gives a result with status "fail"
            and the error as ``reason``, as ``expanse check`` prints FAIL.

    Example::

        >>> r = expanse.check("power_attention", backend="cuda", dtype="bf16", t=1000, chunk_size=128)
        >>> r.passed, r.errors
        (True, {'o': 0.0021...})
    """
    if not isinstance(op, str):
        raise TypeError(f"check: argument 'op' must be an operation name, got {type(op).__name__}")
    if not isinstance(dtype, str):
        raise TypeError(f"check: argument 'dtype' must be a string, got {type(dtype).__name__}")
    if dtype not in TOLERANCES:
        raise invalid("check", f"argument 'dtype': unknown dtype '{dtype}' (expected one of {', '.join(TOLERANCES)})")
    unknown = set(config) - set(_SETTINGS)
    if unknown:
        raise TypeError(f"check: unknown settings {sorted(unknown)}; known: {', '.join(_SETTINGS)}")
    if backend is None:
        backend = _default_backend()
    elif not isinstance(backend, str):
        raise TypeError(f"check: argument 'backend' must be a backend name or None, got {type(backend).__name__}")
    device = _params.integer("check", "device", device, bounds=INT32, expected=">= 0")
    seed = _draw_seed() if seed is None else _params.integer("check", "seed", seed, bounds=UINT64)
    tol = None if tolerance is None else _params.finite_float("check", "tolerance", tolerance)
    if op == "all":
        return [check(name, backend, dtype=dtype, seed=seed, tolerance=tolerance, device=device, **config)
                for name in OPS]
    if op not in OPS:
        raise invalid("check", f"unknown operation '{op}' (expected one of {', '.join(OPS)} or 'all')")

    raw = _expanse.check_case(backend, device, op, seed, dtype, **_case(op, config))
    result = CheckResult(op, raw["backend"], dtype, seed, dict(config), 0.0, "pass", oracle=raw["oracle"],
                         repro=raw["repro"])
    if raw["error"]:
        error = _errors.for_status(raw["error_status"])
        if issubclass(error, (_errors.InvalidArgumentError, _errors.BackendError)):
            raise error(raw["error"])  # the settings, or the backend: the caller's to fix
        # The backend failed to run a valid case (a kernel, memory): a failed check, as for the command.
        result.status, result.reason = "fail", raw["error"]
    elif raw["skipped"]:
        result.status, result.reason = "skipped", raw["skipped"]
    if result.status != "pass":
        result.tolerance = TOLERANCES[dtype] if tol is None else tol
        return result
    passed = bool(raw["outputs"])
    for out in raw["outputs"]:
        result.tolerance = out["tolerance"] if tol is None else tol
        result.errors[out["name"]] = out["rel_error"]
        result.nonfinite[out["name"]] = out["nonfinite"]
        # The harness's rule (core/harness/cases.cpp, compare), at the tolerance asked for.
        passed &= out["nonfinite"] == 0 and out["rel_error"] <= result.tolerance
    result.status = "pass" if passed else "fail"
    return result


def _case(op, config):
    """check()'s settings as the keyword arguments of _expanse.check_case (an op_config)."""
    case = {}
    for name, (default, bounds) in _SIZES.items():
        value = config.get(name, default)
        if name == "hq" and "hq" not in config and "h" in config:
            value = config["h"]  # as `expanse check --h H` without --hq
        lo, hi = bounds
        case[name] = _params.integer("check", name, value, bounds=bounds, expected=f"in {lo}..{hi}")
    chunk = config.get("chunk_size")
    if chunk is None:
        chunk = _CHUNK_DEFAULTS.get(op, 0)
    lo = _params.CHUNK_AUTO if op == "power_attention" else 0
    case["chunk_size"] = _params.integer("check", "chunk_size", chunk, bounds=(lo, 2**32),
                                         expected=f"None or in {lo}..{2**32}")
    case["layout"] = _params.layout("check", config.get("layout", "sympow"))
    case["scale"] = _params.scale("check", config.get("scale"))
    case["normalize"] = _params.flag("check", "normalize", config.get("normalize", case["p"] % 2 == 0))
    for name, default in _FLAGS.items():
        case[name] = _params.flag("check", name, config.get(name, default))
    return case


def _draw_seed():
    return int(np.random.SeedSequence().entropy % 2**63)


def _default_backend():
    from ._backends import get_default_backend
    return get_default_backend() or "reference"

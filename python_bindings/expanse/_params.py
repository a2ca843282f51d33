"""Scalar arguments and the defaults the Python API adds to the C ABI, each decided in one place.

The rule for errors: a value of the wrong Python type (a str where an int belongs) raises TypeError;
a bad value raises expanse.InvalidArgumentError (a ValueError), naming the operation and the
argument. The library validates the values it receives and says why in its own words; this module
refuses only what Python itself gives a meaning to (layout names, scale=None) and integers the C ABI
cannot carry (2**40 as an int32_t p), which would otherwise never reach the library.
"""

import math
import numbers

import numpy as np

from ._errors import InvalidArgumentError

# expanse_layout_kind
_SYMPOW, _TILED, _TENSOR = 0, 1, 2

# Ranges of the C integer types of the ABI.
INT32 = (-2**31, 2**31 - 1)
INT64 = (-2**63, 2**63 - 1)
UINT64 = (0, 2**64 - 1)

# expanse_power_attention_args.chunk_size: let the library choose (expanse.h's EXPANSE_CHUNK_AUTO).
CHUNK_AUTO = -1
# Default chunk size of update_state, query_state and chunk_attention (expanse.h's *_args_init).
DEFAULT_CHUNK = 128

# The degrees the library takes (core/src/validate.cpp), quoted in the message for a p that no
# int32_t can hold; the library itself checks every p that reaches it.
_MAX_P = {"sympow_expand": 6}


def invalid(op, message):
    """The error for a bad value: "op: message" as expanse.InvalidArgumentError."""
    return InvalidArgumentError(f"{op}: {message}")


def integer(op, name, value, *, bounds=INT64, expected=None):
    """value as a Python int within bounds (lo, hi), by default those of the C type the ABI takes
    (INT32, INT64). expected describes the valid values for the message (default: "in lo..hi")."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{op}: argument '{name}' must be an int, got {type(value).__name__}")
    value = int(value)
    lo, hi = bounds
    if not lo <= value <= hi:
        raise invalid(op, f"argument '{name}' must be {expected or f'in {lo}..{hi}'}, got {value}")
    return value


def degree(op, value):
    """p, an int32_t in the C ABI."""
    return integer(op, "p", value, bounds=INT32, expected=f"in 1..{_MAX_P.get(op, 4)}")


def flag(op, name, value):
    """A bool; the ints 0 and 1 (and numpy bools) count as bools."""
    if not isinstance(value, (bool, np.bool_, numbers.Integral)):
        raise TypeError(f"{op}: argument '{name}' must be a bool, got {type(value).__name__}")
    if value not in (0, 1):
        raise invalid(op, f"argument '{name}' must be True or False, got {value!r}")
    return bool(value)


def layout(op, value):
    """'sympow' | 'tensor' | 'tiled:N' -> (kind, d_tile) of expanse_layout."""
    if not isinstance(value, str):
        raise TypeError(f"{op}: argument 'layout' must be a string ('sympow', 'tensor' or 'tiled:N'), got "
                        f"{type(value).__name__}")
    text = value.strip().lower()
    if text == "sympow":
        return (_SYMPOW, 0)
    if text == "tensor":
        return (_TENSOR, 0)
    if text.startswith("tiled:") and text[6:].isdigit():
        # d_tile is an int32_t; the library checks 1 <= N and d % N == 0 for the values it can hold.
        return (_TILED, integer(op, "layout", int(text[6:]), bounds=INT32,
                                expected="'tiled:N' with N >= 1 dividing d"))
    raise invalid(op, f"argument 'layout': unknown layout '{value}' (expected 'sympow', 'tensor' or "
                      "'tiled:N', e.g. 'tiled:8')")


def scale(op, value):
    """None -> 0.0, which the C ABI reads as the default 1/sqrt(d)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{op}: argument 'scale' must be a float or None, got {type(value).__name__}")
    if value == 0:
        # The C ABI reads 0 as "the default": refuse it rather than silently change its meaning.
        raise invalid(op, "argument 'scale' must be non-zero (None selects the default 1/sqrt(d))")
    try:
        return float(value)
    except OverflowError:  # an int beyond the range of a double
        raise invalid(op, f"argument 'scale' must be finite, got {value}") from None


def chunk_size(op, value, *, expected):
    """An explicit chunk size (update_state, query_state, chunk_attention); the library checks it."""
    if value is None:
        raise TypeError(f"{op}: argument 'chunk_size' must be an int, got None")
    return integer(op, "chunk_size", value, expected=expected)


def auto_chunk_size(op, value):
    """power_attention's chunk size: None (or -1) lets the library choose the form and the chunk
    size by sequence length and backend (EXPANSE_CHUNK_AUTO), 0 is the quadratic form, c >= 1 the
    chunked algorithm."""
    if value is None:
        return CHUNK_AUTO
    return integer(op, "chunk_size", value, expected="None or -1 (automatic), 0 (quadratic) or >= 1 (chunked)")


def finite_float(op, name, value):
    """A finite float (check()'s tolerance)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{op}: argument '{name}' must be a float, got {type(value).__name__}")
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result) or result < 0:
        raise invalid(op, f"argument '{name}' must be a finite number >= 0, got {value}")
    return result


def state_dtype(input_dtype):
    """States, log-gates and the intra-chunk (y, l, rowmax) are float32 for float16, bfloat16 and
    float32 inputs, and float64 for float64 inputs (the reference backend as an oracle), on every
    backend."""
    return "f64" if input_dtype == "f64" else "f32"

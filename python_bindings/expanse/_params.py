"""Scalar arguments and the defaults the Python API adds to the C ABI, each decided in one place."""

import numbers

import numpy as np

# expanse_layout_kind
_SYMPOW, _TILED, _TENSOR = 0, 1, 2


def layout(op, value):
    """'sympow' | 'tensor' | 'tiled:N' -> (kind, d_tile) of expanse_layout."""
    if not isinstance(value, str):
        raise TypeError(f"{op}: 'layout' must be a string ('sympow', 'tensor' or 'tiled:N'), got "
                        f"{type(value).__name__}")
    text = value.strip().lower()
    if text == "sympow":
        return (_SYMPOW, 0)
    if text == "tensor":
        return (_TENSOR, 0)
    if text.startswith("tiled:") and text[6:].isdigit():
        return (_TILED, int(text[6:]))
    raise ValueError(f"{op}: unknown layout '{value}' (expected 'sympow', 'tensor' or 'tiled:N', e.g. 'tiled:8')")


def integer(op, name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{op}: '{name}' must be an int, got {type(value).__name__}")
    return int(value)


def flag(op, name, value):
    if not isinstance(value, (bool, np.bool_, numbers.Integral)) or value not in (0, 1):
        raise TypeError(f"{op}: '{name}' must be a bool, got {value!r}")
    return bool(value)


def scale(op, value):
    """None -> 0.0, which the C ABI reads as the default 1/sqrt(d)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{op}: 'scale' must be a float or None, got {type(value).__name__}")
    if value == 0:
        # The C ABI reads 0 as "the default": refuse it rather than silently change its meaning.
        raise ValueError(f"{op}: 'scale' must be non-zero (None selects the default 1/sqrt(d))")
    return float(value)


def chunk_size(op, value, *, quadratic_default):
    """The chunk size passed to the C ABI. power_attention and chunk_attention read 0 as the
    quadratic form (one chunk spanning the sequence): their None maps to 0 here, and so would a
    future "auto"."""
    if value is None:
        if quadratic_default:
            return 0
        raise TypeError(f"{op}: 'chunk_size' must be an int")
    return integer(op, "chunk_size", value)


# Default chunk size of update_state, query_state and chunk_attention (expanse.h's *_args_init).
DEFAULT_CHUNK = 128


def state_dtype(input_dtype):
    """States, log-gates and the intra-chunk (y, l, rowmax) are f32, or f64 when the token inputs
    are f64 (the reference backend as an oracle)."""
    return "f64" if input_dtype == "f64" else "f32"

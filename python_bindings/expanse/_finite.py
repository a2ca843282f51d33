"""The opt-in check of input values (expanse_context_set_check_finite): the process-wide setting and
each call's check_finite argument."""

from typing import Optional

from . import _params

_enabled = False


def set_check_finite(enabled: bool) -> None:
    """Turns the finite check on or off for every call that passes ``check_finite=None`` (the
    default), in every thread. Off at import.

    With the check on, an operation first scans its floating inputs and raises
    expanse.InvalidArgumentError (a ValueError) naming the first input that holds a NaN or an
    infinity and the index of that element; log_g (and discumsum's A) may hold -inf, which means a
    reset. It reads every input once more, and on a GPU copies the inputs to the host and
    synchronizes the stream: a debugging aid. With the check off, non-finite inputs give non-finite
    outputs and no error.

    >>> expanse.set_check_finite(True)
    >>> expanse.power_attention(q_with_nan, k, v)
    InvalidArgumentError: power_attention: argument 'q' ... non-finite ...
    """
    global _enabled
    _enabled = _params.flag("set_check_finite", "enabled", enabled)


def get_check_finite() -> bool:
    """Whether calls with ``check_finite=None`` check their inputs (see set_check_finite)."""
    return _enabled


def resolve(op: str, value: Optional[bool]) -> bool:
    """A call's check_finite argument: None follows set_check_finite()."""
    return _enabled if value is None else _params.flag(op, "check_finite", value)

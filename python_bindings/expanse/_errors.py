"""Exceptions: one class per status of the C library, each also a standard Python exception.

``except ValueError`` catches bad input (every invalid value raises InvalidArgumentError, whether
the library or the Python layer finds it), ``except NotImplementedError`` a problem the chosen
backend does not implement, and ``except expanse.ExpanseError`` anything expanse reports. The message
names the operation and the offending argument.
"""

from . import _expanse


class ExpanseError(Exception):
    """Base class of the errors the expanse library reports. ``status`` is the C status name."""

    status = "error"


class InvalidArgumentError(ExpanseError, ValueError):
    """Bad input: rank, shape, dtype, device, p, layout, chunk size, ... (EXPANSE_ERROR_INVALID_ARGUMENT)."""

    status = "invalid argument"


class UnsupportedError(ExpanseError, NotImplementedError):
    """Valid input that the chosen backend does not implement; the message names the backend and
    the reason (EXPANSE_ERROR_UNSUPPORTED). Also raised for a torch tensor that requires grad (while
    gradients are enabled) in an operation that has no backward pass yet. A NotImplementedError is a
    RuntimeError, which is what PyTorch raises for operations without autograd support."""

    status = "unsupported"


class BackendError(ExpanseError, RuntimeError):
    """A backend that does not exist, failed to load or has no device (EXPANSE_ERROR_BACKEND)."""

    status = "backend error"


class OutOfMemoryError(ExpanseError, MemoryError):
    """The backend could not allocate memory (EXPANSE_ERROR_OUT_OF_MEMORY)."""

    status = "out of memory"


class WorkspaceError(ExpanseError, RuntimeError):
    """The workspace given to the backend was too small (EXPANSE_ERROR_WORKSPACE)."""

    status = "workspace too small"


class InternalError(ExpanseError, RuntimeError):
    """A failure inside a backend, such as a kernel launch (EXPANSE_ERROR_INTERNAL)."""

    status = "internal error"


# expanse_status codes of expanse.h.
_BY_STATUS = {
    1: InvalidArgumentError,
    2: UnsupportedError,
    3: BackendError,
    4: OutOfMemoryError,
    5: WorkspaceError,
    6: InternalError,
}
_expanse._set_error_types(_BY_STATUS)


def for_status(status):
    """The exception class of an expanse_status code."""
    return _BY_STATUS.get(status, InternalError)

# Shown as expanse.InvalidArgumentError (where users catch them), not expanse._errors....
for _cls in (ExpanseError, *_BY_STATUS.values()):
    _cls.__module__ = "expanse"

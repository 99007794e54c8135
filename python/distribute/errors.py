"""The errors distribute raises, named as TensorFlow's (tf.errors).

Every error the C++ library raises arrives in Python as one of these classes,
all subclasses of OpError, with the library's message: it names the replica,
the collective and the shapes involved.
"""


class OpError(Exception):
    """The base of distribute's errors, as tf.errors.OpError."""

    error_code = 2  # UNKNOWN

    def __init__(self, message):
        super().__init__(message)
        self.message = message


def _error(name, code, doc):
    return type(name, (OpError,), {"error_code": code, "__doc__": doc, "__module__": __name__})


# The codes are TensorFlow's (and abseil's) canonical status codes.
CancelledError = _error("CancelledError", 1, "The operation was cancelled.")
InvalidArgumentError = _error("InvalidArgumentError", 3, "An argument is not valid (shape, dtype, axis, ...).")
DeadlineExceededError = _error("DeadlineExceededError", 4, "A collective did not complete within its timeout.")
NotFoundError = _error("NotFoundError", 5, "Something named was not found.")
ResourceExhaustedError = _error("ResourceExhaustedError", 8, "Memory (host or device) ran out.")
FailedPreconditionError = _error("FailedPreconditionError", 9, "The call is not allowed in the current state.")
AbortedError = _error("AbortedError", 10, "Another replica or worker failed; this one was released.")
OutOfRangeError = _error("OutOfRangeError", 11, "An index or an input ran out of its range.")
UnimplementedError = _error("UnimplementedError", 12, "Not supported (yet), and said so.")
InternalError = _error("InternalError", 13, "A bug in distribute, or in a library beneath it.")
UnavailableError = _error("UnavailableError", 14, "A peer (a worker, a device) is not reachable.")
DataLossError = _error("DataLossError", 15, "Stored bytes are lost or corrupted (a checkpoint's CRC, size or header).")

__all__ = [
    "OpError",
    "CancelledError",
    "InvalidArgumentError",
    "DeadlineExceededError",
    "NotFoundError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "AbortedError",
    "OutOfRangeError",
    "UnimplementedError",
    "InternalError",
    "UnavailableError",
    "DataLossError",
]

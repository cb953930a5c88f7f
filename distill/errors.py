"""The one exception type for user errors.

A `KdnasError` is something the user can fix (a bad name, path, size or value). The CLI prints its
message on one line and exits with code 2, without a traceback. Anything else is a bug.
"""


class KdnasError(Exception):
    """A user error: its message names the bad value and what is allowed."""


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type name when it has none
    (wrapping a library error into a one-line `KdnasError`)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]

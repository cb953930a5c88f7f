"""kdnas's exceptions: one base class, one subclass per kind of failure a caller may want to tell apart.

    KdnasError          every kdnas error; the CLI prints its message on one line and exits with 2
    ├── InputError      a bad name, path, size or value given by the user (also a ValueError)
    ├── AssetError      a bundled teacher, corpus or task is missing or fails its hash
    ├── ParityError     an exported graph disagrees with PyTorch beyond its tolerance
    ├── LatencyError    a latency measurement could not be made (worker crashed or timed out)
    ├── StorageError    the study storage cannot be opened or belongs to another search
    └── TrainingError   training diverged (a non-finite loss) or cannot start from given weights

Anything that is not a `KdnasError` is a bug and keeps its traceback. Messages name the value and
what is allowed, so that one line is enough.
"""

from collections.abc import Sequence


class KdnasError(Exception):
    """A kdnas error: its message names the bad value and what is allowed."""


class InputError(KdnasError, ValueError):
    """A value the user gave (option, path, name, shape) is not allowed."""


class AssetError(KdnasError):
    """A bundled asset is not installed, missing a file, or altered."""


class ParityError(KdnasError):
    """An exported graph's outputs differ from PyTorch's beyond the tolerance."""


class LatencyError(KdnasError):
    """The isolated latency worker failed or ran out of time."""


class StorageError(KdnasError):
    """The study storage cannot be opened, or holds a different search."""


class TrainingError(KdnasError):
    """Training cannot go on: a non-finite loss, or weights that do not fit the student."""


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type name when it has none
    (wrapping a library error into a one-line `KdnasError`)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def check_choice(what: str, value: object, allowed: Sequence[object]) -> None:
    """A value that must be one of `allowed`: else one `InputError` in the wording every kdnas
    option uses, "<what> <value> is invalid: allowed a, b, c"."""
    if value not in allowed:
        raise InputError(f"{what} {value!r} is invalid: allowed {', '.join(map(str, allowed))}")

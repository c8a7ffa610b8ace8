"""Small argument checks shared by the buffer classes and the validation module.

One rule for every message: a value of the wrong type raises ``TypeError``, a wrong value
``ValueError``; both start with ``kv-canary:`` and name the argument, the expected and the
actual value.
"""

from __future__ import annotations

import operator

from .layout import INT64_MAX, INT64_MIN, MAX_CAPACITY


def check_index(name: str, value: object) -> int:
    """``operator.index(value)`` (Python and numpy integers; bools and tensors refused: a
    device tensor would sync at every launch)."""
    if isinstance(value, bool) or type(value).__module__.startswith("torch"):
        raise TypeError(
            f"kv-canary: {name} must be an int, got {type(value).__name__} {value!r} "
            "(a Python or numpy integer; a tensor would sync at every launch)"
        )
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"kv-canary: {name} must be an int, got {type(value).__name__} {value!r}"
        ) from None


def check_capacity(name: str, value: object) -> int:
    """A capacity: an integer in ``[1, 2**31 - 1]`` (counters and row indices are int32)."""
    number = check_index(name, value)
    if not 1 <= number <= MAX_CAPACITY:
        raise ValueError(
            f"kv-canary: {name} must be in [1, {MAX_CAPACITY}] (counters are int32), got {number}"
        )
    return number


def check_int64(
    name: str, value: object, *, minimum: int = INT64_MIN, maximum: int = INT64_MAX
) -> int:
    """An integer that a kernel receives as int64, within ``[minimum, maximum]``."""
    number = check_index(name, value)
    if not minimum <= number <= maximum:
        raise ValueError(f"kv-canary: {name} must be in [{minimum}, {maximum}], got {number}")
    return number


def check_bool(name: str, value: object) -> bool:
    """A Python bool (not a tensor, not an int)."""
    if not isinstance(value, bool):
        raise TypeError(f"kv-canary: {name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def check_optional_nonnegative(name: str, value: object | None) -> int | None:
    """None, or an integer ``>= 0`` (int64)."""
    if value is None:
        return None
    return check_int64(name, value, minimum=0)

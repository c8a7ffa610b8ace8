"""Small argument checks: integers, capacities and input tensors, shared by the buffer
classes (buffers, store, staging, real_kv) and the validation of the three stages. They
import nothing above the layout, so every module can use them.

One rule for every message: a value of the wrong type raises ``TypeError``, a wrong value
``ValueError``; both start with ``kv-canary:`` and name the argument, the expected and the
actual value.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import attrs
import torch

from .devices import device_predicate
from .layout import INT64_MAX, INT64_MIN, MAX_CAPACITY, ROW_DTYPE

new_tuple = tuple.__new__
"""``new_tuple(SomeNamedTuple, values)``: the validated arguments' record built at every
launch, without the generated ``__new__``'s keyword handling (a fraction of a microsecond
less host time)."""


# --- integers ----------------------------------------------------------------------------
def check_index(name: str, value: object, expected: str = "an int") -> int:
    """``operator.index(value)`` (Python and numpy integers; bools and tensors refused: a
    device tensor would sync at every launch). ``expected`` words the ``TypeError``."""
    if isinstance(value, bool) or type(value).__module__.startswith("torch"):
        raise TypeError(
            f"kv-canary: {name} must be {expected}, got {type(value).__name__} {value!r} "
            "(a Python or numpy integer; a tensor would sync at every launch)"
        )
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"kv-canary: {name} must be {expected}, got {type(value).__name__} {value!r}"
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
    """An integer that a kernel receives as int64, within ``[minimum, maximum]`` (both
    inside int64)."""
    if type(value) is int and minimum <= value <= maximum:
        return value  # the common case, without a call
    number = check_index(name, value)
    if not minimum <= number <= maximum:
        raise ValueError(f"kv-canary: {name} must be in [{minimum}, {maximum}], got {number}")
    return number


def check_bool(name: str, value: object) -> bool:
    """A Python bool (not a tensor, not an int)."""
    if not isinstance(value, bool):
        raise TypeError(f"kv-canary: {name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def check_nonnegative(name: str, value: object) -> int:
    """An integer ``>= 0``."""
    number = check_index(name, value)
    if number < 0:
        raise ValueError(f"kv-canary: {name} must be >= 0, got {number}")
    return number


def check_need(name: str, value: object) -> int:
    """A count to make room for (``ensure_capacity``): an integer in ``[0, 2**31 - 1]``."""
    number = check_nonnegative(name, value)
    if number > MAX_CAPACITY:
        raise ValueError(
            f"kv-canary: {name} must be <= {MAX_CAPACITY} (the largest capacity: counters are "
            f"int32), got {number}"
        )
    return number


def check_positive(name: str, value: object, multiple: int = 1) -> int:
    """An integer ``>= 1``, a multiple of ``multiple``."""
    number = check_index(name, value)
    if number < 1 or number % multiple:
        rule = f"a positive multiple of {multiple}" if multiple > 1 else ">= 1"
        raise ValueError(f"kv-canary: {name} must be {rule}, got {number}")
    return number


def nonnegative_field(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """attrs validator: the field is an integer ``>= 0`` (a generation)."""
    check_nonnegative(attribute.name, value)


# --- input tensors -------------------------------------------------------------------------
_SHAPE_DOC = {
    "req_to_token": "[rows, max_seq_len]",
    "block_table": "[rows, max_blocks]",
    "full_to_swa_index_mapping": "[lut_len]",
    "req_to_verify_expected_tokens": "[pool_rows, pool_cols]",
    **dict.fromkeys(
        ("input_ids", "positions", "out_cache_loc", "expected_input_ids", "expected_positions"),
        "[n]",
    ),
}


OnDevice = Callable[[torch.Tensor], bool]


def check_tensor(
    name: str,
    t: object,
    dtype: torch.dtype,
    ndim: int,
    device: torch.device,
    on_device: OnDevice | None = None,
) -> torch.Tensor:
    """Check one input tensor's type, dtype, rank, device and contiguity.
    ``on_device`` is ``device_predicate(device)``, passed in when the caller has it."""
    if on_device is None:
        on_device = device_predicate(device)
    if (
        isinstance(t, torch.Tensor)
        and t.dtype is dtype
        and t.dim() == ndim
        and on_device(t)
        and t.is_contiguous()
    ):
        return t
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kv-canary: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(
            f"kv-canary: {name} must have dtype {dtype}, got {t.dtype} "
            "(nothing is cast: convert it once where it is allocated)"
        )
    if t.dim() != ndim:
        shape = _SHAPE_DOC.get(name, "[bs]")
        raise ValueError(
            f"kv-canary: {name} must be {ndim}-D {shape}, got {t.dim()}-D shape {tuple(t.shape)}"
        )
    if not on_device(t):
        raise ValueError(
            f"kv-canary: {name} must be on the buffers' device {device}, got {t.device}"
        )
    raise ValueError(f"kv-canary: {name} must be contiguous, got strides {t.stride()}")


def check_row_tensor(
    name: str, t: object, bs: int, device: torch.device, on_device: OnDevice | None = None
) -> torch.Tensor:
    """Check a per-row int64 ``[bs]`` input."""
    if (  # the fast path of check_length, inlined: it runs for every row tensor per launch
        on_device is not None
        and isinstance(t, torch.Tensor)
        and t.dtype is ROW_DTYPE
        and t.shape == (bs,)
        and on_device(t)
        and t.is_contiguous()
    ):
        return t
    return check_length(name, t, bs, device, on_device, "bs = len(req_pool_indices)")


def check_length(
    name: str,
    t: object,
    length: int,
    device: torch.device,
    on_device: OnDevice | None = None,
    what: str = "n = len(out_cache_loc)",
) -> torch.Tensor:
    """Check a 1-D int64 input of ``length`` elements (``what`` names the length)."""
    if on_device is None:
        on_device = device_predicate(device)
    # Fast path (every launch): one shape read covers the rank and the length.
    if (
        isinstance(t, torch.Tensor)
        and t.dtype is ROW_DTYPE
        and t.shape == (length,)
        and on_device(t)
        and t.is_contiguous()
    ):
        return t
    tensor = check_tensor(name, t, ROW_DTYPE, 1, device, on_device)
    raise ValueError(f"kv-canary: {name} must have length {what} = {length}, got {tensor.shape[0]}")

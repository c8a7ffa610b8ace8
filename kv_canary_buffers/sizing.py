"""Host-side sizing: how many verify entries the plan of a batch emits.

An engine sizes ``PlanBuffers.verify_capacity`` (``ensure_capacity(verify_entries=...)``)
from the batch it is about to plan, on the host, before the launch: reading the count back
from the device would sync. :func:`verify_entries_needed` is that count, computed exactly as
the plan computes ``total`` (``docs/contract.md``, "Per-row values"), from the host data
the scheduler built the batch from.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .checks import check_index, check_int64
from .layout import INT64_MAX, INT64_MIN

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
HostInts = Sequence[int] | np.ndarray | torch.Tensor
"""A sequence of Python or numpy integers, a numpy integer array, or a CPU tensor of an
integer dtype (one value per batch row)."""


def verify_entries_needed(
    prefix_lens: HostInts,
    *,
    req_pool_indices: HostInts | None = None,
    extend_seq_lens: HostInts | None = None,
    swa_window_size: int = 0,
) -> int:
    """The number of verify entries the plan of this batch emits (``total`` of
    ``docs/contract.md``): the ``verify_capacity`` the plan needs to verify the step
    (with a smaller one it sets ``verify_enable = 0`` and verifies nothing).

    Per row, with ``P = prefix_lens[r]`` and ``W = swa_window_size``: 0 for a padding row
    (``req_pool_indices[r] == 0``; every row is busy when ``req_pool_indices`` is None),
    for ``P <= 0`` and for a row with ``extend_seq_lens[r] < 0`` (a negative length: the
    plan treats the row as padding, ``PlanStatus.NEGATIVE_LENGTH``); ``min(P, W)`` under a
    window (``W > 0``); ``P`` otherwise. The sum is exact (any int64 per row, no wrap).
    ``extend_seq_lens`` only decides which rows count (the plan verifies the prefix a step
    attends to, not the tokens it writes): without it a row of negative ``E`` is counted,
    an upper bound. A write-only plan (``verify=False``) needs no verify capacity at all.

    Takes **host data**, the lists or CPU tensors the scheduler built the batch from: a
    sequence of Python or numpy integers, a numpy integer array, or a CPU tensor of an
    integer dtype. A tensor on another device is refused (``ValueError``) rather than
    read, since reading it would sync with the device. Typical use, before the plan::

        need = verify_entries_needed(prefix_lens_host, req_pool_indices=rows_host,
                                     swa_window_size=W)
        buffers = buffers.ensure_capacity(write_reqs=len(rows_host), verify_entries=need)

    Raises ``TypeError`` for an argument of the wrong type (a scalar, a string, a float
    element) and ``ValueError`` for a wrong value (a device tensor, a float or bool
    dtype, not 1-D, a value outside int64, lengths that differ, a negative window).
    """
    window = check_int64("swa_window_size", swa_window_size, minimum=0)
    lens = _host_ints("prefix_lens", prefix_lens)
    rows = None if req_pool_indices is None else _host_ints("req_pool_indices", req_pool_indices)
    if rows is not None and len(rows) != len(lens):
        raise ValueError(
            f"kv-canary: req_pool_indices must have length len(prefix_lens) = {len(lens)}, "
            f"got {len(rows)}"
        )
    if extend_seq_lens is not None:
        extend = _host_ints("extend_seq_lens", extend_seq_lens)
        if len(extend) != len(lens):
            raise ValueError(
                f"kv-canary: extend_seq_lens must have length len(prefix_lens) = {len(lens)}, "
                f"got {len(extend)}"
            )
        # A row of negative E counts as padding: give it rp 0 (every row 1 without rows).
        extend_ok = [
            e >= 0 for e in (extend.tolist() if isinstance(extend, torch.Tensor) else extend)
        ]
        if rows is None:
            rows = [int(ok) for ok in extend_ok]
        else:
            as_rows = rows.tolist() if isinstance(rows, torch.Tensor) else rows
            rows = [r if ok else 0 for r, ok in zip(as_rows, extend_ok)]
        if isinstance(lens, torch.Tensor):
            rows = torch.tensor(rows, dtype=torch.int64)
    if isinstance(lens, torch.Tensor) and (rows is None or isinstance(rows, torch.Tensor)):
        counts = lens.clamp_min(0)
        if window > 0:
            counts = counts.clamp_max(window)
        if rows is not None:
            counts = counts.masked_fill(rows == 0, 0)
        n = counts.numel()
        if n == 0:
            return 0
        if int(counts.max()) <= INT64_MAX // n:  # the int64 sum cannot wrap
            return int(counts.sum())
        lens, rows = counts.tolist(), None
    as_list = lens.tolist() if isinstance(lens, torch.Tensor) else lens
    active = [1] * len(as_list) if rows is None else rows
    if isinstance(active, torch.Tensor):
        active = active.tolist()
    return sum(
        (min(p, window) if window > 0 else p) for p, r in zip(as_list, active) if r != 0 and p > 0
    )


def _host_ints(name: str, value: object) -> torch.Tensor | list[int]:
    """``value`` as a 1-D CPU int64 tensor, or a list of ints (a sequence, or a uint64
    array whose values may not fit int64)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise ValueError(
                f"kv-canary: {name} must be host data (a CPU tensor, a numpy array or a "
                f"sequence of ints), got a tensor on {value.device}: reading it would sync; "
                "pass the host copy the scheduler built the batch from"
            )
        if value.dtype not in _INT_DTYPES:
            raise ValueError(f"kv-canary: {name} must hold integers, got dtype {value.dtype}")
        if value.dim() != 1:
            raise ValueError(
                f"kv-canary: {name} must be 1-D [bs], got {value.dim()}-D shape "
                f"{tuple(value.shape)}"
            )
        return value.long()
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise ValueError(f"kv-canary: {name} must hold integers, got dtype {value.dtype}")
        if value.ndim != 1:
            raise ValueError(
                f"kv-canary: {name} must be 1-D [bs], got {value.ndim}-D shape {value.shape}"
            )
        if value.dtype == np.uint64:
            return _checked_list(name, value.tolist())
        return torch.from_numpy(value.astype(np.int64))
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        return _checked_list(name, value)
    raise TypeError(
        f"kv-canary: {name} must be host data: a sequence of ints, a numpy integer array or "
        f"a CPU tensor, got {type(value).__name__} {value!r}"
    )


def _checked_list(name: str, values: Sequence[object]) -> list[int]:
    out = []
    for i, v in enumerate(values):
        number = check_index(f"{name}[{i}]", v)
        if not INT64_MIN <= number <= INT64_MAX:
            raise ValueError(
                f"kv-canary: {name}[{i}] must be in [{INT64_MIN}, {INT64_MAX}], got {number}"
            )
        out.append(number)
    return out

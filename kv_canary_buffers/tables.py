"""Loading an engine's per-token slot lists into a ``req_to_token`` table: the validation
and the torch reference of ``kv_canary_kernels.launch_load_token_slots``.

An engine that gives its read slots as one flat list per step (transformers' ``read_index``:
every position ``0 .. P + E - 1`` of each row, rows concatenated) has them copied into the
rows of the ``req_to_token`` table the plan reads. ``starts`` (int64 ``[bs + 1]``, ``0``
first, non-decreasing) cuts ``slots`` into the rows' lists; row ``b``'s list goes to
``req_to_token[rows[b], 0 .. starts[b + 1] - starts[b] - 1]``. Each slot is saturated to
int32 (an int64 slot outside int32 becomes ``-2**31`` or ``2**31 - 1``, out of range for
every store, so the plan and the verify flag it instead of wrapping onto a real slot).

``rows`` should be distinct: two lists for one table row overwrite each other (the
reference's last wins; the kernel's order is unspecified). The data in ``rows`` and
``starts`` is the caller's (the runtime's own rows and the
lengths it checked against the table's shape): lanes whose row is outside the table,
whose position is past ``max_len`` or the table's width, or whose index is past
``slots`` write nothing and read nothing (no out-of-bounds access for any input); the
validation proves, on host numbers only, that ``max_len`` fits the table. The load has
no status word: a skipped lane is not flagged. Its one caller, the engines runtime, gives
only its own rows (inside the table, which it grows first) and starts from lengths it
checked against ``slots``, so none is skipped there; another caller must give data as
valid.
"""

from __future__ import annotations

import torch

from .checks import check_tensor
from .layout import INT32_MAX, INT32_MIN


def validate_load_token_slots_args(
    req_to_token: object, slots: object, rows: object, starts: object, max_len: object
) -> int:
    """Check the arguments of a token-slot load (module docstring); returns ``bs``."""
    if not isinstance(req_to_token, torch.Tensor):
        raise TypeError(
            f"kv-canary: req_to_token must be a torch.Tensor, got {type(req_to_token).__name__}"
        )
    device = req_to_token.device
    table = check_tensor("req_to_token", req_to_token, torch.int32, 2, device)
    if not isinstance(slots, torch.Tensor) or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"kv-canary: slots must be an int32 or int64 tensor, got "
            f"{getattr(slots, 'dtype', type(slots).__name__)}"
        )
    check_tensor("slots", slots, slots.dtype, 1, device)
    rows_t = check_tensor("rows", rows, torch.int64, 1, device)
    starts_t = check_tensor("starts", starts, torch.int64, 1, device)
    bs = rows_t.shape[0]
    if starts_t.shape[0] != bs + 1:
        raise ValueError(
            f"kv-canary: starts must have bs + 1 = {bs + 1} entries, got {starts_t.shape[0]}"
        )
    if type(max_len) is not int or not 0 <= max_len <= table.shape[1]:
        raise ValueError(
            f"kv-canary: max_len must be an int in [0, req_to_token.shape[1] = "
            f"{table.shape[1]}], got {max_len!r}"
        )
    return bs


def load_token_slots_reference(
    req_to_token: torch.Tensor,
    slots: torch.Tensor,
    rows: torch.Tensor,
    starts: torch.Tensor,
    *,
    max_len: int,
) -> None:
    """The torch reference of ``launch_load_token_slots`` (module docstring): the same
    writes, the same lanes skipped. A host read of ``rows`` and ``starts`` (a reference).
    ``req_to_token`` int32 ``[table_rows, width]``; ``slots`` int32 or int64 ``[n]``
    (cut at n); ``rows`` int64 ``[bs]``; ``starts`` int64 ``[bs + 1]``; ``max_len`` a
    host int in ``[0, width]``; all contiguous, on one device."""
    validate_load_token_slots_args(req_to_token, slots, rows, starts, max_len)
    table_rows, width = req_to_token.shape
    limit = min(max_len, width)
    bounds = starts.tolist()
    for b, row in enumerate(rows.tolist()):
        if not 0 <= row < table_rows:
            continue
        lo, hi = bounds[b], bounds[b + 1]
        count = max(0, min(hi - lo, limit, slots.shape[0] - lo)) if lo >= 0 else 0
        if count:
            values = slots[lo : lo + count].to(torch.int64).clamp(INT32_MIN, INT32_MAX)
            req_to_token[row, :count] = values.to(torch.int32)

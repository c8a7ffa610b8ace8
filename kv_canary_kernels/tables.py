"""``launch_load_token_slots``: an engine's per-token slot lists into ``req_to_token``, in
one launch (the semantics, validation and torch reference: :mod:`kv_canary_buffers.tables`).

The canary runtime loads a :class:`~kv_canary_engines.TokenSlots` step's table with it on
CUDA: the per-token scatter index it replaces was built on the host with numpy over every
position the step's rows attend to, staged, and followed by a saturating cast and an
``index_put_`` (three torch calls beside the numpy); here the rows' starts (``bs + 1``
int64) are the only host array, and one program per (row, block of positions) copies,
saturates and stores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kv_canary_buffers.layout import INT32_MAX, INT32_MIN
from kv_canary_buffers.tables import validate_load_token_slots_args

from .fast_launch import Launcher, alignment_key, cdiv

BLOCK = 512
"""Positions a program copies."""

_INT32_MIN: tl.constexpr = tl.constexpr(INT32_MIN)
_INT32_MAX: tl.constexpr = tl.constexpr(INT32_MAX)

_RUNTIME_INTS = ("table_rows", "width", "slots_len", "limit", "chunks")


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def load_token_slots_kernel(
    table_ptr,
    slots_ptr,
    rows_ptr,
    starts_ptr,
    table_rows: tl.int64,
    width: tl.int64,
    slots_len: tl.int64,
    limit: tl.int64,
    chunks: tl.int64,
    BLOCK: tl.constexpr,
):
    """Program ``b * chunks + c``: positions ``c * BLOCK ..`` of batch row ``b``. A row
    outside the table or a negative start writes nothing; no subtraction below can wrap
    (``0 <= lo <= hi`` once checked, ``slots_len >= 0``)."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // chunks
    c = pid - b * chunks
    row = tl.load(rows_ptr + b)
    lo = tl.load(starts_ptr + b)
    hi = tl.load(starts_ptr + b + 1)
    ok = (row >= 0) & (row < table_rows) & (lo >= 0)
    row = tl.where(ok, row, 0)
    lo = tl.where(ok, lo, 0)
    hi = tl.where(ok, tl.maximum(hi, lo), 0)  # a crossing list is empty: hi - lo >= 0
    count = tl.minimum(tl.minimum(hi - lo, limit), slots_len - lo)
    j = c * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = ok & (j < count)
    value = tl.load(slots_ptr + lo + j, mask=mask, other=0).to(tl.int64)
    value = tl.minimum(tl.maximum(value, _INT32_MIN), _INT32_MAX).to(tl.int32)
    tl.store(table_ptr + row * width + j, value, mask=mask)


_LAUNCHER = Launcher(load_token_slots_kernel)


def launch_load_token_slots(
    req_to_token: torch.Tensor,
    slots: torch.Tensor,
    rows: torch.Tensor,
    starts: torch.Tensor,
    *,
    max_len: int,
) -> None:
    """``req_to_token[rows[b], :n_b] = saturate_int32(slots[starts[b] : starts[b + 1]])``
    for each batch row ``b`` (``n_b`` at most ``max_len``), byte for byte
    :func:`kv_canary_buffers.load_token_slots_reference` for distinct ``rows`` (two lists
    for one row: which lands is unspecified). Validates first (nothing is
    written on a rejection), then one launch on the current stream of ``bs * ceil(max_len /
    BLOCK)`` programs; no allocation, no sync.

    Args:
        req_to_token: int32 ``[table_rows, width]``, contiguous: the table written.
        slots: int32 or int64 ``[n]``, contiguous: the rows' lists, concatenated (cut at n).
        rows: int64 ``[bs]``: each list's table row.
        starts: int64 ``[bs + 1]``: list ``b`` is ``slots[starts[b] : starts[b + 1]]``.
        max_len: a host int in ``[0, width]``: the most slots written a row.
    All on one device."""
    bs = validate_load_token_slots_args(req_to_token, slots, rows, starts, max_len)
    table_rows, width = req_to_token.shape
    limit = min(max_len, width)
    if bs == 0 or limit == 0:
        return
    chunks = cdiv(limit, BLOCK)
    tensors = (req_to_token, slots, rows, starts)
    _LAUNCHER.launch(
        req_to_token.device,
        (bs * chunks, 1, 1),
        (slots.dtype, alignment_key(tensors)),
        (*tensors, table_rows, width, slots.shape[0], limit, chunks),
        {"BLOCK": BLOCK},
        {"num_warps": 4},
    )

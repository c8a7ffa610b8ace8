"""Entries stage: one verify entry per lane, over a persistent grid.

Each program walks blocks of ``BLOCK`` entries ``t < verify_num_valid`` (zero blocks when
the offsets stage flagged an overflow, so no host sync is needed to skip it). The owning
row of each entry is the last ``r < bs`` with ``verify_offsets[r] <= t``: two scalar
binary searches bound the rows of the block, and a vector search runs between them
(usually one to three rows, so one or two steps).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import LUT_SLOT_BIT, any_bit, translate, window_start

_RUNTIME_INTS = [
    "bs", "window", "token_offset", "table_rows", "table_cols", "lut_len",
    "pool_rows", "pool_cols",
]


@triton.jit
def _find_row(verify_offsets_ptr, entry, bs):
    """Scalar: the last row ``r`` in ``[0, bs)`` with ``verify_offsets[r] <= entry``."""
    lo = tl.full([], 0, tl.int32)
    hi = lo + bs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        go_right = tl.load(verify_offsets_ptr + mid) <= entry
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid)
    return lo


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def plan_entries_kernel(
    # inputs
    req_pool_indices_ptr, prefix_lens_ptr, req_to_token_ptr, lut_ptr,
    token_pool_ptr, valid_lens_ptr,
    verify_offsets_ptr, verify_num_valid_ptr, verify_enable_ptr,
    # outputs
    slot_ptr, token_ptr, position_ptr, prev_slot_ptr, status_ptr,
    # runtime sizes
    bs, window, token_offset, table_rows, table_cols, lut_len, pool_rows, pool_cols,
    HAS_LUT: tl.constexpr, HAS_POOL: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    enabled = tl.load(verify_enable_ptr) != 0
    total = tl.where(enabled, tl.load(verify_num_valid_ptr), 0)
    bits = tl.full([], 0, tl.int32)
    for start in range(pid * BLOCK, total, nprog * BLOCK):
        entry = start + tl.arange(0, BLOCK)
        in_range = entry < total
        lo = tl.zeros([BLOCK], tl.int32) + _find_row(verify_offsets_ptr, start, bs)
        hi = tl.zeros([BLOCK], tl.int32) + 1 + _find_row(
            verify_offsets_ptr, tl.minimum(start + BLOCK, total) - 1, bs
        )
        while tl.max(hi - lo, 0) > 1:
            mid = (lo + hi) // 2
            go_right = tl.load(verify_offsets_ptr + mid) <= entry
            lo = tl.where(go_right, mid, lo)
            hi = tl.where(go_right, hi, mid)
        row = lo

        rp = tl.load(req_pool_indices_ptr + row)
        prefix = tl.load(prefix_lens_ptr + row)
        pos = window_start(prefix, window) + (entry - tl.load(verify_offsets_ptr + row))
        rp_ok = (rp >= 0) & (rp < table_rows)
        table_row = req_to_token_ptr + rp * table_cols
        # Reads that would leave the table are not made: those slots become 0, untranslated.
        slot_read = in_range & rp_ok & (pos < table_cols)
        slot = tl.load(table_row + pos, mask=slot_read, other=0).to(tl.int64)
        has_prev = pos > 0
        prev_read = in_range & rp_ok & has_prev & (pos <= table_cols)
        prev = tl.load(table_row + pos - 1, mask=prev_read, other=0).to(tl.int64)
        if HAS_LUT:
            slot, bad_slot = translate(slot, lut_ptr, lut_len, slot_read)
            prev, bad_prev = translate(prev, lut_ptr, lut_len, prev_read)
            bits |= any_bit(bad_slot | bad_prev, LUT_SLOT_BIT)
        prev = tl.where(has_prev, prev, -1)
        if HAS_POOL:
            q = pos + token_offset
            checked = in_range & (q >= 0) & (q < tl.load(valid_lens_ptr + row))
            checked &= (q < pool_cols) & (rp >= 0) & (rp < pool_rows)
            token = tl.load(token_pool_ptr + rp * pool_cols + q, mask=checked, other=-1)
            token = token.to(tl.int64)
        else:
            token = tl.full([BLOCK], -1, tl.int64)
        tl.store(slot_ptr + entry, slot, mask=in_range)
        tl.store(token_ptr + entry, token, mask=in_range)
        tl.store(position_ptr + entry, pos, mask=in_range)
        tl.store(prev_slot_ptr + entry, prev, mask=in_range)
    tl.atomic_or(status_ptr, bits, mask=bits != 0)

"""Entries stage of the large-batch path: one verify entry per lane.

Program ``p`` handles entry blocks ``p, p + grid, ...`` below ``verify_num_valid`` (none
when the offsets stage flagged an overflow, so skipping needs no host sync). The owning
row of entry ``t`` is the last ``r < bs`` with ``verify_offsets[r] <= t``. The rows of a
block's first and last entries are found by a ``FANOUT``-ary search (one vector load per
level: two levels up to 65536 rows), then each lane binary-searches between them,
usually one to three rows apart.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from .common import window_start, write_entries

_RUNTIME_INTS = [
    "bs", "window", "token_offset", "table_rows", "table_cols", "lut_len",
    "pool_rows", "pool_cols",
]


@triton.jit
def _find_rows(verify_offsets_ptr, key_a, key_b, bs, FANOUT: tl.constexpr):
    """For two keys: the last row ``r < bs`` with ``verify_offsets[r] <= key``.

    Each level samples ``FANOUT`` offsets ``stride`` apart in the current span, counts
    those ``<= key``, and narrows the span to one stride."""
    lanes = tl.arange(0, FANOUT)
    lo_a = tl.full([], 0, tl.int32)
    lo_b = tl.full([], 0, tl.int32)
    span = lo_a + bs
    while span > 1:
        stride = (span + FANOUT - 1) // FANOUT
        step = lanes * stride
        idx_a = lo_a + step
        idx_b = lo_b + step
        ok_a = (step < span) & (idx_a < bs)
        ok_b = (step < span) & (idx_b < bs)
        val_a = tl.load(verify_offsets_ptr + idx_a, mask=ok_a, other=0)
        val_b = tl.load(verify_offsets_ptr + idx_b, mask=ok_b, other=0)
        lo_a += (tl.sum((ok_a & (val_a <= key_a)).to(tl.int32), 0) - 1) * stride
        lo_b += (tl.sum((ok_b & (val_b <= key_b)).to(tl.int32), 0) - 1) * stride
        span = stride
    return lo_a, lo_b


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
    FANOUT: tl.constexpr, USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if USE_PDL:
        gdc_wait()  # launched early: wait for the offsets kernel's results
    enabled = tl.load(verify_enable_ptr) != 0
    total = tl.where(enabled, tl.load(verify_num_valid_ptr), 0)
    bits = tl.full([], 0, tl.int32)
    for start in range(pid * BLOCK, total, nprog * BLOCK):
        entry = start + tl.arange(0, BLOCK)
        in_range = entry < total
        first_row, last_row = _find_rows(
            verify_offsets_ptr, start, tl.minimum(start + BLOCK, total) - 1, bs, FANOUT
        )
        lo = tl.zeros([BLOCK], tl.int32) + first_row
        hi = tl.zeros([BLOCK], tl.int32) + last_row + 1
        span = last_row - first_row
        while span > 0:  # bit_length(span) steps narrow every lane to one row
            mid = (lo + hi) // 2
            go_right = tl.load(verify_offsets_ptr + mid) <= entry
            lo = tl.where(go_right, mid, lo)
            hi = tl.where(go_right, hi, mid)
            span = span // 2
        row = lo

        rp = tl.load(req_pool_indices_ptr + row)
        prefix = tl.load(prefix_lens_ptr + row)
        pos = window_start(prefix, window) + (entry - tl.load(verify_offsets_ptr + row))
        if HAS_POOL:
            valid_len = tl.load(valid_lens_ptr + row)
        else:
            valid_len = tl.zeros([BLOCK], tl.int64)
        bits |= write_entries(
            entry, in_range, row, rp, pos, valid_len,
            req_to_token_ptr, lut_ptr, token_pool_ptr,
            slot_ptr, token_ptr, position_ptr, prev_slot_ptr,
            token_offset, table_rows, table_cols, lut_len, pool_rows, pool_cols,
            HAS_LUT, HAS_POOL, BLOCK,
        )
    tl.atomic_or(status_ptr, bits, mask=bits != 0)

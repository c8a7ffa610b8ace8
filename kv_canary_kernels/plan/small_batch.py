"""The small-batch path (``bs < SCAN_BLOCK``): the whole plan in one launch.

Every program loads all ``bs`` rows (a tile of ``ROWS >= bs`` rows: 256, 512 or
``SCAN_BLOCK``; a few KB from L2) and scans them in registers, so no program waits for
another: program 0 writes the write plan, ``row_req_pool_indices`` and the counters, and
programs ``1..`` write the verify entries of their blocks (program 1 also
``verify_offsets``), finding each entry's row by a binary search over the verify offsets
held in registers (``tl.gather``), between the rows of the block's ends. One launch
instead of two, and the write plan beside the entries rather than before them, matter
most here, where the plan is all latency.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import (
    find_rows,
    load_valid_lens,
    load_verify_rows,
    window_start,
    write_counts,
    write_entries,
    write_offsets_and_counters,
    write_seeds,
    zero_offsets_tail,
)

_RUNTIME_INTS = [
    "bs",
    "write_capacity",
    "verify_capacity",
    "window",
    "token_offset",
    "table_rows",
    "table_cols",
    "block_cols",
    "page_size",
    "page_shift",
    "lut_len",
    "pool_rows",
    "pool_cols",
]


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def plan_small_batch_kernel(
    # inputs
    req_pool_indices_ptr,
    prefix_lens_ptr,
    extend_seq_lens_ptr,
    req_to_token_ptr,
    block_table_ptr,
    full_to_swa_index_mapping_ptr,
    req_to_verify_expected_tokens_ptr,
    req_to_verify_expected_tokens_valid_lens_ptr,
    # outputs
    write_offsets_ptr,
    write_seed_slot_indices_ptr,
    write_num_valid_reqs_ptr,
    row_req_pool_indices_ptr,
    verify_slot_indices_ptr,
    verify_expected_tokens_ptr,
    verify_expected_positions_ptr,
    verify_prev_slot_indices_ptr,
    verify_num_valid_ptr,
    verify_enable_ptr,
    status_ptr,
    verify_offsets_ptr,
    # runtime sizes
    bs,
    write_capacity,
    verify_capacity,
    window,
    token_offset,
    table_rows,
    table_cols,
    block_cols,
    page_size,
    page_shift,
    lut_len,
    pool_rows,
    pool_cols,
    HAS_LUT: tl.constexpr,
    HAS_POOL: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    VERIFY: tl.constexpr,
    TABLE: tl.constexpr,
):
    # The arguments the helpers take together (tuples: a grouping, no code of their own).
    table = (
        req_to_token_ptr,
        block_table_ptr,
        table_rows,
        table_cols,
        block_cols,
        page_size,
        page_shift,
    )
    lut = (full_to_swa_index_mapping_ptr, lut_len)
    pool = (
        req_to_verify_expected_tokens_ptr,
        req_to_verify_expected_tokens_valid_lens_ptr,
        pool_rows,
        pool_cols,
        token_offset,
    )
    entries = (
        verify_slot_indices_ptr,
        verify_expected_tokens_ptr,
        verify_expected_positions_ptr,
        verify_prev_slot_indices_ptr,
    )
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    rows = tl.arange(0, ROWS)
    in_batch, rp, prefix, extend, active, vcount = load_verify_rows(
        (req_pool_indices_ptr, prefix_lens_ptr, extend_seq_lens_ptr),
        rows,
        bs,
        window,
        verify_capacity,
    )
    v_total = tl.sum(vcount, 0)
    zero_offsets_tail(write_offsets_ptr, bs, write_capacity, 1 + pid, nprog, ROWS)
    if pid == 0:
        wcount = write_counts(extend, active)
        w_total = tl.sum(wcount, 0)
        write_offsets_and_counters(
            rows,
            in_batch,
            wcount,
            0,
            w_total,
            v_total,
            True,
            write_offsets_ptr,
            (write_num_valid_reqs_ptr, verify_num_valid_ptr, verify_enable_ptr, status_ptr),
            bs,
            write_capacity,
            verify_capacity,
            VERIFY,
        )
        if bs == ROWS:  # a full tile: the total at index bs lies just past it
            tl.store(write_offsets_ptr + bs, w_total)
        bits = write_seeds(
            rows,
            in_batch,
            rp,
            prefix,
            active,
            wcount,
            load_valid_lens(pool, rows, in_batch, HAS_POOL),
            table,
            lut,
            pool,
            (write_seed_slot_indices_ptr, row_req_pool_indices_ptr),
            HAS_LUT,
            HAS_POOL,
            TABLE,
        )
        tl.atomic_or(status_ptr, bits, mask=bits != 0, sem="relaxed")
    elif VERIFY:  # (a write-only plan launches program 0 alone)
        fits = v_total <= verify_capacity
        total = tl.where(fits, v_total, 0).to(tl.int32)  # overflow: no entry
        # int32 is exact: with no overflow every prefix sum is at most verify_capacity <
        # 2**31, and with one every count is taken as 0 (the loop below does not run).
        count = tl.where(fits, vcount, 0).to(tl.int32)
        v_excl = tl.cumsum(count, 0) - count
        if pid == 1:
            # verify_offsets (specified only without overflow, when count is vcount): the
            # first entry program has them in registers, off the write plan's program.
            tl.store(
                verify_offsets_ptr + rows,
                tl.where(in_batch, v_excl, total).to(tl.int64),
                mask=rows <= bs,
            )
            if bs == ROWS:  # a full tile: the total at index bs lies just past it
                tl.store(verify_offsets_ptr + bs, total.to(tl.int64))
        first_pos = window_start(prefix, window) - v_excl  # entry t of row r: first_pos[r] + t
        bits = tl.full([], 0, tl.int32)
        for start in range((pid - 1) * BLOCK, total, (nprog - 1) * BLOCK):
            entry = start + tl.arange(0, BLOCK)
            in_range = entry < total
            # Rows of the block's first and last entries, counted in registers with one
            # reduction (bs < 2**16: two 16-bit counts in one int32); each lane then
            # binary-searches between them (usually a few rows: one or two steps).
            last = tl.minimum(start + BLOCK, total) - 1
            counts = tl.sum(
                (in_batch & (v_excl <= start)).to(tl.int32)
                + ((in_batch & (v_excl <= last)).to(tl.int32) << 16),
                0,
            )
            first_row = (counts & 0xFFFF) - 1
            last_row = (counts >> 16) - 1
            row = find_rows(first_row, last_row - first_row + 1, entry, v_excl, True, BLOCK)
            bits |= write_entries(
                entry,
                in_range,
                row,
                tl.gather(rp, row, 0),
                tl.gather(first_pos, row, 0) + entry,
                load_valid_lens(pool, row, in_range, HAS_POOL),
                table,
                lut,
                pool,
                entries,
                HAS_LUT,
                HAS_POOL,
                BLOCK,
                TABLE,
            )
        tl.atomic_or(status_ptr, bits, mask=bits != 0, sem="relaxed")

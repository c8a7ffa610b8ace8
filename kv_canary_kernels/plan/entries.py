"""Entries stage of the three-launch large-batch path: one verify entry per lane, and the
seeds. Its entry blocks (:func:`write_entry_blocks`) are the one-launch path's too.

Programs ``0 .. seed_programs - 1`` write the seeds, ``row_req_pool_indices`` and the rows'
status bits of ``BLOCK`` rows each: they need no scan, so they do not wait for the offsets
stage and run beside it.
The other programs handle entry blocks ``p, p + grid, ...`` below ``verify_num_valid``
(none when the offsets stage flagged an overflow, so skipping needs no host sync).

The owning row of entry ``t`` is the last ``r < bs`` with ``verify_offsets[r] <= t``. The row
of a block's first entry is the offsets stage's row hint (blocks start at multiples of
``HINT_STRIDE``); the ``ROW_WINDOW`` rows from there are loaded in one go, and each lane
finds its row among them in registers. A block that spans more rows (many short ones)
falls back to a binary search in memory, up to the next block's hinted row.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from ..constants import PADDING_ROW
from .common import (
    find_rows,
    load_valid_lens,
    window_start,
    write_entries,
    write_seed_block,
)

_RUNTIME_INTS = [
    "bs",
    "seed_programs",
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


@triton.jit
def write_entry_blocks(
    first,
    step,
    total,
    row_inputs,
    table,
    lut,
    pool,
    scan,
    entries,
    bs,
    verify_capacity,
    window,
    HAS_LUT: tl.constexpr,
    HAS_POOL: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_WINDOW: tl.constexpr,
    HINT_STRIDE: tl.constexpr,
    TABLE: tl.constexpr,
):
    """The verify entries of blocks ``first, first + step, ...`` below ``total``, from the
    scan's ``verify_offsets`` and row hints (``scan``: ``(verify_offsets_ptr,
    verify_row_hints_ptr)``; see the module's docstring); returns the status bits of their
    reads. ``row_inputs`` as for :func:`~.common.load_rows`, the other groups as for
    :func:`~.common.write_entries`.

    The count, hints and rows are clamped to the buffers: they are this plan's own in
    every launch that follows the protocol, and the one-launch path must stay in bounds
    when it did not (``PLAN_SYNC_LOST``: its scratch may be another launch's)."""
    req_pool_indices_ptr, prefix_lens_ptr, _ = row_inputs
    verify_offsets_ptr, verify_row_hints_ptr = scan
    total = tl.minimum(tl.maximum(total, 0), verify_capacity)
    bits = tl.full([], 0, tl.int32)
    for start in range(first, total, step):
        entry = start + tl.arange(0, BLOCK)
        in_range = entry < total
        last = tl.minimum(start + BLOCK, total) - 1
        first_row = tl.load(verify_row_hints_ptr + start // HINT_STRIDE)
        first_row = tl.minimum(tl.maximum(first_row, 0), bs - 1).to(tl.int32)
        # The rows from first_row on, in one load of each input.
        w_rows = first_row + tl.arange(0, ROW_WINDOW)
        w_valid = w_rows < bs
        w_offsets = tl.load(verify_offsets_ptr + w_rows, mask=w_valid, other=last + 1)
        n_rows = tl.sum((w_offsets <= last).to(tl.int32), 0)
        if (n_rows < ROW_WINDOW) | (first_row + ROW_WINDOW >= bs):
            # The window holds every row of the block: search it in registers.
            w_rp = tl.load(req_pool_indices_ptr + w_rows, mask=w_valid, other=PADDING_ROW)
            w_prefix = tl.load(prefix_lens_ptr + w_rows, mask=w_valid, other=0)
            w_base = window_start(w_prefix, window) - w_offsets  # pos = base + entry
            w_valid_lens = load_valid_lens(pool, w_rows, w_valid, HAS_POOL)
            k = find_rows(0, n_rows, entry, w_offsets, True, BLOCK)
            row = first_row + k
            rp = tl.gather(w_rp, k, 0)
            pos = tl.gather(w_base, k, 0) + entry
            valid_len = tl.gather(w_valid_lens, k, 0)
        else:
            # Many short rows: binary search in memory, up to the next block's row.
            next_start = start + BLOCK
            next_row = tl.load(
                verify_row_hints_ptr + next_start // HINT_STRIDE,
                mask=next_start < total,
                other=bs - 1,
            )
            next_row = tl.minimum(tl.maximum(next_row, first_row), bs - 1).to(tl.int32)
            row = find_rows(
                first_row, next_row - first_row + 1, entry, verify_offsets_ptr, False, BLOCK
            )
            rp = tl.load(req_pool_indices_ptr + row)
            prefix = tl.load(prefix_lens_ptr + row)
            pos = window_start(prefix, window) + (entry - tl.load(verify_offsets_ptr + row))
            valid_len = load_valid_lens(pool, row, in_range, HAS_POOL)
        bits |= write_entries(
            entry,
            in_range,
            row,
            rp,
            pos,
            valid_len,
            table,
            lut,
            pool,
            entries,
            HAS_LUT,
            HAS_POOL,
            BLOCK,
            TABLE,
        )
    return bits


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def plan_entries_kernel(
    # inputs
    req_pool_indices_ptr,
    prefix_lens_ptr,
    extend_seq_lens_ptr,
    req_to_token_ptr,
    block_table_ptr,
    full_to_swa_index_mapping_ptr,
    req_to_verify_expected_tokens_ptr,
    req_to_verify_expected_tokens_valid_lens_ptr,
    verify_offsets_ptr,
    verify_row_hints_ptr,
    verify_num_valid_ptr,
    verify_enable_ptr,
    # outputs
    write_seed_slot_indices_ptr,
    row_req_pool_indices_ptr,
    verify_slot_indices_ptr,
    verify_expected_tokens_ptr,
    verify_expected_positions_ptr,
    verify_prev_slot_indices_ptr,
    status_ptr,
    # runtime sizes
    bs,
    seed_programs,
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
    BLOCK: tl.constexpr,
    ROW_WINDOW: tl.constexpr,
    HINT_STRIDE: tl.constexpr,
    USE_PDL: tl.constexpr,
    TABLE: tl.constexpr,
):
    # The arguments the helpers take together (tuples: a grouping, no code of their own).
    row_inputs = (req_pool_indices_ptr, prefix_lens_ptr, extend_seq_lens_ptr)
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
    tl.static_assert(BLOCK % HINT_STRIDE == 0)  # every block starts at a hinted entry
    pid = tl.program_id(0)
    if pid < seed_programs:
        rows = pid * BLOCK + tl.arange(0, BLOCK)
        bits = write_seed_block(
            rows,
            row_inputs,
            table,
            lut,
            pool,
            (write_seed_slot_indices_ptr, row_req_pool_indices_ptr),
            bs,
            window,
            HAS_LUT,
            HAS_POOL,
            TABLE,
        )
    else:
        if USE_PDL:
            gdc_wait()  # launched early: wait for the offsets kernel's results
        enabled = tl.load(verify_enable_ptr) != 0
        total = tl.where(enabled, tl.load(verify_num_valid_ptr), 0)
        bits = write_entry_blocks(
            (pid - seed_programs) * BLOCK,
            (tl.num_programs(0) - seed_programs) * BLOCK,
            total,
            row_inputs,
            table,
            lut,
            pool,
            (verify_offsets_ptr, verify_row_hints_ptr),
            entries,
            bs,
            verify_capacity,
            window,
            HAS_LUT,
            HAS_POOL,
            BLOCK,
            ROW_WINDOW,
            HINT_STRIDE,
            TABLE,
        )
    tl.atomic_or(status_ptr, bits, mask=bits != 0, sem="relaxed")

"""Offsets stage: per-row counts, both exclusive prefix sums, seeds, counters.

A two-level scan over blocks of ``SCAN_BLOCK`` rows. For ``bs < SCAN_BLOCK`` one program
of :func:`plan_offsets_kernel` does it all. For larger batches
:func:`scan_block_sums_kernel` first writes each block's (write, verify) sums into
``PlanBuffers.scan_block_sums``, then each program of :func:`plan_offsets_kernel` adds the
sums of the blocks before its own to a local scan. The program holding index ``bs`` writes
the counters; the others zero the tail of ``write_offsets``. No memset, no torch op.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import (
    POOL_ROW_BIT,
    PREFIX_LEN_BIT,
    REQ_POOL_INDEX_BIT,
    VALID_LEN_BIT,
    LUT_SLOT_BIT,
    any_bit,
    row_counts,
    translate,
)

# Every integer argument is a runtime value: a new bs, capacity or table shape must not
# recompile, and Triton would otherwise specialise values equal to 1 (and divisibility).
_RUNTIME_INTS = ["bs", "window", "sums_stride"]


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def scan_block_sums_kernel(
    req_pool_indices_ptr, prefix_lens_ptr, extend_seq_lens_ptr, sums_ptr,
    bs, window, sums_stride,
    BLOCK: tl.constexpr,
):
    """``sums[0, b]`` / ``sums[1, b]``: write / verify entries of rows in block ``b``."""
    pid = tl.program_id(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    in_batch = rows < bs
    rp = tl.load(req_pool_indices_ptr + rows, mask=in_batch, other=0)
    prefix = tl.load(prefix_lens_ptr + rows, mask=in_batch, other=0)
    extend = tl.load(extend_seq_lens_ptr + rows, mask=in_batch, other=0)
    _active, vcount, wcount = row_counts(rp, prefix, extend, in_batch, window)
    tl.store(sums_ptr + pid, tl.sum(wcount, 0))
    tl.store(sums_ptr + sums_stride + pid, tl.sum(vcount, 0))


_OFFSETS_RUNTIME_INTS = [
    "bs", "n_sum_blocks", "sums_stride", "write_capacity", "verify_capacity", "window",
    "table_rows", "table_cols", "lut_len", "pool_rows", "pool_cols",
]


@triton.jit(do_not_specialize=_OFFSETS_RUNTIME_INTS)
def plan_offsets_kernel(
    # inputs
    req_pool_indices_ptr, prefix_lens_ptr, extend_seq_lens_ptr, req_to_token_ptr,
    lut_ptr, valid_lens_ptr, sums_ptr,
    # outputs
    write_offsets_ptr, write_seed_ptr, write_num_valid_reqs_ptr,
    verify_offsets_ptr, verify_num_valid_ptr, verify_enable_ptr, status_ptr,
    # runtime sizes
    bs, n_sum_blocks, sums_stride, write_capacity, verify_capacity, window,
    table_rows, table_cols, lut_len, pool_rows, pool_cols,
    HAS_LUT: tl.constexpr, HAS_POOL: tl.constexpr,
    BLOCK: tl.constexpr, SUM_CHUNK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    in_batch = rows < bs
    rp = tl.load(req_pool_indices_ptr + rows, mask=in_batch, other=0)
    prefix = tl.load(prefix_lens_ptr + rows, mask=in_batch, other=0)
    extend = tl.load(extend_seq_lens_ptr + rows, mask=in_batch, other=0)
    active, vcount, wcount = row_counts(rp, prefix, extend, in_batch, window)

    # Sums of the blocks before this one, and of all blocks. With n_sum_blocks == 0
    # (single block) the loop is empty and the totals are this block's own sums.
    w_before = tl.full([], 0, tl.int64)
    v_before = tl.full([], 0, tl.int64)
    w_all = tl.full([], 0, tl.int64)
    v_all = tl.full([], 0, tl.int64)
    for chunk in range(0, n_sum_blocks, SUM_CHUNK):
        blocks = chunk + tl.arange(0, SUM_CHUNK)
        valid = blocks < n_sum_blocks
        w_sums = tl.load(sums_ptr + blocks, mask=valid, other=0)
        v_sums = tl.load(sums_ptr + sums_stride + blocks, mask=valid, other=0)
        before = blocks < pid
        w_before += tl.sum(tl.where(before, w_sums, 0), 0)
        v_before += tl.sum(tl.where(before, v_sums, 0), 0)
        w_all += tl.sum(w_sums, 0)
        v_all += tl.sum(v_sums, 0)
    single = n_sum_blocks == 0
    w_total = tl.where(single, tl.sum(wcount, 0), w_all)
    v_total = tl.where(single, tl.sum(vcount, 0), v_all)

    # write_offsets[r] for r < bs, the total at [bs], zeros up to [write_capacity].
    w_excl = w_before + tl.cumsum(wcount, 0) - wcount
    w_out = tl.where(in_batch, w_excl, tl.where(rows == bs, w_total, 0))
    tl.store(write_offsets_ptr + rows, w_out, mask=rows <= write_capacity)
    v_excl = v_before + tl.cumsum(vcount, 0) - vcount
    tl.store(verify_offsets_ptr + rows, tl.where(in_batch, v_excl, v_total), mask=rows <= bs)
    n_capacity_blocks = (write_capacity + BLOCK) // BLOCK
    for block in range(nprog + pid, n_capacity_blocks, nprog):
        tail = block * BLOCK + tl.arange(0, BLOCK)
        tl.store(write_offsets_ptr + tail, tl.zeros([BLOCK], tl.int64), mask=tail <= write_capacity)

    # Seeds: xlat(req_to_token[rp, P - 1]) for active rows that write after a prefix.
    rp_ok = (rp >= 0) & (rp < table_rows)
    wants_seed = active & (prefix > 0) & (wcount > 0)
    seed_pos = prefix - 1
    # A read that would leave the table is not made: the seed becomes slot 0, untranslated.
    seed_read = wants_seed & rp_ok & (seed_pos < table_cols)
    seed = tl.load(req_to_token_ptr + rp * table_cols + seed_pos, mask=seed_read, other=0)
    seed = seed.to(tl.int64)
    bits = any_bit(active & ~rp_ok, REQ_POOL_INDEX_BIT)
    bits |= any_bit(active & (prefix > table_cols), PREFIX_LEN_BIT)
    if HAS_LUT:
        seed, bad_slot = translate(seed, lut_ptr, lut_len, seed_read)
        bits |= any_bit(bad_slot, LUT_SLOT_BIT)
    tl.store(write_seed_ptr + rows, tl.where(wants_seed, seed, -1), mask=in_batch)
    if HAS_POOL:
        valid_len = tl.load(valid_lens_ptr + rows, mask=in_batch, other=0)
        bits |= any_bit(active & ((rp < 0) | (rp >= pool_rows)), POOL_ROW_BIT)
        bits |= any_bit(active & (valid_len > pool_cols), VALID_LEN_BIT)
    tl.atomic_or(status_ptr, bits, mask=bits != 0)

    # Counters, from the program that holds index bs.
    owns_counters = pid == bs // BLOCK
    overflow = v_total > verify_capacity
    tl.store(write_num_valid_reqs_ptr, bs, mask=owns_counters)
    tl.store(
        verify_num_valid_ptr,
        tl.where(overflow, verify_capacity, v_total).to(tl.int32),
        mask=owns_counters,
    )
    tl.store(verify_enable_ptr, tl.where(overflow, 0, 1).to(tl.int32), mask=owns_counters)

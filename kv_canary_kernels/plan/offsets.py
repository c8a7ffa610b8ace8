"""Offsets stage of the three-launch large-batch path (``bs >= SCAN_BLOCK``, captured or
from ``one_launch_max_rows`` rows): a two-level scan.

:func:`scan_block_sums_kernel` writes each block's (write, verify) sums into
``PlanBuffers.scan_block_sums``; each program of :func:`plan_offsets_kernel` then adds the
sums of the blocks before its own to a local scan and writes both prefix sums and, in the
program holding index ``bs``, the counters, and zeroes its share of the tail of
``write_offsets``. No memset, no torch op between the kernels. The seeds and the rows'
status bits need no scan: the entries kernel writes them, off this stage's critical path.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .common import load_rows, write_offsets_and_counters, zero_offsets_tail

# Every integer argument is a runtime value: a new bs, capacity or table shape must not
# recompile, and Triton would otherwise specialise values equal to 1 (and divisibility).
_SUMS_RUNTIME_INTS = ["bs", "window", "sums_stride", "verify_capacity"]


@triton.jit(do_not_specialize=_SUMS_RUNTIME_INTS)
def scan_block_sums_kernel(
    req_pool_indices_ptr,
    prefix_lens_ptr,
    extend_seq_lens_ptr,
    scan_block_sums_ptr,
    bs,
    window,
    sums_stride,
    verify_capacity,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
    VERIFY: tl.constexpr,
):
    """``sums[0, b]`` / ``sums[1, b]``: write / verify entries of the rows of block ``b``
    (counts clamped as ``load_rows`` does, so no sum can wrap); the write sums alone in a
    write-only plan (not ``VERIFY``)."""
    if USE_PDL:
        gdc_launch_dependents()  # let the offsets kernel start loading its rows now
    pid = tl.program_id(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    _in, _rp, _prefix, _active, vcount, wcount = load_rows(
        (req_pool_indices_ptr, prefix_lens_ptr, extend_seq_lens_ptr),
        rows,
        bs,
        window,
        verify_capacity,
    )
    tl.store(scan_block_sums_ptr + pid, tl.sum(wcount, 0))
    if VERIFY:
        tl.store(scan_block_sums_ptr + sums_stride + pid, tl.sum(vcount, 0))


_OFFSETS_RUNTIME_INTS = [
    "bs",
    "n_sum_blocks",
    "sums_stride",
    "write_capacity",
    "verify_capacity",
    "window",
]


@triton.jit
def write_row_hints(verify_row_hints_ptr, rows, v_excl, vcount, enabled, HINT_STRIDE: tl.constexpr):
    """``row_hints[h]`` = the row holding verify entry ``h * HINT_STRIDE``, for every such
    entry of ``rows`` (none when ``enabled`` is false: on overflow no entry exists).

    Row ``r`` holds entries ``[v_excl, v_excl + vcount)``, so the hints it owns are
    ``ceil(v_excl / S) .. ceil((v_excl + vcount) / S) - 1``: at most one for a row shorter
    than the stride, so the loop runs once or twice unless a row is much longer."""
    first = (v_excl + HINT_STRIDE - 1) // HINT_STRIDE
    n_hints = tl.where(enabled, (v_excl + vcount + HINT_STRIDE - 1) // HINT_STRIDE - first, 0)
    for k in range(tl.max(n_hints, 0)):
        tl.store(verify_row_hints_ptr + first + k, rows, mask=k < n_hints)


@triton.jit(do_not_specialize=_OFFSETS_RUNTIME_INTS)
def plan_offsets_kernel(
    # inputs
    req_pool_indices_ptr,
    prefix_lens_ptr,
    extend_seq_lens_ptr,
    scan_block_sums_ptr,
    # outputs
    write_offsets_ptr,
    write_num_valid_reqs_ptr,
    verify_offsets_ptr,
    verify_row_hints_ptr,
    verify_num_valid_ptr,
    verify_enable_ptr,
    status_ptr,
    # runtime sizes
    bs,
    n_sum_blocks,
    sums_stride,
    write_capacity,
    verify_capacity,
    window,
    BLOCK: tl.constexpr,
    SUM_CHUNK: tl.constexpr,
    HINT_STRIDE: tl.constexpr,
    USE_PDL: tl.constexpr,
    VERIFY: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    in_batch, _rp, _prefix, _active, vcount, wcount = load_rows(
        (req_pool_indices_ptr, prefix_lens_ptr, extend_seq_lens_ptr),
        rows,
        bs,
        window,
        verify_capacity,
    )
    if USE_PDL:
        # Launched early (programmatic dependent launch): the rows above are inputs, but
        # the block sums are the previous kernel's output.
        gdc_launch_dependents()
        gdc_wait()

    # Sums of the blocks before this one, and of all blocks.
    w_before = tl.full([], 0, tl.int64)
    v_before = tl.full([], 0, tl.int64)
    w_total = tl.full([], 0, tl.int64)
    v_total = tl.full([], 0, tl.int64)
    for chunk in range(0, n_sum_blocks, SUM_CHUNK):
        blocks = chunk + tl.arange(0, SUM_CHUNK)
        valid = blocks < n_sum_blocks
        w_sums = tl.load(scan_block_sums_ptr + blocks, mask=valid, other=0)
        if VERIFY:  # (a write-only plan scans the write counts alone)
            v_sums = tl.load(scan_block_sums_ptr + sums_stride + blocks, mask=valid, other=0)
        before = blocks < pid
        w_before += tl.sum(tl.where(before, w_sums, 0), 0)
        if VERIFY:
            v_before += tl.sum(tl.where(before, v_sums, 0), 0)
        w_total += tl.sum(w_sums, 0)
        if VERIFY:
            v_total += tl.sum(v_sums, 0)

    if VERIFY:
        v_excl = v_before + tl.cumsum(vcount, 0) - vcount
        tl.store(verify_offsets_ptr + rows, tl.where(in_batch, v_excl, v_total), mask=rows <= bs)
        write_row_hints(
            verify_row_hints_ptr,
            rows,
            v_excl,
            vcount,
            in_batch & (v_total <= verify_capacity),
            HINT_STRIDE,
        )
    write_offsets_and_counters(
        rows,
        in_batch,
        wcount,
        w_before,
        w_total,
        v_total,
        pid == bs // BLOCK,
        write_offsets_ptr,
        (write_num_valid_reqs_ptr, verify_num_valid_ptr, verify_enable_ptr, status_ptr),
        bs,
        write_capacity,
        verify_capacity,
        VERIFY,
    )
    zero_offsets_tail(write_offsets_ptr, bs, write_capacity, nprog + pid, nprog, BLOCK)

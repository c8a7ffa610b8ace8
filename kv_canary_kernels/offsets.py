"""Offsets stage of the large-batch path (``bs >= SCAN_BLOCK``): a one-pass scan.

Program ``b`` of :func:`plan_offsets_kernel` scans rows ``[b * BLOCK, (b + 1) * BLOCK)``:
it publishes its block's (write, verify) sums in ``PlanBuffers.scan_block_sums``, adds the
sums of the blocks before it as they appear (a look-back over published sums, so no
separate block-sums launch), and writes both prefix sums, the row hints of the entries
stage, its share of the zeroed tail of ``write_offsets`` and, in the program holding index
``bs``, the counters. No memset, no torch op between the kernels. The entries kernel
clears the published flags once it has read the offsets, ready for the next plan. The
seeds and the rows' status bits need no scan: the entries kernel writes them too, off
this stage's critical path.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from .common import load_rows, write_offsets_and_counters, zero_offsets_tail

# Every integer argument is a runtime value: a new bs, capacity or table shape must not
# recompile, and Triton would otherwise specialise values equal to 1 (and divisibility).
_OFFSETS_RUNTIME_INTS = [
    "bs", "sums_stride", "n_row_hints", "write_capacity", "verify_capacity", "window",
]


@triton.jit
def write_row_hints(
    row_hints_ptr, rows, v_excl, vcount, in_batch, n_row_hints, HINT_STRIDE: tl.constexpr
):
    """``row_hints[h]`` = the row holding verify entry ``h * HINT_STRIDE``, for every such
    entry of ``rows`` below ``n_row_hints * HINT_STRIDE`` (the verify capacity, rounded up;
    past it the plan overflows and no entry is written).

    Row ``r`` holds entries ``[v_excl, v_excl + vcount)``, so the hints it owns are
    ``ceil(v_excl / S) .. ceil((v_excl + vcount) / S) - 1``: at most one for a row shorter
    than the stride, so the loop runs once or twice unless a row is much longer."""
    first = (v_excl + HINT_STRIDE - 1) // HINT_STRIDE
    end = tl.minimum((v_excl + vcount + HINT_STRIDE - 1) // HINT_STRIDE, n_row_hints)
    n_hints = tl.where(in_batch, tl.maximum(end - first, 0), 0)
    for k in range(0, tl.max(n_hints, 0)):
        tl.store(row_hints_ptr + first + k, rows, mask=k < n_hints)


@triton.jit(do_not_specialize=_OFFSETS_RUNTIME_INTS)
def plan_offsets_kernel(
    # inputs
    req_pool_indices_ptr, prefix_lens_ptr, extend_seq_lens_ptr,
    # scratch: [0, b] / [1, b] write / verify entries of block b, [2, b] set once published
    sums_ptr,
    # outputs
    write_offsets_ptr, write_num_valid_reqs_ptr,
    verify_offsets_ptr, row_hints_ptr, verify_num_valid_ptr, verify_enable_ptr,
    # runtime sizes
    bs, sums_stride, n_row_hints, write_capacity, verify_capacity, window,
    BLOCK: tl.constexpr, SUM_CHUNK: tl.constexpr, HINT_STRIDE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    in_batch, _rp, _prefix, _active, vcount, wcount = load_rows(
        req_pool_indices_ptr, prefix_lens_ptr, extend_seq_lens_ptr, rows, bs, window
    )
    w_local = tl.sum(wcount, 0)
    v_local = tl.sum(vcount, 0)
    # Publish this block's sums, then its flag: the release orders the sums before it.
    flags_ptr = sums_ptr + 2 * sums_stride
    tl.store(sums_ptr + pid, w_local)
    tl.store(sums_ptr + sums_stride + pid, v_local)
    tl.debug_barrier()
    tl.atomic_xchg(flags_ptr + pid, 1, sem="release")
    if USE_PDL:
        gdc_launch_dependents()  # the entries kernel may start (its programs wait for us)

    # Look back: sum the blocks before this one as they publish. Blocks start in program
    # order (as CUB's scans also assume), so every block waited on is running or done.
    w_before = tl.full([], 0, tl.int64)
    v_before = tl.full([], 0, tl.int64)
    for chunk in range(0, pid, SUM_CHUNK):
        blocks = chunk + tl.arange(0, SUM_CHUNK)
        before = blocks < pid
        waiting = tl.full([], 1, tl.int32)
        while waiting > 0:  # spin until every block before this one has published
            ready = tl.atomic_add(flags_ptr + blocks, 0, mask=before, sem="acquire")
            waiting = tl.sum((before & (ready == 0)).to(tl.int32), 0)
        w_sums = tl.load(sums_ptr + blocks, mask=before, other=0, volatile=True)
        v_sums = tl.load(sums_ptr + sums_stride + blocks, mask=before, other=0, volatile=True)
        w_before += tl.sum(w_sums, 0)
        v_before += tl.sum(v_sums, 0)

    # Only the program holding index bs needs the totals, and it holds the last rows.
    v_total = v_before + v_local
    v_excl = v_before + tl.cumsum(vcount, 0) - vcount
    tl.store(verify_offsets_ptr + rows, tl.where(in_batch, v_excl, v_total), mask=rows <= bs)
    write_row_hints(row_hints_ptr, rows, v_excl, vcount, in_batch, n_row_hints, HINT_STRIDE)
    write_offsets_and_counters(
        rows, in_batch, wcount, w_before, w_before + w_local, v_total, pid == bs // BLOCK,
        write_offsets_ptr, write_num_valid_reqs_ptr, verify_num_valid_ptr, verify_enable_ptr,
        bs, write_capacity, verify_capacity,
    )
    zero_offsets_tail(write_offsets_ptr, write_capacity, nprog + pid, nprog, BLOCK)

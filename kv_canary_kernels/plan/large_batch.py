"""The large-batch path in one launch (eager, ``SCAN_BLOCK <= bs < one_launch_max_rows``):
scanners and workers.

The three-launch path spends three launches' host time (about 40 us on the H200's host)
on the scan's two grid-wide dependencies; here the programs of one launch wait for each
other on the device instead. Every program first takes a ticket (one relaxed atomic) and
its role from it, so a program only ever waits for programs holding lower tickets, which
are running or done: nothing can deadlock, whatever order the hardware starts programs in.

- Tickets ``0 .. n_scanners - 1``: scanner ``k`` loads rows ``[k * OFFSETS_BLOCK, (k + 1)
  * OFFSETS_BLOCK)`` (a short chunk: the scanners' registers are the whole kernel's, so a
  long one would cost the workers occupancy), publishes their (write, verify) sums and
  marks them, waits for the marks of the chunks before its own, then writes its chunk's
  offsets, row hints and, in the chunk holding index ``bs``, the counters, and counts
  itself in the written count (release).
- The other tickets are workers: they write the seeds and ``row_req_pool_indices`` (which
  need no scan) and zero the
  offsets' tail, wait until the written count reaches ``n_scanners`` (one word polled
  with scalar acquire loads, ``ld.acquire``; the scanners' waits on the marks are vector
  acquire atomics that add 0), then write the verify entries as the three-launch path's
  entries kernel does.

Every launch has a number of its own (``epoch``, from its buffers' ``Arena.launches`` on
the host: this path runs only outside CUDA graph capture, so the number is new at every
launch on these buffers, and a copy of the buffers starts again at 1 with its sync words
zeroed). A chunk's mark (``PlanBuffers.scan_chunk_sums[2]``) is the number of the launch
that published its sums, so a mark left by another launch is never taken for this one's
and the marks need no reset. The two counters (tickets taken, chunks written) come in
pairs in ``PlanBuffers.launch_sync``: launch ``e`` counts in ``[e % 2]`` and
``[2 + e % 2]``, and every program zeroes the other pair, which the next launch counts
in.

Two launches on the same buffers at once (two streams, no ordering) are a use error
whatever the path (both write the same outputs). Here nothing hangs and nothing leaves the
buffers: a wait gives up after ``MAX_POLLS`` polls (about a second on the H200), and a wait
that gave up or a ticket outside ``[0, grid)`` sets ``PlanStatus.PLAN_SYNC_LOST`` and turns
the plan's verify off. The bit is best effort: two launches that overlap without disturbing
each other's counters finish unflagged with a mixed plan, as they would on the three-launch
path. The launches after them are sound again within two launches (each zeroes the other
pair).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..constants import PLAN_SYNC_LOST_BIT
from .common import (
    load_rows,
    write_offsets_and_counters,
    write_seed_block,
    zero_offsets_tail,
)
from .entries import write_entry_blocks

_RUNTIME_INTS = [
    "epoch",
    "bs",
    "n_scanners",
    "sums_stride",
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

_WAIT_LANES: tl.constexpr = tl.constexpr(32)
"""Chunk sums a scanner polls at once."""


@triton.jit
def write_capped_row_hints(
    verify_row_hints_ptr, rows, v_excl, vcount, in_batch, verify_capacity, HINT_STRIDE: tl.constexpr
):
    """``row_hints[h]`` = the row holding verify entry ``h * HINT_STRIDE``, for the hints
    of ``rows`` below the capacity. A scanner does not know the batch's total (a later
    chunk may overflow), so it writes every hint that fits: on overflow no entry is written
    and the hints are never read."""
    n_slots = (verify_capacity + HINT_STRIDE - 1) // HINT_STRIDE
    # (Clamped at 0 for sums that are not this plan's: PLAN_SYNC_LOST.)
    first = tl.maximum((v_excl + HINT_STRIDE - 1) // HINT_STRIDE, 0)
    end = tl.minimum((v_excl + vcount + HINT_STRIDE - 1) // HINT_STRIDE, n_slots)
    n_hints = tl.where(in_batch & (first < n_slots), end - first, 0)
    for k in range(tl.max(n_hints, 0)):
        tl.store(verify_row_hints_ptr + first + k, rows, mask=k < n_hints)


@triton.jit
def wait_for_marks(marks_ptr, n, epoch, MAX_POLLS: tl.constexpr):
    """Wait until chunks ``0 .. n - 1`` are all marked with ``epoch`` (acquire: what their
    scanners wrote before marking is visible; Triton compiles a masked vector acquire
    that adds 0 to ``atom.acquire``, not to a load); whether they were before
    ``MAX_POLLS`` polls of each group of chunks. Only scanners wait here (few, on few
    words)."""
    ok = True
    for base in range(0, n, _WAIT_LANES):
        chunks = base + tl.arange(0, _WAIT_LANES)
        mask = chunks < n
        mark = tl.atomic_add(marks_ptr + chunks, 0, mask=mask, sem="acquire")
        missing = tl.sum((mask & (mark != epoch)).to(tl.int32), 0)
        polls = 1
        while (missing > 0) & (polls < MAX_POLLS):
            mark = tl.atomic_add(marks_ptr + chunks, 0, mask=mask, sem="acquire")
            missing = tl.sum((mask & (mark != epoch)).to(tl.int32), 0)
            polls += 1
        ok &= missing == 0
    return ok


@triton.jit
def poll_until(ptr, target, MAX_POLLS: tl.constexpr):
    """Whether the word at ``ptr`` reached ``target`` within ``MAX_POLLS`` polls (a scalar
    acquire that adds 0 compiles to ``ld.acquire``: a load, what was released before the
    word got there is visible)."""
    value = tl.atomic_add(ptr, 0, sem="acquire")
    polls = 1
    while (value < target) & (polls < MAX_POLLS):
        value = tl.atomic_add(ptr, 0, sem="acquire")
        polls += 1
    return value >= target


@triton.jit
def scan_chunk(
    chunk,
    epoch,
    written_ptr,
    row_inputs,
    write_offsets_ptr,
    counters,
    scan,
    scan_chunk_sums_ptr,
    sums_stride,
    bs,
    write_capacity,
    verify_capacity,
    window,
    CHUNK_ROWS: tl.constexpr,
    HINT_STRIDE: tl.constexpr,
    MAX_POLLS: tl.constexpr,
    VERIFY: tl.constexpr,
):
    """Scanner ``chunk``'s work (see the module's docstring); returns status bits.
    ``row_inputs`` as for :func:`~.common.load_rows`, ``counters`` as for
    :func:`~.common.write_offsets_and_counters`, ``scan`` as for
    :func:`~.entries.write_entry_blocks`. Without ``VERIFY`` (a write-only plan) only the
    write counts are scanned."""
    verify_offsets_ptr, verify_row_hints_ptr = scan
    marks_ptr = scan_chunk_sums_ptr + 2 * sums_stride
    rows = chunk * CHUNK_ROWS + tl.arange(0, CHUNK_ROWS)
    in_batch, _rp, _prefix, _active, vcount, wcount = load_rows(
        row_inputs,
        rows,
        bs,
        window,
        verify_capacity,
    )
    w_sum = tl.sum(wcount, 0)
    v_sum = tl.sum(vcount, 0)
    # No wrap: a chunk's counts are clamped (load_rows). Published, then marked (release):
    # whoever sees the mark sees the sums.
    tl.store(scan_chunk_sums_ptr + chunk, w_sum)
    if VERIFY:
        tl.store(scan_chunk_sums_ptr + sums_stride + chunk, v_sum)
    # A release covers the issuing thread's stores and those a CTA barrier ordered before
    # it: the barrier makes every thread's stores part of it, whatever the compiler emits.
    tl.debug_barrier()
    tl.atomic_xchg(marks_ptr + chunk, epoch, sem="release")
    published = wait_for_marks(marks_ptr, chunk, epoch, MAX_POLLS)
    bits = tl.where(published, 0, PLAN_SYNC_LOST_BIT)
    w_before = tl.full([], 0, tl.int64)
    v_before = tl.full([], 0, tl.int64)
    for base in range(0, chunk, CHUNK_ROWS):
        before = base + tl.arange(0, CHUNK_ROWS)
        w_before += tl.sum(tl.load(scan_chunk_sums_ptr + before, mask=before < chunk, other=0), 0)
        if VERIFY:
            v_before += tl.sum(
                tl.load(scan_chunk_sums_ptr + sums_stride + before, mask=before < chunk, other=0),
                0,
            )
    # The batch's totals in the chunk that holds index bs, the only one that reads them.
    w_total = w_before + w_sum
    v_total = v_before + v_sum
    if VERIFY:
        v_excl = v_before + tl.cumsum(vcount, 0) - vcount
        tl.store(verify_offsets_ptr + rows, tl.where(in_batch, v_excl, v_total), mask=rows <= bs)
        write_capped_row_hints(
            verify_row_hints_ptr, rows, v_excl, vcount, in_batch, verify_capacity, HINT_STRIDE
        )
    write_offsets_and_counters(
        rows,
        in_batch,
        wcount,
        w_before,
        w_total,
        v_total,
        bs // CHUNK_ROWS == chunk,
        write_offsets_ptr,
        counters,
        bs,
        write_capacity,
        verify_capacity,
        VERIFY,
    )
    # Counted in (release, after a barrier: see above): this chunk's stores are visible
    # to whoever sees the count.
    tl.debug_barrier()
    tl.atomic_add(written_ptr, 1, sem="release")
    return bits


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def plan_large_batch_kernel(
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
    # scratch
    verify_offsets_ptr,
    verify_row_hints_ptr,
    launch_sync_ptr,
    scan_chunk_sums_ptr,
    # runtime sizes
    epoch: tl.int64,
    bs,
    n_scanners,
    sums_stride,
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
    BLOCK: tl.constexpr,
    CHUNK_ROWS: tl.constexpr,
    ROW_WINDOW: tl.constexpr,
    HINT_STRIDE: tl.constexpr,
    MAX_POLLS: tl.constexpr,
    VERIFY: tl.constexpr,
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
    scan = (verify_offsets_ptr, verify_row_hints_ptr)
    tl.static_assert(BLOCK % HINT_STRIDE == 0)  # every block starts at a hinted entry
    grid = tl.num_programs(0)
    # This launch's pair of counters, and the next launch's, which this one zeroes (the
    # previous launch, which used them, is done).
    ticket = tl.atomic_add(launch_sync_ptr + epoch % 2, 1, sem="relaxed")
    written_ptr = launch_sync_ptr + 2 + epoch % 2
    tl.store(launch_sync_ptr + (epoch + 1) % 2, 0)
    tl.store(launch_sync_ptr + 2 + (epoch + 1) % 2, 0)
    # A counter that was not 0 at the start (another launch of these buffers ran at the
    # same time) gives some program a ticket outside [0, grid): some share of the work then
    # has no owner, so the launch says so.
    bits = tl.where((ticket < 0) | (ticket >= grid), PLAN_SYNC_LOST_BIT, 0)
    if (ticket >= 0) & (ticket < n_scanners):
        bits |= scan_chunk(
            ticket,
            epoch,
            written_ptr,
            row_inputs,
            write_offsets_ptr,
            (write_num_valid_reqs_ptr, verify_num_valid_ptr, verify_enable_ptr, status_ptr),
            scan,
            scan_chunk_sums_ptr,
            sums_stride,
            bs,
            write_capacity,
            verify_capacity,
            window,
            CHUNK_ROWS,
            HINT_STRIDE,
            MAX_POLLS,
            VERIFY,
        )
    else:
        workers = grid - n_scanners
        # (A ticket outside [0, grid): worker 0's share again, in bounds.)
        worker = tl.where((ticket >= n_scanners) & (ticket < grid), ticket - n_scanners, 0)
        # Work that needs no scan, done while the scanners run: the seeds and their
        # status bits, and the offsets' tail (the last scanner zeroes the same indices up
        # to its chunk's end: same values).
        for first in range(worker * BLOCK, bs, workers * BLOCK):
            rows = first + tl.arange(0, BLOCK)
            bits |= write_seed_block(
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
        zero_offsets_tail(
            write_offsets_ptr, bs, write_capacity, (bs + 1) // BLOCK + worker, workers, BLOCK
        )
        # A write-only plan has no entry: its workers wait for nothing.
        if VERIFY:
            if poll_until(written_ptr, n_scanners, MAX_POLLS):
                enabled = tl.load(verify_enable_ptr) != 0
                total = tl.where(enabled, tl.load(verify_num_valid_ptr), 0)
                bits |= write_entry_blocks(
                    worker * BLOCK,
                    workers * BLOCK,
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
                    HAS_LUT,
                    HAS_POOL,
                    BLOCK,
                    ROW_WINDOW,
                    HINT_STRIDE,
                    TABLE,
                )
            else:
                bits |= PLAN_SYNC_LOST_BIT
    if bits & PLAN_SYNC_LOST_BIT:
        # The plan is unspecified: turn its verify off (best effort: a scanner of this
        # launch may still write the counters after this store).
        tl.store(verify_enable_ptr, 0)
    tl.atomic_or(status_ptr, bits, mask=bits != 0, sem="relaxed")

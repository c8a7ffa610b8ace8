"""The write stage: ``canary_write_kernel`` and ``launch_write``, the only door to it.

Rows run in parallel, one lane each (``LaunchConfig.write_rows`` rows a program); within a
row the chain is serial by definition, so each lane walks its row's tokens in order. The
loads of a token do not depend on the chain, so they are issued two tokens ahead (carried
in registers): a token's critical path is the hash itself, not a memory round trip.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.compiler import is_compiling

from kv_canary_buffers.buffers import PlanBuffers
from kv_canary_buffers.real_kv import RealKV
from kv_canary_buffers.store import CanaryStore
from kv_canary_buffers.validation import WriteArgs, validate_write_args

from . import compiled, config
from .canary_common import append_violations, i64, mix3, raise_status, real_kv_or_zero
from .constants import (
    ANCHOR,
    NO_SLOT,
    PLAN_COUNT_BAD,
    REC_POSITION,
    REC_PREV_HASH,
    REC_REAL_KV,
    REC_TOKEN,
    REC_W,
    SEED_BAD,
    WRITE_INDEX_BAD,
    WRITE_POSITION_BIT,
    WRITE_SLOT_BAD,
    WRITE_TOKEN_BIT,
)
from .launcher import (
    FastPath,
    Launcher,
    addresses,
    cdiv,
    current_device,
    stage_key,
    stream_of,
)
from .sources import source_args

_RUNTIME_INTS = [
    "n",
    "write_capacity",
    "num_slots",
    "violation_capacity",
    "launch_tag",
    "page_size",
    "bpt_words",
    "kv_words",
    "stride0",
    "stride1",
    "stride2",
    "stride3",
    "rows0",
    "rows1",
    "rows2",
    "rows3",
]


@triton.jit
def _load_token(
    ocl_ptr, ids_ptr, pos_ptr, exp_ids_ptr, exp_pos_ptr, index, mask, HAS_EXPECTED: tl.constexpr
):
    slot = tl.load(ocl_ptr + index, mask=mask, other=NO_SLOT)
    token = tl.load(ids_ptr + index, mask=mask, other=0)
    position = tl.load(pos_ptr + index, mask=mask, other=0)
    if HAS_EXPECTED:
        exp_token = tl.load(exp_ids_ptr + index, mask=mask, other=0)
        exp_position = tl.load(exp_pos_ptr + index, mask=mask, other=0)
    else:
        exp_token = token
        exp_position = position
    return slot, token, position, exp_token, exp_position


@triton.jit
def _walk_rows(
    ids_ptr, pos_ptr, ocl_ptr, exp_ids_ptr, exp_pos_ptr, records_ptr, violations_ptr,
    count_ptr, first, length, running, check_pos, prev_pos, flags, num_slots,
    violation_capacity, launch_tag, page_size, bpt_words, kv_words,
    src0, src1, src2, src3, stride0, stride1, stride2, stride3,
    rows0, rows1, rows2, rows3,
    HAS_EXPECTED: tl.constexpr, NUM_SOURCES: tl.constexpr, MODE: tl.constexpr,
    CHUNK: tl.constexpr, APPEND: tl.constexpr,
):  # fmt: skip
    """Each lane walks its row's ``length`` tokens in order, from ``first``.

    ``APPEND`` False: stamp the records; return the status flags, the records written per
    lane and the lanes that met a token failing a write check. ``APPEND`` True (only when
    some lane did): the same walk again, from the same seed state, stamping nothing and
    appending those tokens' violation rows (the KV bytes' hash, stored nowhere there, is
    dead code to the compiler: the replay reads only what its row check needs). The
    appends (an atomic and a branch a token) stay out of the first walk, whose unrolled
    loop is then the chain, the loads and the stores (alone, the split measured neither
    faster nor slower on the H200).
    """
    suspect = tl.zeros_like(length) != 0
    # The first walk's position check needs only whether a lane fails it somewhere: it
    # compares each checked token with one counter, the seed's position + 1 (where the
    # check is on: every ok token is then checked) advanced by each ok token, which
    # agrees with the contract's rule ("the previous checked position + 1") up to the
    # lane's first failure; the replay appends by the rule.
    # The counter's advance is the lane's records written. (Against a tracked previous
    # position and a count of its own, measured on the H200: 10% less time a token.)
    expect = prev_pos + 1
    expect0 = expect
    # Two tokens in flight ahead of the one being hashed: their loads complete while the
    # chain hashes, off its critical path (four ahead, unrolled by 5, measured slower on
    # the H200).
    s0, t0, p0, et0, ep0 = _load_token(
        ocl_ptr, ids_ptr, pos_ptr, exp_ids_ptr, exp_pos_ptr, first, length > 0, HAS_EXPECTED
    )
    s1, t1, p1, et1, ep1 = _load_token(
        ocl_ptr, ids_ptr, pos_ptr, exp_ids_ptr, exp_pos_ptr, first + 1, length > 1, HAS_EXPECTED
    )
    # Unrolled, the rotation below is register renaming: rolled, it is a copy of each
    # token in flight, which waits for that token's loads at the end of the iteration that
    # issued them (measured on the H200: 11% more time a token). By 3, one of a body's
    # loads is hashed in the same body; with expected inputs (five loads a token) ptxas
    # then moves a test of it up next to its load, and the warp waits a round trip to L2
    # (+18%): by 2, every token a body loads is hashed in the next one. Without them, 3
    # measured faster than 2 (4%). Not unrolled with real-KV sources, whose loads and
    # hashes dominate a token (and the compile time, tenfold), nor in the replay, which
    # runs only on a violation.
    UNROLL: tl.constexpr = 1 if NUM_SOURCES > 0 or APPEND else (2 if HAS_EXPECTED else 3)
    for step in tl.range(0, tl.max(length, 0), loop_unroll_factor=UNROLL):
        s2, t2, p2, et2, ep2 = _load_token(
            ocl_ptr,
            ids_ptr,
            pos_ptr,
            exp_ids_ptr,
            exp_pos_ptr,
            first + step + 2,
            length > step + 2,
            HAS_EXPECTED,
        )
        # ``step < length`` repeats what the masked loads say (NO_SLOT past the row's end),
        # but without it ptxas scheduled the loop 14% slower on the H200.
        live = (step < length) & (s0 >= 0)
        slot_bad = live & (s0 >= num_slots)
        flags |= tl.where(slot_bad, WRITE_SLOT_BAD, 0)
        ok = live & ~slot_bad
        kv, ok, flags = real_kv_or_zero(
            s0, ok, flags, page_size, bpt_words, kv_words,
            src0, src1, src2, src3, stride0, stride1, stride2, stride3,
            rows0, rows1, rows2, rows3, NUM_SOURCES, MODE, CHUNK,
        )  # fmt: skip
        # The chain first: everything below is off its critical path.
        chain = i64(running)
        running = tl.where(ok, mix3(running, t0, p0, LATENCY=True), running)
        if HAS_EXPECTED:
            bits = tl.where(t0 != et0, WRITE_TOKEN_BIT, 0) | tl.where(
                p0 != ep0, WRITE_POSITION_BIT, 0
            )
        else:
            bits = tl.zeros_like(flags)
        checked = ok & check_pos
        if APPEND:
            want = prev_pos + 1
            if HAS_EXPECTED:
                append_violations(
                    ok & (bits != 0),
                    launch_tag,
                    s0,
                    p0,
                    t0,
                    et0,
                    chain,
                    ep0,
                    bits,
                    violations_ptr,
                    count_ptr,
                    violation_capacity,
                )
            append_violations(
                checked & (p0 != want),
                launch_tag,
                s0,
                p0,
                t0,
                t0,
                chain,
                want,
                tl.full(flags.shape, WRITE_POSITION_BIT, tl.int32),
                violations_ptr,
                count_ptr,
                violation_capacity,
            )
            prev_pos = tl.where(checked, p0, prev_pos)
        else:
            # Four 8-byte stores: a [ROWS, 4] tile would cost a layout change through
            # shared memory at every token (measured on the H200: +70 ns a token).
            rec = records_ptr + s0 * REC_W
            tl.store(rec + REC_TOKEN, t0, mask=ok)
            tl.store(rec + REC_POSITION, p0, mask=ok)
            tl.store(rec + REC_PREV_HASH, chain, mask=ok)
            tl.store(rec + REC_REAL_KV, kv, mask=ok)
            suspect |= (ok & (bits != 0)) | (checked & (p0 != expect))
            expect += ok.to(tl.int64)
        s0, t0, p0, et0, ep0 = s1, t1, p1, et1, ep1
        s1, t1, p1, et1, ep1 = s2, t2, p2, et2, ep2
    return flags, expect - expect0, suspect


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def canary_write_kernel(
    # the step's inputs
    ids_ptr,
    pos_ptr,
    ocl_ptr,
    exp_ids_ptr,
    exp_pos_ptr,
    # the plan
    write_offsets_ptr,
    seeds_ptr,
    num_rows_ptr,
    # the store
    records_ptr,
    violations_ptr,
    count_ptr,
    runs_ptr,
    processed_ptr,
    check_ptr,
    status_ptr,
    # real-KV sources
    src0,
    src1,
    src2,
    src3,
    stride0: tl.int64,
    stride1: tl.int64,
    stride2: tl.int64,
    stride3: tl.int64,
    rows0: tl.int64,
    rows1: tl.int64,
    rows2: tl.int64,
    rows3: tl.int64,
    # runtime sizes (int64 whatever their values: one compiled variant for all)
    n: tl.int64,
    write_capacity: tl.int64,
    num_slots: tl.int64,
    violation_capacity: tl.int64,
    launch_tag: tl.int64,
    page_size: tl.int64,
    bpt_words: tl.int64,
    kv_words: tl.int64,
    HAS_EXPECTED: tl.constexpr,
    NUM_SOURCES: tl.constexpr,
    MODE: tl.constexpr,
    ROWS: tl.constexpr,
    CHUNK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid == 0:
        tl.atomic_add(runs_ptr, 1, sem="relaxed")  # relaxed: see append_violations
    num_rows = tl.load(num_rows_ptr).to(tl.int64)
    lanes = tl.arange(0, ROWS)
    flags = tl.where(
        (lanes == 0) & (pid == 0) & ((num_rows < 0) | (num_rows > write_capacity)),
        PLAN_COUNT_BAD,
        0,
    )
    num_rows = tl.minimum(tl.maximum(num_rows, 0), write_capacity)
    rows = pid * ROWS + lanes
    in_rows = rows < num_rows
    # Offsets and seeds are loaded for every row of the buffers (capacity + 1 offsets and
    # capacity seeds, in bounds by construction) without waiting for the row count: one
    # round trip fewer before a decode row's hash. Rows past the count ignore them.
    in_buffers = rows < write_capacity
    lo = tl.load(write_offsets_ptr + rows, mask=in_buffers, other=0)
    hi = tl.load(write_offsets_ptr + rows + 1, mask=in_buffers, other=0)
    busy = in_rows & (hi > lo)
    flags |= tl.where(busy & ((lo < 0) | (hi > n)), WRITE_INDEX_BAD, 0)
    # Clamped into [0, n] before subtracting: no wrap for any int64 offsets.
    first = tl.minimum(tl.maximum(lo, 0), n)
    length = tl.maximum(tl.minimum(tl.maximum(hi, 0), n) - first, 0)
    # The seed and its record are loaded without waiting for the offsets (a row that
    # turns out idle ignores them): two round trips side by side instead of in a row.
    seed = tl.load(seeds_ptr + rows, mask=in_buffers, other=NO_SLOT)
    seed_in_range = in_buffers & (seed >= 0) & (seed < num_slots)
    seed_rec = records_ptr + seed * REC_W
    seed_token = tl.load(seed_rec + REC_TOKEN, mask=seed_in_range, other=0)
    seed_position = tl.load(seed_rec + REC_POSITION, mask=seed_in_range, other=0)
    seed_prev = tl.load(seed_rec + REC_PREV_HASH, mask=seed_in_range, other=0)
    seed_bad = busy & (seed >= num_slots)
    flags |= tl.where(seed_bad, SEED_BAD, 0)
    length = tl.where(busy & ~seed_bad, length, 0)
    has_seed = (length > 0) & (seed >= 0)
    running = tl.where(
        has_seed,
        mix3(seed_prev.to(tl.uint64, bitcast=True), seed_token, seed_position),
        tl.full([ROWS], ANCHOR, tl.uint64),
    )
    # The flag loaded per lane (one word, broadcast): a scalar bool combined with a lane
    # vector comes out as int32 in Triton 3.9's interpreter, and a mask must be bool.
    check_pos = has_seed & (tl.load(check_ptr + tl.zeros_like(rows)) != 0)
    prev_pos = tl.where(check_pos, seed_position, 0)
    flags, written, suspect = _walk_rows(
        ids_ptr, pos_ptr, ocl_ptr, exp_ids_ptr, exp_pos_ptr, records_ptr, violations_ptr,
        count_ptr, first, length, running, check_pos, prev_pos, flags, num_slots,
        violation_capacity, launch_tag, page_size, bpt_words, kv_words,
        src0, src1, src2, src3, stride0, stride1, stride2, stride3,
        rows0, rows1, rows2, rows3, HAS_EXPECTED, NUM_SOURCES, MODE, CHUNK, False,
    )  # fmt: skip
    if tl.max(suspect.to(tl.int32), 0) != 0:
        # Rare (an engine bug): the rows again, for their violation rows only.
        _walk_rows(
            ids_ptr, pos_ptr, ocl_ptr, exp_ids_ptr, exp_pos_ptr, records_ptr, violations_ptr,
            count_ptr, first, tl.where(suspect, length, 0), running, check_pos, prev_pos,
            flags, num_slots, violation_capacity, launch_tag, page_size, bpt_words, kv_words,
            src0, src1, src2, src3, stride0, stride1, stride2, stride3,
            rows0, rows1, rows2, rows3, HAS_EXPECTED, NUM_SOURCES, MODE, CHUNK, True,
        )  # fmt: skip
    total = tl.sum(written, 0)
    if total > 0:
        tl.atomic_add(processed_ptr, total, sem="relaxed")
    raise_status(status_ptr, flags)


def dispatch_write(store: CanaryStore, buffers: PlanBuffers, args: WriteArgs) -> None:
    """Launch the write kernel on validated arguments (no check at all)."""
    variant, cfg = config.active
    has_expected = args.expected_input_ids is not None
    # The plan's, the store's and the sources' tensors are 16-byte aligned by
    # construction; only the caller's inputs may not be (their addresses, in the
    # kernel's order, as the validation read them).
    aligned = True if args.aligned else tuple(p % 16 == 0 for p in args.addresses)
    # Only the inputs (their addresses, read by the validation), their count and the tag
    # change from call to call (launcher.FastPath); the validation re-proved the fixed
    # addresses.
    fast_key = stage_key(store, buffers, args.real_kv, variant, has_expected, aligned)
    if fast_key is not None:
        fast = _FAST.get(fast_key)
        if fast is not None:
            index, programs, go, fixed, sizes, tail = fast
            if index == current_device():
                go(
                    programs, stream_of(index), *args.addresses, *fixed, args.n, *sizes,
                    args.launch_tag, *tail,
                )  # fmt: skip
                return
    # (validation: both expected tensors are given, or neither)
    exp_ids = args.input_ids if args.expected_input_ids is None else args.expected_input_ids
    exp_pos = args.positions if args.expected_positions is None else args.expected_positions
    inputs = (args.input_ids, args.positions, args.out_cache_loc, exp_ids, exp_pos)
    src = source_args(args.real_kv, store.records)
    key = (variant, has_expected, src.num_sources, src.mode, src.dtypes, aligned)
    fixed = (
        buffers.write_offsets,
        buffers.write_seed_slot_indices,
        buffers.write_num_valid_reqs,
        store.records,
        store.violations,
        store.violation_count,
        store.kernel_runs,
        store.slots_processed,
        store.chain_position_check,
        store.status,
        *src.tensors,
        *src.ints,
    )
    sizes = (buffers.write_req_capacity, store.num_slots, store.violation_capacity)
    tail = (src.page_size, src.bpt_words, src.kv_words)
    programs = cdiv(buffers.write_req_capacity, cfg.write_rows)
    go = _WRITE.launch(
        store.device,
        (programs, 1, 1),
        key,
        (*inputs, *fixed, args.n, *sizes, args.launch_tag, *tail),
        {
            "HAS_EXPECTED": has_expected,
            "NUM_SOURCES": src.num_sources,
            "MODE": src.mode,
            "ROWS": cfg.write_rows,
            "CHUNK": cfg.real_kv_chunk,
        },
        {"num_warps": cfg.write_warps},
    )
    if go is not None and fast_key is not None:
        _FAST.remember(fast_key, (store.device.index, programs, go, addresses(fixed), sizes, tail))


_FAST = FastPath()
_WRITE = Launcher(canary_write_kernel)


def launch_write(
    store: CanaryStore,
    plan_buffers: PlanBuffers,
    *,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
    launch_tag: int = 0,
    expected_input_ids: torch.Tensor | None = None,
    expected_positions: torch.Tensor | None = None,
    real_kv: RealKV | None = None,
) -> None:
    """Stamp the records of the slots a step wrote, on the GPU, byte for byte equal to
    :func:`kv_canary_buffers.write_reference` (same arguments, shapes and dtypes; violation
    rows of one call in unspecified order).

    Runs the shared validation first (a rejected call writes nothing), then one kernel
    launch on the current stream. Never allocates, never syncs, never recompiles for a new
    ``n`` or capacity, and is safe to capture in a CUDA graph. Data outside the store or
    the inputs is skipped with a :class:`CanaryStatus` bit in ``store.status``.
    """
    if is_compiling() and compiled.write(  # traced by torch.compile: one custom operator
        store,
        plan_buffers,
        input_ids=input_ids,
        positions=positions,
        out_cache_loc=out_cache_loc,
        launch_tag=launch_tag,
        expected_input_ids=expected_input_ids,
        expected_positions=expected_positions,
        real_kv=real_kv,
    ):
        return
    args = validate_write_args(
        store,
        plan_buffers,
        input_ids=input_ids,
        positions=positions,
        out_cache_loc=out_cache_loc,
        launch_tag=launch_tag,
        expected_input_ids=expected_input_ids,
        expected_positions=expected_positions,
        real_kv=real_kv,
    )
    dispatch_write(store, plan_buffers, args)

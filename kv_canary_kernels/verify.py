"""The verify stage: ``canary_verify_kernel`` and ``launch_verify``, the only door to it.

Entry-parallel: each lane checks one plan entry against its slot's record. A
predecessor is almost always the previous entry's slot, whose record the lane to the left
already loaded and hashed, so a lane takes its expected chain hash from that lane (a
``tl.gather`` within each warp's 32 lanes) and loads the predecessor's record only when it
is another slot (a row's first entry, or a warp's first lane), in the same gather as its
own. A persistent grid of one wave (no more programs than the multiprocessors hold at
once) walks blocks below ``verify_num_valid``, read on the device: no sync, and no grid
that depends on data.

A failing entry (rare: an engine bug) also names its request: one reduction per block
guards the violation rows, and only a block with one finds each failing entry's plan row by
bisection over ``verify_offsets`` and reads its ``row_req_pool_indices`` and the slot's
``owners`` (the context beside the ring row). A clean block reads none of them.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kv_canary_buffers.buffers import PlanBuffers
from kv_canary_buffers.store import CanaryStore
from kv_canary_buffers.verify import VerifyArgs

from . import config
from .config import device_config
from .constants import (
    ANCHOR,
    CHAIN_BIT,
    DUMMY_SLOT,
    PLAN_COUNT_BAD,
    POSITION_BIT,
    PREV_SLOT_BAD,
    REAL_KV_BIT,
    REC_POSITION,
    REC_PREV_HASH,
    REC_REAL_KV,
    REC_TOKEN,
    REC_W,
    UNCHECKED_TOKEN,
    VERIFY_SLOT_BAD,
    VERIFY_TOKEN_BIT,
)
from .fast_launch import (
    FastPath,
    Launcher,
    addresses,
    cdiv,
    check_views,
    current_device,
    stage_key,
    stream_of,
)
from .records import append_violations, i64, mix3, raise_status, real_kv_or_zero
from .sources import source_args

_RUNTIME_INTS = [
    "num_slots",
    "verify_capacity",
    "write_capacity",
    "search_steps",
    "violation_capacity",
    "launch_tag",
    "num_sources",
]


@triton.jit
def from_left_lane(x, BLOCK: tl.constexpr):
    """``x`` of the lane to the left, within each group of 32 lanes (one warp: shuffles, no
    shared memory); a group's first lane gets its own value back."""
    groups: tl.constexpr = BLOCK // 32
    left = tl.broadcast_to(tl.maximum(tl.arange(0, 32) - 1, 0)[None, :], [groups, 32])
    return tl.reshape(tl.gather(tl.reshape(x, [groups, 32]), left, 1), [BLOCK])


@triton.jit
def load_records(records_ptr, slots, mask):
    """Token, position, prev hash and real-KV hash of the records of ``slots`` (``[BLOCK,
    2]``: each lane's slot and predecessor; zeros where not ``mask``): two 16-byte loads a
    record, each split into its two columns in registers."""
    tl.static_assert((REC_POSITION == REC_TOKEN + 1) & (REC_REAL_KV == REC_PREV_HASH + 1))
    pair = tl.arange(0, 2)[None, None, :]
    base = records_ptr + slots[:, :, None] * REC_W + pair
    token, position = tl.split(tl.load(base + REC_TOKEN, mask=mask[:, :, None], other=0))
    prev_hash, real_kv = tl.split(tl.load(base + REC_PREV_HASH, mask=mask[:, :, None], other=0))
    return token, position, prev_hash, real_kv


@triton.jit
def request_of(entry, hit, rows_ptrs, num_rows, search_steps):
    """The contract's ``request_of(entry)`` of each lane in ``hit``: its plan row by
    bisection over ``verify_offsets[0 .. num_rows)`` (the last row ``r`` with
    ``verify_offsets[r] <= entry``; ``search_steps`` rounds, enough for any ``num_rows`` up
    to the write capacity), that row's ``row_req_pool_indices`` value; 0 where ``num_rows``
    is 0. Every index read lies in ``[0, num_rows)``. ``rows_ptrs``: ``(verify_offsets_ptr,
    row_req_pool_indices_ptr)``."""
    verify_offsets_ptr, row_req_pool_indices_ptr = rows_ptrs
    lo = tl.zeros_like(entry)
    hi = lo + num_rows
    for _ in range(search_steps):
        active = hit & (hi - lo > 1)
        mid = (lo + hi) >> 1  # lo < mid < hi where active
        right = tl.load(verify_offsets_ptr + mid, mask=active, other=0) <= entry
        lo = tl.where(active & right, mid, lo)
        hi = tl.where(active & ~right, mid, hi)
    return tl.load(row_req_pool_indices_ptr + lo, mask=hit & (num_rows > 0), other=0)


@triton.jit
def _check_block(
    start, n, flags, plan, records_ptr, kv, num_slots,
    CHECK_TOKENS: tl.constexpr, MODE: tl.constexpr,
    BLOCK: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Check the entries ``start + [0, BLOCK)`` below ``n``: returns the lanes whose entry
    fails (``hit``), its ring row's columns after the tag, its expected position and
    ``flags`` with the entries' status bits. ``plan``: ``(verify_slot_indices_ptr,
    verify_expected_tokens_ptr, verify_expected_positions_ptr,
    verify_prev_slot_indices_ptr)``; ``kv`` the real-KV geometry
    (``records.real_kv_hash``)."""
    (
        verify_slot_indices_ptr,
        verify_expected_tokens_ptr,
        verify_expected_positions_ptr,
        verify_prev_slot_indices_ptr,
    ) = plan
    lanes = tl.arange(0, BLOCK)
    entry = start + lanes
    # Every load of the entry columns is masked by the count only, so that all four
    # leave in the first round trip (a mask that waited for the slot would add one).
    in_range = entry < n
    slot = tl.load(verify_slot_indices_ptr + entry, mask=in_range, other=DUMMY_SLOT)
    prev = tl.load(verify_prev_slot_indices_ptr + entry, mask=in_range, other=DUMMY_SLOT)
    want_position = tl.load(verify_expected_positions_ptr + entry, mask=in_range, other=0)
    if CHECK_TOKENS:
        want_token = tl.load(
            verify_expected_tokens_ptr + entry, mask=in_range, other=UNCHECKED_TOKEN
        )
    else:
        want_token = tl.full([BLOCK], UNCHECKED_TOKEN, tl.int64)
    looked = in_range & (slot != DUMMY_SLOT)
    slot_bad = looked & ((slot < 0) | (slot >= num_slots))
    prev_bad = looked & ~slot_bad & (prev >= num_slots)
    ok = looked & ~slot_bad & ~prev_bad
    flags |= tl.where(slot_bad, VERIFY_SLOT_BAD, 0) | tl.where(prev_bad, PREV_SLOT_BAD, 0)
    # The predecessor's hash comes from the lane to the left where that lane holds the
    # predecessor's slot (its record is read below in any case); other lanes read the
    # predecessor's record beside their own. `ok` here is before the real-KV row
    # check: a lane dropped for its KV row still has an in-range slot whose record is
    # read, so its hash is exactly hash_of(prev) for the lane to its right.
    from_left = (
        (lanes % 32 != 0)
        & (from_left_lane(ok.to(tl.int32), BLOCK) != 0)
        & (from_left_lane(slot, BLOCK) == prev)
    )
    load_prev = ok & (prev > 0) & ~from_left
    # Both records as one [BLOCK, 2] gather, hashed below as one [BLOCK, 2] chain, and
    # before the KV bytes: ptxas moves each load down to just before its first use, so
    # records first used after the KV hash would be read only after the KV bytes came
    # back. Here the records' and the KV bytes' loads share one round trip (SASS for
    # sm_90: every load of an entry issued before its first hash).
    token2, position2, prev2, kv2 = load_records(
        records_ptr, tl.join(slot, prev), tl.join(ok, load_prev)
    )
    r_token, _ = tl.split(token2)
    r_position, _ = tl.split(position2)
    r_prev, _ = tl.split(prev2)
    r_kv, _ = tl.split(kv2)
    kv_hash, ok, flags = real_kv_or_zero(slot, ok, flags, kv, MODE, CHUNK)
    # hash_of(slot) and hash_of(prev) of every lane; the lane to the right may need
    # the first as its predecessor's.
    own, loaded = tl.split(i64(mix3(prev2.to(tl.uint64, bitcast=True), token2, position2)))
    chain = tl.where(from_left, from_left_lane(own, BLOCK), loaded)
    chain = tl.where(prev < 0, i64(tl.full([BLOCK], ANCHOR, tl.uint64)), chain)
    reachable = prev != DUMMY_SLOT
    expected_chain = tl.where(reachable, chain, r_prev)
    bits = (
        tl.where(reachable & (r_prev != expected_chain), CHAIN_BIT, 0)
        | tl.where(r_position != want_position, POSITION_BIT, 0)
        | tl.where(r_kv != kv_hash, REAL_KV_BIT, 0)
        | tl.where((want_token != UNCHECKED_TOKEN) & (r_token != want_token), VERIFY_TOKEN_BIT, 0)
    )
    hit = ok & (bits != 0)
    columns = (slot, r_position, r_token, want_token, r_prev, expected_chain, bits)
    return hit, entry, columns, want_position, flags


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def canary_verify_kernel(
    # the plan
    verify_slot_indices_ptr,
    verify_expected_tokens_ptr,
    verify_expected_positions_ptr,
    verify_prev_slot_indices_ptr,
    verify_num_valid_ptr,
    verify_enable_ptr,
    write_num_valid_reqs_ptr,
    verify_offsets_ptr,
    row_req_pool_indices_ptr,
    # the store
    records_ptr,
    violations_ptr,
    violation_count_ptr,
    kernel_runs_ptr,
    slots_processed_ptr,
    status_ptr,
    owners_ptr,
    violation_context_ptr,
    verify_skipped_ptr,
    # real-KV sources (a RealKV's source table)
    source_table_ptr,
    # runtime sizes (int64 whatever their values: one compiled variant for all)
    num_slots: tl.int64,
    verify_capacity: tl.int64,
    write_capacity: tl.int64,
    search_steps: tl.int64,
    violation_capacity: tl.int64,
    launch_tag: tl.int64,
    num_sources: tl.int64,
    CHECK_TOKENS: tl.constexpr,
    MODE: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
):
    # The store's ring and the real-KV geometry, as the shared helpers take them (records.py)
    store = (
        records_ptr,
        violations_ptr,
        violation_count_ptr,
        violation_capacity,
        owners_ptr,
        violation_context_ptr,
    )
    kv = (source_table_ptr, num_sources)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    enable = tl.load(verify_enable_ptr)
    enabled = enable != 0
    num_valid = tl.load(verify_num_valid_ptr).to(tl.int64)
    count_bad = enabled & ((num_valid < 0) | (num_valid > verify_capacity))
    flags = tl.where((lanes == 0) & (pid == 0) & count_bad, PLAN_COUNT_BAD, 0)
    n = tl.where(enabled, tl.minimum(tl.maximum(num_valid, 0), verify_capacity), 0)
    if pid == 0:
        tl.atomic_add(kernel_runs_ptr, 1, sem="relaxed")  # relaxed: see append_violations
        if n > 0:
            tl.atomic_add(slots_processed_ptr, n, sem="relaxed")
        if enable == 0:  # overflowed or write-only: this call checks nothing, and says so
            tl.atomic_add(verify_skipped_ptr, 1, sem="relaxed")
    plan = (
        verify_slot_indices_ptr,
        verify_expected_tokens_ptr,
        verify_expected_positions_ptr,
        verify_prev_slot_indices_ptr,
    )
    # The walk only notes which lanes met a failing entry (an engine bug: rare); only a
    # program that met one walks its blocks again for their violation rows and context.
    # The clean walk has no atomic, no store and no reduction a block: one reduction a
    # program decides on the replay.
    suspect = lanes < 0
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        hit, _, _, _, flags = _check_block(
            start, n, flags, plan, records_ptr, kv, num_slots,
            CHECK_TOKENS, MODE, BLOCK, CHUNK,
        )  # fmt: skip
        suspect |= hit
    raise_status(status_ptr, flags)
    if tl.max(suspect.to(tl.int32), 0) != 0:
        # The replay: the same blocks, each failing entry's row and context appended (its
        # request by bisection, the slot's owner), the status bits already raised.
        num_rows = tl.minimum(
            tl.maximum(tl.load(write_num_valid_reqs_ptr).to(tl.int64), 0), write_capacity
        )
        for start in range(pid * BLOCK, n, nprog * BLOCK):
            hit, entry, columns, want_position, _ = _check_block(
                start, n, flags, plan, records_ptr, kv, num_slots,
                CHECK_TOKENS, MODE, BLOCK, CHUNK,
            )  # fmt: skip
            slot, r_position, r_token, want_token, r_prev, expected_chain, bits = columns
            request = request_of(
                entry, hit, (verify_offsets_ptr, row_req_pool_indices_ptr), num_rows,
                search_steps,
            )  # fmt: skip
            owner = tl.load(owners_ptr + slot, mask=hit, other=0)
            append_violations(
                hit,
                (launch_tag, slot, r_position, r_token, want_token, r_prev, expected_chain, bits),
                (request, want_position, owner),
                store,
            )


def dispatch_verify(store: CanaryStore, buffers: PlanBuffers, args: VerifyArgs) -> None:
    """Launch the verify kernel on validated arguments (no check at all)."""
    # Everything but the launch tag is fixed by the store, the plan buffers, the sources
    # and the config (fast_launch.FastPath): addresses in the arenas, which the validation's
    # check() proved still in place and the objects'.
    fast_key = stage_key(
        store, buffers, args.real_kv, config.active.variant, args.check_expected_tokens
    )
    if fast_key is not None:
        fast = _FAST.get(fast_key)
        if fast is not None:
            index, programs, go, before, after = fast
            if index == current_device():
                go(programs, stream_of(index), *before, args.launch_tag, *after)
                return
    check_views(store, buffers)  # their views go to Triton as tensors below
    device = store.device
    dev = device_config(device)
    block = dev.launch.verify_block
    src = source_args(args.real_kv, store.records)
    # Every tensor is 16-byte aligned by construction: the key needs no alignment part.
    key = (dev.variant, args.check_expected_tokens, src.mode)
    before = (
        buffers.verify_slot_indices,
        buffers.verify_expected_tokens,
        buffers.verify_expected_positions,
        buffers.verify_prev_slot_indices,
        buffers.verify_num_valid,
        buffers.verify_enable,
        buffers.write_num_valid_reqs,
        buffers.verify_offsets,
        buffers.row_req_pool_indices,
        store.records,
        store.violations,
        store.violation_count,
        store.kernel_runs,
        store.slots_processed,
        store.status,
        store.owners,
        store.violation_context,
        store.verify_skipped,
        src.table,
        store.num_slots,
        buffers.verify_capacity,
        buffers.write_req_capacity,
        buffers.write_req_capacity.bit_length(),  # bisection rounds for any row count
        store.violation_capacity,
    )
    after = (src.num_sources,)
    kernel_args = (*before, args.launch_tag, *after)
    constexprs = {
        "CHECK_TOKENS": args.check_expected_tokens,
        "MODE": src.mode,
        "BLOCK": block,
        "CHUNK": dev.launch.real_kv_chunk,
    }
    options = {"num_warps": dev.launch.verify_warps}
    # One wave: no more programs than the multiprocessors hold at once (a program of a
    # second wave would start only when one of the first ends, and double the time of
    # the blocks it takes; the real-KV variants hold more registers).
    fits = _VERIFY.programs_per_sm(device, key, kernel_args, constexprs, options)
    programs = dev.verify_programs
    if fits is not None:
        programs = dev.multiprocessors * min(fits, dev.launch.verify_programs_per_sm)
    grid = min(cdiv(buffers.verify_capacity, block), programs)
    go = _VERIFY.launch(device, (grid, 1, 1), key, kernel_args, constexprs, options)
    if go is not None and fast_key is not None:
        _FAST.remember(fast_key, (device.index, grid, go, addresses(before), after))


_FAST = FastPath()
_VERIFY = Launcher(canary_verify_kernel)

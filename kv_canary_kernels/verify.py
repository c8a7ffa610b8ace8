"""The verify stage: ``canary_verify_kernel`` and ``launch_verify``, the only door to it.

Entry-parallel: each lane checks one plan entry against its slot's record. A
predecessor is almost always the previous entry's slot, whose record the lane to the left
already loaded and hashed, so a lane takes its expected chain hash from that lane
(``tl.gather``) and loads the predecessor's record only when it is another slot (a row's
first entry, or a block's first lane). A persistent grid walks blocks below
``verify_num_valid``, read on the device: no sync, and no grid that depends on data.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from kv_canary_buffers.buffers import PlanBuffers
from kv_canary_buffers.real_kv import RealKV
from kv_canary_buffers.store import CanaryStore
from kv_canary_buffers.validation import VerifyArgs, validate_verify_args

from .canary_common import (
    ANCHOR,
    CHAIN_BIT,
    PLAN_COUNT_BAD,
    POSITION_BIT,
    PREV_SLOT_BAD,
    REAL_KV_BIT,
    REAL_KV_ROW_BAD,
    REC_POSITION,
    REC_PREV_HASH,
    REC_REAL_KV,
    REC_TOKEN,
    REC_W,
    VERIFY_SLOT_BAD,
    VERIFY_TOKEN_BIT,
    append_violations,
    i64,
    mix3,
    raise_status,
    real_kv_hash,
)
from .config import device_config
from .launcher import Launcher, alignment_key
from .write import source_args, source_dtypes

VERIFY_BLOCK = 256
"""Entries per block (one per lane)."""
VERIFY_WARPS = 4
VERIFY_PROGRAMS_PER_SM = 8
"""Persistent grid: up to this many programs per multiprocessor, looping over blocks."""

_RUNTIME_INTS = [
    "num_slots", "verify_capacity", "violation_capacity", "launch_tag", "page_size",
    "bpt_words", "kv_words", "stride0", "stride1", "stride2", "stride3",
    "rows0", "rows1", "rows2", "rows3",
]


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def canary_verify_kernel(
    # the plan
    slot_ptr, token_ptr, position_ptr, prev_ptr, num_valid_ptr, enable_ptr,
    # the store
    records_ptr, violations_ptr, count_ptr, runs_ptr, processed_ptr, status_ptr,
    # real-KV sources
    src0, src1, src2, src3, stride0: tl.int64, stride1: tl.int64, stride2: tl.int64,
    stride3: tl.int64, rows0: tl.int64, rows1: tl.int64, rows2: tl.int64, rows3: tl.int64,
    # runtime sizes (int64 whatever their values: one compiled variant for all)
    num_slots: tl.int64, verify_capacity: tl.int64, violation_capacity: tl.int64,
    launch_tag: tl.int64, page_size: tl.int64, bpt_words: tl.int64, kv_words: tl.int64,
    CHECK_TOKENS: tl.constexpr, NUM_SOURCES: tl.constexpr, MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    enabled = tl.load(enable_ptr) != 0
    num_valid = tl.load(num_valid_ptr).to(tl.int64)
    count_bad = enabled & ((num_valid < 0) | (num_valid > verify_capacity))
    flags = tl.where((lanes == 0) & (pid == 0) & count_bad, PLAN_COUNT_BAD, 0)
    n = tl.where(enabled, tl.minimum(tl.maximum(num_valid, 0), verify_capacity), 0)
    if pid == 0:
        tl.atomic_add(runs_ptr, 1)
        if n > 0:
            tl.atomic_add(processed_ptr, n)
    left = tl.maximum(lanes - 1, 0)
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        entry = start + lanes
        in_range = entry < n
        slot = tl.load(slot_ptr + entry, mask=in_range, other=0)
        looked = in_range & (slot != 0)  # slot 0: the padding slot
        slot_bad = looked & ((slot < 0) | (slot >= num_slots))
        prev = tl.load(prev_ptr + entry, mask=looked, other=0)
        prev_bad = looked & ~slot_bad & (prev >= num_slots)
        ok = looked & ~slot_bad & ~prev_bad
        flags |= tl.where(slot_bad, VERIFY_SLOT_BAD, 0) | tl.where(prev_bad, PREV_SLOT_BAD, 0)
        if NUM_SOURCES > 0:
            kv, row_bad = real_kv_hash(
                slot, ok, page_size, bpt_words, kv_words, src0, src1, src2, src3,
                stride0, stride1, stride2, stride3, rows0, rows1, rows2, rows3,
                NUM_SOURCES, MODE,
            )
            flags |= tl.where(row_bad, REAL_KV_ROW_BAD, 0)
            ok &= ~row_bad
            kv = i64(kv)
        else:
            kv = tl.zeros([BLOCK], tl.int64)
        rec = records_ptr + slot * REC_W
        r_token = tl.load(rec + REC_TOKEN, mask=ok, other=0)
        r_position = tl.load(rec + REC_POSITION, mask=ok, other=0)
        r_prev = tl.load(rec + REC_PREV_HASH, mask=ok, other=0)
        r_kv = tl.load(rec + REC_REAL_KV, mask=ok, other=0)
        want_position = tl.load(position_ptr + entry, mask=ok, other=0)
        if CHECK_TOKENS:
            want_token = tl.load(token_ptr + entry, mask=ok, other=-1)
        else:
            want_token = tl.full([BLOCK], -1, tl.int64)
        # hash_of(slot) of every lane; the lane to the right may need it as its prev's.
        own = i64(mix3(r_prev.to(tl.uint64, bitcast=True), r_token, r_position))
        from_left = (
            (lanes > 0)
            & (tl.gather(ok.to(tl.int32), left, 0) != 0)
            & (tl.gather(slot, left, 0) == prev)
        )
        reachable = prev != 0
        load_prev = ok & (prev > 0) & ~from_left
        prec = records_ptr + prev * REC_W
        p_token = tl.load(prec + REC_TOKEN, mask=load_prev, other=0)
        p_position = tl.load(prec + REC_POSITION, mask=load_prev, other=0)
        p_prev = tl.load(prec + REC_PREV_HASH, mask=load_prev, other=0)
        loaded = i64(mix3(p_prev.to(tl.uint64, bitcast=True), p_token, p_position))
        chain = tl.where(from_left, tl.gather(own, left, 0), loaded)
        chain = tl.where(prev < 0, i64(tl.full([BLOCK], ANCHOR, tl.uint64)), chain)
        expected_chain = tl.where(reachable, chain, r_prev)
        bits = (
            tl.where(reachable & (r_prev != expected_chain), CHAIN_BIT, 0)
            | tl.where(r_position != want_position, POSITION_BIT, 0)
            | tl.where(r_kv != kv, REAL_KV_BIT, 0)
            | tl.where((want_token != -1) & (r_token != want_token), VERIFY_TOKEN_BIT, 0)
        )
        append_violations(
            ok & (bits != 0), launch_tag, slot, r_position, r_token, want_token, r_prev,
            expected_chain, bits, violations_ptr, count_ptr, violation_capacity,
        )
    raise_status(status_ptr, flags)


def dispatch_verify(store: CanaryStore, buffers: PlanBuffers, args: VerifyArgs) -> None:
    """Launch the verify kernel on validated arguments (no check at all)."""
    config = device_config(store.device)
    src, num_sources, mode, page_size, bpt_words, kv_words = source_args(
        args.real_kv, store.records
    )
    grid = min(
        triton.cdiv(buffers.verify_capacity, VERIFY_BLOCK),
        config.multiprocessors * VERIFY_PROGRAMS_PER_SM,
    )
    key = (args.check_expected_tokens, num_sources, mode, source_dtypes(src),
           alignment_key(src[:4]))
    _VERIFY.launch(
        store.device,
        (grid, 1, 1),
        key,
        (
            buffers.verify_slot_indices, buffers.verify_expected_tokens,
            buffers.verify_expected_positions, buffers.verify_prev_slot_indices,
            buffers.verify_num_valid, buffers.verify_enable,
            store.records, store.violations, store.violation_count, store.kernel_runs,
            store.slots_processed, store.status,
            *src,
            store.num_slots, buffers.verify_capacity, store.violation_capacity,
            args.launch_tag, page_size, bpt_words, kv_words,
        ),
        {"CHECK_TOKENS": args.check_expected_tokens, "NUM_SOURCES": num_sources, "MODE": mode,
         "BLOCK": VERIFY_BLOCK},
        {"num_warps": VERIFY_WARPS},
    )


_VERIFY = Launcher(canary_verify_kernel)


def launch_verify(
    store: CanaryStore,
    plan_buffers: PlanBuffers,
    *,
    launch_tag: int = 0,
    check_expected_tokens: bool = True,
    real_kv: Optional[RealKV] = None,
) -> None:
    """Check the records of every verify entry of a plan on the GPU, equal to
    :func:`kv_canary_buffers.verify_reference` (same arguments; violation rows of one call
    in unspecified order).

    Runs the shared validation first (a rejected call writes nothing), then one kernel
    launch on the current stream. Never allocates, never syncs, never recompiles for a new
    plan size or capacity, and is safe to capture in a CUDA graph. Entries whose slot,
    predecessor or real-KV row lies outside the store are skipped with a
    :class:`CanaryStatus` bit in ``store.status``.
    """
    args = validate_verify_args(
        store,
        plan_buffers,
        launch_tag=launch_tag,
        check_expected_tokens=check_expected_tokens,
        real_kv=real_kv,
    )
    dispatch_verify(store, plan_buffers, args)

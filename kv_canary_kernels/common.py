"""Triton helpers shared by the offsets and entries stages, and the status bits as
compile-time constants (their values come from ``kv_canary_buffers.PlanStatus``)."""

from __future__ import annotations

import triton
import triton.language as tl

from kv_canary_buffers.status import PlanStatus

REQ_POOL_INDEX_BIT: tl.constexpr = tl.constexpr(int(PlanStatus.REQ_POOL_INDEX_OUT_OF_RANGE))
PREFIX_LEN_BIT: tl.constexpr = tl.constexpr(int(PlanStatus.PREFIX_LEN_OUT_OF_RANGE))
LUT_SLOT_BIT: tl.constexpr = tl.constexpr(int(PlanStatus.LUT_SLOT_OUT_OF_RANGE))
POOL_ROW_BIT: tl.constexpr = tl.constexpr(int(PlanStatus.POOL_ROW_OUT_OF_RANGE))
VALID_LEN_BIT: tl.constexpr = tl.constexpr(int(PlanStatus.VALID_LEN_OUT_OF_RANGE))


@triton.jit
def window_start(prefix_len, window):
    """First verified position: ``max(0, P - W)`` under a window, else 0."""
    return tl.where(window > 0, tl.maximum(prefix_len - window, 0), 0)


@triton.jit
def row_counts(req_pool_index, prefix_len, extend_len, in_batch, window):
    """Per-row ``(active, verify count, write count)`` of the contract."""
    active = in_batch & (req_pool_index != 0)
    vcount = tl.where(active, tl.maximum(prefix_len - window_start(prefix_len, window), 0), 0)
    wcount = tl.where(active, tl.maximum(extend_len, 0), 0)
    return active, vcount, wcount


@triton.jit
def translate(slot, lut_ptr, lut_len, mask):
    """``xlat`` of the contract for the lanes in ``mask``: non-negative slots are looked
    up in the LUT, negative ones pass through. A slot at or past ``lut_len`` is not read:
    it becomes slot 0 and its lane is reported in the second result."""
    looked_up = mask & (slot >= 0)
    in_range = slot < lut_len
    value = tl.load(lut_ptr + slot, mask=looked_up & in_range, other=0)
    return tl.where(looked_up, value, slot), looked_up & (slot >= lut_len)


@triton.jit
def any_bit(flags, bit: tl.constexpr):
    """``bit`` if any lane of the boolean ``flags`` is set, else 0 (int32 scalar)."""
    return tl.max(flags.to(tl.int32), 0) * bit

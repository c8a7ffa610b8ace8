"""The library's constants as the kernels see them: ``tl.constexpr`` globals (the only
globals a ``@triton.jit`` function may read), each taken from
``kv_canary_buffers.layout``, ``status`` or ``real_kv``, so that the kernels and the torch
references cannot disagree on a sentinel, a bit or a column."""

from __future__ import annotations

import torch
import triton.language as tl

from kv_canary_buffers import layout
from kv_canary_buffers.real_kv import RealKVMode
from kv_canary_buffers.status import CanaryStatus, FailBits, PlanStatus

from .config import INTERPRETING

_C = tl.constexpr

# --- sentinels --------------------------------------------------------------------------
PADDING_ROW: tl.constexpr = _C(layout.PADDING_REQ_POOL_INDEX)
"""A ``req_pool_indices`` value marking a padding row (also what a masked read gives)."""
DUMMY_SLOT: tl.constexpr = _C(layout.DUMMY_SLOT)
"""The padding slot: the value of a slot not read, skipped by the verify."""
NO_SLOT: tl.constexpr = _C(layout.NO_SLOT)
"""No seed, no predecessor (chain head), or a slot to skip."""
UNCHECKED_TOKEN: tl.constexpr = _C(layout.UNCHECKED_TOKEN)

# --- extreme values ---------------------------------------------------------------------
MAX_ROW_WRITES: tl.constexpr = _C(layout.MAX_ROW_WRITES)
INT64_MAX: tl.constexpr = _C(layout.INT64_MAX)
MAX_CAPACITY: tl.constexpr = _C(layout.MAX_CAPACITY)
"""The largest ``num_slots`` (int32 counters): every in-range slot fits in 31 bits."""

# --- records and violation rows ---------------------------------------------------------
REC_W: tl.constexpr = _C(layout.RECORD_WIDTH)
REC_TOKEN: tl.constexpr = _C(layout.TOKEN)
REC_POSITION: tl.constexpr = _C(layout.POSITION)
REC_PREV_HASH: tl.constexpr = _C(layout.PREV_HASH)
REC_REAL_KV: tl.constexpr = _C(layout.REAL_KV_HASH)
VIOL_W: tl.constexpr = _C(layout.VIOLATION_WIDTH)
_COLUMN = layout.VIOLATION_COLUMNS.index
VIOL_TAG: tl.constexpr = _C(_COLUMN("launch_tag"))
VIOL_SLOT: tl.constexpr = _C(_COLUMN("slot"))
VIOL_POSITION: tl.constexpr = _C(_COLUMN("position"))
VIOL_STORED_TOKEN: tl.constexpr = _C(_COLUMN("stored_token"))
VIOL_EXPECTED_TOKEN: tl.constexpr = _C(_COLUMN("expected_token"))
VIOL_CHAIN: tl.constexpr = _C(_COLUMN("stored_chain_hash"))
VIOL_AUX: tl.constexpr = _C(_COLUMN("expected_aux"))
VIOL_BITS: tl.constexpr = _C(_COLUMN("fail_bits"))
CTX_W: tl.constexpr = _C(layout.CONTEXT_WIDTH)
CTX_REQ: tl.constexpr = _C(layout.REQ_POOL_INDEX)
CTX_POSITION: tl.constexpr = _C(layout.EXPECTED_POSITION)
CTX_OWNER: tl.constexpr = _C(layout.OWNER)

# --- the hashes (unsigned 64-bit values) ------------------------------------------------
ANCHOR: tl.constexpr = _C(layout.H0)
MUL1: tl.constexpr = _C(layout.SM_MUL1)
MUL2: tl.constexpr = _C(layout.SM_MUL2)
SHIFT1: tl.constexpr = _C(layout.SM_SHIFTS[0])
SHIFT2: tl.constexpr = _C(layout.SM_SHIFTS[1])
SHIFT3: tl.constexpr = _C(layout.SM_SHIFTS[2])
PTX_PRODUCTS: tl.constexpr = _C(not INTERPRETING and torch.version.hip is None)
"""The write chain's 64-bit products as inline PTX (:func:`records.sm`): on NVIDIA
GPUs only, not under the interpreter (which runs no PTX) nor on ROCm (whose devices are
also ``cuda`` to torch; the launchers take no other device type)."""


def _ptx_high_half(m: int) -> str:
    """PTX of the high 32 bits of ``x * m`` (mod 2**64) from the uint32 halves of ``x``
    ($1 low, $2 high) into $0: ``mul.hi(lo, m_lo) + lo * m_hi + hi * m_lo``, the
    multiplier's halves as immediates."""
    m_lo, m_hi = f"0x{m & 0xFFFFFFFF:08X}", f"0x{m >> 32:08X}"
    return (
        f"{{ .reg .u32 a, b, c; mul.hi.u32 a, $1, {m_lo}; mul.lo.u32 b, $1, {m_hi}; "
        f"mul.lo.u32 c, $2, {m_lo}; add.u32 a, a, b; add.u32 $0, a, c; }}"
    )


PTX_HIGH1: tl.constexpr = _C(_ptx_high_half(layout.SM_MUL1))
"""The high half of a product by ``MUL1`` (:func:`records._product_halves`)."""
PTX_HIGH2: tl.constexpr = _C(_ptx_high_half(layout.SM_MUL2))
"""The high half of a product by ``MUL2``."""
MODE_NONE: tl.constexpr = _C(int(RealKVMode.NONE))
"""No real-KV hash (no sources, or a ``RealKV`` that hashes nothing)."""
MODE_PARTIAL: tl.constexpr = _C(int(RealKVMode.PARTIAL))
"""Two words a slot and source, loaded without a loop; the sources two at a time."""
PARTIAL_WIDE = 3
"""The kernels' ``MODE`` for ``PARTIAL`` over more than two sources (``sources.py``): four
sources a step instead of two, twice the loads in flight for the registers of two more."""
MODE_PARTIAL_WIDE: tl.constexpr = _C(PARTIAL_WIDE)
assert PARTIAL_WIDE not in {int(m) for m in RealKVMode}

# --- a RealKV's source table (layout.SOURCE_TABLE_COLUMNS) -----------------------------
SRC_W: tl.constexpr = _C(len(layout.SOURCE_TABLE_COLUMNS))
_SOURCE = layout.SOURCE_TABLE_COLUMNS.index
SRC_ADDRESS: tl.constexpr = _C(_SOURCE("address"))
SRC_ROW_STRIDE: tl.constexpr = _C(_SOURCE("row_stride_words"))
SRC_ROWS: tl.constexpr = _C(_SOURCE("rows"))
SRC_PAGE_SIZE: tl.constexpr = _C(_SOURCE("page_size"))
SRC_BPT: tl.constexpr = _C(_SOURCE("bytes_per_token_words"))
SRC_WORDS: tl.constexpr = _C(_SOURCE("hashed_words"))

# --- the plan's status bits (PlanStatus) ------------------------------------------------
REQ_POOL_INDEX_BIT: tl.constexpr = _C(int(PlanStatus.REQ_POOL_INDEX_OUT_OF_RANGE))
PREFIX_LEN_BIT: tl.constexpr = _C(int(PlanStatus.PREFIX_LEN_OUT_OF_RANGE))
LUT_SLOT_BIT: tl.constexpr = _C(int(PlanStatus.LUT_SLOT_OUT_OF_RANGE))
POOL_ROW_BIT: tl.constexpr = _C(int(PlanStatus.POOL_ROW_OUT_OF_RANGE))
VALID_LEN_BIT: tl.constexpr = _C(int(PlanStatus.VALID_LEN_OUT_OF_RANGE))
PLAN_SYNC_LOST_BIT: tl.constexpr = _C(int(PlanStatus.PLAN_SYNC_LOST))
NEGATIVE_LENGTH_BIT: tl.constexpr = _C(int(PlanStatus.NEGATIVE_LENGTH))
VERIFY_OVERFLOW_BIT: tl.constexpr = _C(int(PlanStatus.VERIFY_OVERFLOW))

# --- a violation row's fail bits (FailBits) ---------------------------------------------
CHAIN_BIT: tl.constexpr = _C(int(FailBits.CHAIN))
POSITION_BIT: tl.constexpr = _C(int(FailBits.POSITION))
REAL_KV_BIT: tl.constexpr = _C(int(FailBits.REAL_KV))
WRITE_TOKEN_BIT: tl.constexpr = _C(int(FailBits.WRITE_TOKEN))
WRITE_POSITION_BIT: tl.constexpr = _C(int(FailBits.WRITE_POSITION))
VERIFY_TOKEN_BIT: tl.constexpr = _C(int(FailBits.VERIFY_TOKEN))

# --- the store's status bits (CanaryStatus) ---------------------------------------------
SEED_BAD: tl.constexpr = _C(int(CanaryStatus.SEED_OUT_OF_RANGE))
WRITE_SLOT_BAD: tl.constexpr = _C(int(CanaryStatus.WRITE_SLOT_OUT_OF_RANGE))
WRITE_INDEX_BAD: tl.constexpr = _C(int(CanaryStatus.WRITE_INDEX_OUT_OF_RANGE))
VERIFY_SLOT_BAD: tl.constexpr = _C(int(CanaryStatus.VERIFY_SLOT_OUT_OF_RANGE))
PREV_SLOT_BAD: tl.constexpr = _C(int(CanaryStatus.PREV_SLOT_OUT_OF_RANGE))
REAL_KV_ROW_BAD: tl.constexpr = _C(int(CanaryStatus.REAL_KV_ROW_OUT_OF_RANGE))
PLAN_COUNT_BAD: tl.constexpr = _C(int(CanaryStatus.PLAN_COUNT_OUT_OF_RANGE))
PADDING_WRITTEN: tl.constexpr = _C(int(CanaryStatus.PADDING_SLOT_WRITTEN))
CHAIN_STALE: tl.constexpr = _C(int(CanaryStatus.WRITE_CHAIN_STALE))
ENTRY_W: tl.constexpr = _C(layout.ENTRY_WIDTH)
ENTRY_SLOT: tl.constexpr = _C(layout.ENTRY_SLOT)

"""Dtypes, sentinels and the buffer layout: the one place that defines them.

Everything that sizes, allocates or checks a plan buffer reads :data:`BUFFER_SPECS`;
everything that validates an input reads the ``*_DTYPE`` constants below.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# --- sentinels (see docs/contract.md) ---------------------------------------------
PADDING_REQ_POOL_INDEX = 0
"""``req_pool_indices[r] == 0`` marks row ``r`` as padding: it contributes nothing."""
DUMMY_SLOT = 0
"""Slot 0 is the dummy slot of padded tokens; also the value of an out-of-range read."""
NO_SLOT = -1
"""No seed (chain starts at the anchor), no predecessor (chain head), or skip."""
UNCHECKED_TOKEN = -1
"""Expected token meaning "do not check the token id of this entry"."""

# --- input dtypes ------------------------------------------------------------------
ROW_DTYPE = torch.int64
"""``req_pool_indices``, ``prefix_lens``, ``extend_seq_lens``, valid lengths: ``[bs]``."""
REQ_TO_TOKEN_DTYPE = torch.int32
"""``req_to_token``: ``[rows, max_seq_len]``."""
LUT_DTYPE = torch.int64
"""``full_to_swa_index_mapping``: ``[lut_len]``."""
TOKEN_POOL_DTYPE = torch.int32
"""``req_to_verify_expected_tokens``: ``[pool_rows, pool_cols]``."""

# --- output dtypes -----------------------------------------------------------------
ENTRY_DTYPE = torch.int64
"""Offsets, seeds and every verify entry."""
COUNTER_DTYPE = torch.int32
"""``write_num_valid_reqs``, ``verify_num_valid``, ``verify_enable`` and the status word."""
ROW_INDEX_DTYPE = torch.int32
"""Batch-row indices (the row hints): rows are below a capacity, so below ``2**31``."""

MAX_CAPACITY = 2**31 - 1
"""Counters are int32, so no capacity may exceed this."""

SCAN_BLOCK = 1024
"""Batches of fewer rows take the one-launch path, whose programs each scan all the rows
in registers; larger ones take the two-level scan."""

OFFSETS_BLOCK = 256
"""Rows per program of the two-level scan (many short programs: the scan is latency);
sizes the scan scratch (one sum per block)."""

ROW_HINT_STRIDE = 256
"""Verify entries per row hint: the offsets stage records the row of every
``ROW_HINT_STRIDE``-th entry, so that a block of entries finds its first row in one load."""


def scan_blocks(write_req_capacity: int) -> int:
    """Number of scan blocks a batch of ``write_req_capacity`` rows can span."""
    return max(1, -(-write_req_capacity // OFFSETS_BLOCK))


def row_hints(verify_capacity: int) -> int:
    """Number of row hints: one per ``ROW_HINT_STRIDE`` verify entries."""
    return max(1, -(-verify_capacity // ROW_HINT_STRIDE))


# name -> (dtype, shape as a function of (write_req_capacity, verify_capacity), role)
ShapeFn = Callable[[int, int], tuple[int, ...]]
BUFFER_SPECS: dict[str, tuple[torch.dtype, ShapeFn, str]] = {
    # write plan (outputs)
    "write_offsets": (ENTRY_DTYPE, lambda w, v: (w + 1,), "output"),
    "write_seed_slot_indices": (ENTRY_DTYPE, lambda w, v: (w,), "output"),
    "write_num_valid_reqs": (COUNTER_DTYPE, lambda w, v: (1,), "output"),
    # verify plan (outputs)
    "verify_slot_indices": (ENTRY_DTYPE, lambda w, v: (v,), "output"),
    "verify_expected_tokens": (ENTRY_DTYPE, lambda w, v: (v,), "output"),
    "verify_expected_positions": (ENTRY_DTYPE, lambda w, v: (v,), "output"),
    "verify_prev_slot_indices": (ENTRY_DTYPE, lambda w, v: (v,), "output"),
    "verify_num_valid": (COUNTER_DTYPE, lambda w, v: (1,), "output"),
    "verify_enable": (COUNTER_DTYPE, lambda w, v: (1,), "output"),
    # scratch: exclusive prefix sum of per-row verify counts, read by the entries stage
    "verify_offsets": (ENTRY_DTYPE, lambda w, v: (w + 1,), "scratch"),
    # scratch: per-block (write, verify) sums of the two-level scan
    "scan_block_sums": (ENTRY_DTYPE, lambda w, v: (2, scan_blocks(w)), "scratch"),
    # scratch: [h] = the row of verify entry h * ROW_HINT_STRIDE, read by the entries stage
    "verify_row_hints": (ROW_INDEX_DTYPE, lambda w, v: (row_hints(v),), "scratch"),
    # sticky out-of-range flags (PlanStatus), read and cleared by take_status()
    "status": (COUNTER_DTYPE, lambda w, v: (1,), "status"),
    # stand-in pointers passed to a kernel when the LUT or the token pool is absent
    "dummy_int64": (ENTRY_DTYPE, lambda w, v: (1,), "scratch"),
    "dummy_int32": (COUNTER_DTYPE, lambda w, v: (1,), "scratch"),
}
"""Every tensor a :class:`~kv_canary_buffers.PlanBuffers` owns, in field (and arena) order."""


def plan_specs(
    write_req_capacity: int, verify_capacity: int
) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
    """``(name, dtype, shape)`` of every field of a :class:`~kv_canary_buffers.PlanBuffers`,
    in field (and arena) order."""
    return tuple(
        (name, dtype, shape_fn(write_req_capacity, verify_capacity))
        for name, (dtype, shape_fn, _role) in BUFFER_SPECS.items()
    )


STAGING_FIELDS = ("req_pool_indices", "prefix_lens", "extend_seq_lens", "valid_lens")
"""The per-row tensors of a :class:`~kv_canary_buffers.GraphInputs`, in arena order."""


def staging_specs(capacity: int) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
    """``(name, dtype, shape)`` of every field of a :class:`~kv_canary_buffers.GraphInputs`."""
    return tuple((name, ROW_DTYPE, (capacity,)) for name in STAGING_FIELDS)


# --- extreme values (docs/contract.md, "Extreme values") ---------------------------
MAX_ROW_WRITES = 2**32
"""A row's write count is ``min(max(0, E), MAX_ROW_WRITES)``: no step writes that many
tokens, and with at most ``2**31 - 1`` rows the prefix sums then stay below ``2**63``."""


# --- the canary's record store (docs/contract.md, "Records") ------------------------
RECORD_DTYPE = torch.int64
"""Records, violation rows and the store's int64 counters."""
FLAG_DTYPE = torch.int32
"""``chain_position_check`` and the store's status word."""
RECORD_WIDTH = 4
"""int64 columns of a record: 32 bytes a slot, SGLang's ``canary_buf`` stride."""
TOKEN, POSITION, PREV_HASH, REAL_KV_HASH = 0, 1, 2, 3
"""Record columns."""
VIOLATION_WIDTH = 8
"""int64 columns of a violation row."""
VIOLATION_COLUMNS = (
    "launch_tag",
    "slot",
    "position",
    "stored_token",
    "expected_token",
    "stored_chain_hash",
    "expected_aux",
    "fail_bits",
)
"""Violation row columns, in order."""
MAX_REAL_KV_SOURCES = 4
"""Real-KV sources per call."""
REAL_KV_ALIGN = 16
"""Byte alignment of a real-KV source's start, row stride, ``bytes_per_token`` and
``read_bytes``; ``PARTIAL`` mode reads this many bytes a slot."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# --- the hashes (docs/contract.md, "Hashes"): constants as unsigned 64-bit values -------
SM_MUL1 = 0xBF58476D1CE4E5B9
SM_MUL2 = 0x94D049BB133111EB
SM_SHIFTS = (30, 27, 31)
ANCHOR_SEED = 0xC0FFEE1234567890
"""``H0 = sm(ANCHOR_SEED)``: the chain hash of a chain head."""
H0 = 0xDE7FAE23A9A1B716


def store_specs(
    num_slots: int, violation_capacity: int
) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
    """``(name, dtype, shape)`` of every field of a :class:`~kv_canary_buffers.CanaryStore`,
    in field (and arena) order."""
    return (
        ("records", RECORD_DTYPE, (num_slots, RECORD_WIDTH)),
        ("violations", RECORD_DTYPE, (violation_capacity, VIOLATION_WIDTH)),
        ("violation_count", RECORD_DTYPE, (1,)),
        ("kernel_runs", RECORD_DTYPE, (1,)),
        ("slots_processed", RECORD_DTYPE, (1,)),
        ("chain_position_check", FLAG_DTYPE, (1,)),
        ("status", FLAG_DTYPE, (1,)),
    )

"""Dtypes, sentinels and the buffer layout: the one place that defines them.

Everything that sizes, allocates, checks or documents a buffer reads the layout tables
(:data:`PLAN_FIELDS`, :data:`STORE_FIELDS`); everything that validates an input reads the
``*_DTYPE`` constants below; the kernels take their sentinels from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

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
BLOCK_TABLE_DTYPE = torch.int32
"""``block_table``: ``[rows, max_blocks]`` (block ids; a negative id is no page)."""
MAX_PAGE_SIZE = 2**31 - 1
"""``page_size`` of a block table: with block ids below ``2**31`` a slot ``block *
page_size + offset`` then stays below ``2**62`` (no wrap)."""
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
"""Batches of fewer rows take the small-batch path (one launch), whose programs each scan
all the rows in registers; larger ones take the large-batch paths: one launch of scanners
and workers when eager and below ``LaunchConfig.one_launch_max_rows``, else the two-level
scan in three launches."""

OFFSETS_BLOCK = 256
"""Rows per program of the two-level scan and per scanner of the one-launch large path
(many short programs: the scan is latency); sizes the scan scratch (one sum per block)."""

ROW_HINT_STRIDE = 256
"""Verify entries per row hint: the offsets stage records the row of every
``ROW_HINT_STRIDE``-th entry, so that a block of entries finds its first row in one load."""


# --- the layout tables ----------------------------------------------------------------
# Each field's name, dtype, shape and meaning, once: the arenas are allocated from these
# rows, the classes' docstrings and docs/api.md's tables are rendered from them
# (kv_canary_buffers/layout_docs.py, scripts/api_tables.py).
class Extent(NamedTuple):
    """One dimension of a field: ``ceil(size / per) + add``, where ``size`` names a
    capacity (``Cw``, ``Cv``, ``N``, ``V``), or the constant ``add`` when it is None. The
    same object sizes the allocation and writes the shape in the docs."""

    size: str | None
    add: int = 0
    per: int = 1

    def of(self, sizes: Mapping[str, int]) -> int:
        if self.size is None:
            return self.add
        return -(-sizes[self.size] // self.per) + self.add

    def __str__(self) -> str:
        if self.size is None:
            return str(self.add)
        text = self.size if self.per == 1 else f"ceil({self.size} / {self.per})"
        return f"{text} + {self.add}" if self.add else text


class Field(NamedTuple):
    """One row of a layout table."""

    name: str
    dtype: torch.dtype
    shape: tuple[Extent, ...]
    role: str
    """``output`` (what a plan writes), ``scratch``, ``sync`` (words the programs of one
    launch wait on, or that order two launches; 0 in fresh buffers), ``status``, ``store``
    or ``workspace`` (what the split write's chain leaves for its stamp)."""
    meaning: str
    """Markdown (inline code in single backticks)."""


_ONE = (Extent(None, 1),)
_CW, _CW1, _CV = Extent("Cw"), Extent("Cw", 1), Extent("Cv")

PLAN_FIELDS: tuple[Field, ...] = (
    Field("write_offsets", ENTRY_DTYPE, (_CW1,), "output",
          "exclusive prefix sum of write counts; `[bs]` = total; `[bs+1:]` = 0"),
    Field("write_seed_slot_indices", ENTRY_DTYPE, (_CW,), "output",
          f"seed slot per row, `{NO_SLOT}` = none; rows `>= bs` unspecified"),
    Field("write_num_valid_reqs", COUNTER_DTYPE, _ONE, "output",
          "`bs` (padding rows included)"),
    Field("row_req_pool_indices", ROW_DTYPE, (_CW,), "output",
          "each row's `req_pool_indices` value (`0` = padding); rows `>= bs` unspecified"),
    Field("verify_slot_indices", ENTRY_DTYPE, (_CV,), "output", "slot of each entry"),
    Field("verify_expected_tokens", ENTRY_DTYPE, (_CV,), "output",
          f"expected token id, `{UNCHECKED_TOKEN}` = do not check"),
    Field("verify_expected_positions", ENTRY_DTYPE, (_CV,), "output",
          "position of each entry"),
    Field("verify_prev_slot_indices", ENTRY_DTYPE, (_CV,), "output",
          f"predecessor slot, `{NO_SLOT}` = chain head"),
    Field("verify_num_valid", COUNTER_DTYPE, _ONE, "output",
          "entries written, or `Cv` on overflow"),
    Field("verify_enable", COUNTER_DTYPE, _ONE, "output",
          "`1`, or `0` on overflow (no entry written)"),
    Field("verify_offsets", ENTRY_DTYPE, (_CW1,), "output",
          "exclusive prefix sum of the rows' verify counts; `[bs]` = the entries; valid when "
          "`verify_enable = 1`, unspecified otherwise and past `bs`"),
    Field("scan_block_sums", ENTRY_DTYPE, (Extent(None, 2), Extent("Cw", per=OFFSETS_BLOCK)),
          "scratch",
          f"scratch: per-block (write, verify) sums of the two-level scan, {OFFSETS_BLOCK} "
          "rows a block"),
    Field("verify_row_hints", ROW_INDEX_DTYPE, (Extent("Cv", per=ROW_HINT_STRIDE),), "scratch",
          f"scratch: the row of every {ROW_HINT_STRIDE}th verify entry (large-batch path)"),
    Field("launch_sync", ENTRY_DTYPE, (Extent(None, 4),), "sync",
          "sync: the one-launch large-batch path's counters (tickets taken, chunks written), "
          "a pair per launch parity: launch `e` counts in `[e % 2]` and `[2 + e % 2]` and "
          "zeroes the other pair"),
    Field("scan_chunk_sums", ENTRY_DTYPE, (Extent(None, 3), Extent("Cw", 1, per=OFFSETS_BLOCK)),
          "sync",
          f"sync: the one-launch large-batch path's (write sum, verify sum, mark) of each "
          f"{OFFSETS_BLOCK}-row chunk; the mark is the number of the launch that published "
          "the sums"),
    Field("status", COUNTER_DTYPE, _ONE, "status",
          "sticky `PlanStatus` bits, read and cleared by `take_status()`"),
    Field("dummy_int64", ENTRY_DTYPE, _ONE, "scratch",
          "stand-in kernel pointer for an absent LUT or valid lengths"),
    Field("dummy_int32", COUNTER_DTYPE, _ONE, "scratch",
          "stand-in kernel pointer for an absent token pool"),
)  # fmt: skip
"""Every tensor a :class:`~kv_canary_buffers.PlanBuffers` owns, in field (and arena)
order; ``Cw`` = ``write_req_capacity``, ``Cv`` = ``verify_capacity``."""


def specs_of(
    fields: tuple[Field, ...], sizes: Mapping[str, int]
) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
    """``(name, dtype, shape)`` of every field of a table for these capacities."""
    return tuple((f.name, f.dtype, tuple(e.of(sizes) for e in f.shape)) for f in fields)


def plan_specs(
    write_req_capacity: int, verify_capacity: int
) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
    """``(name, dtype, shape)`` of every field of a :class:`~kv_canary_buffers.PlanBuffers`,
    in field (and arena) order."""
    return specs_of(PLAN_FIELDS, {"Cw": write_req_capacity, "Cv": verify_capacity})


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
CONTEXT_COLUMNS = ("req_pool_index", "expected_position", "owner")
"""Columns of ``violation_context``, the project's own beside each ring row (SGLang's eight
columns keep their meaning and bytes): the row's request, the position it expected, and
the slot's last writer (``0`` = unknown)."""
CONTEXT_WIDTH = len(CONTEXT_COLUMNS)
REQ_POOL_INDEX, EXPECTED_POSITION, OWNER = 0, 1, 2
"""Context columns."""
MAX_REAL_KV_SOURCES = 512
"""Real-KV sources per ``RealKV``: every layer's K and V of a model of up to 256 layers."""
SOURCE_TABLE_COLUMNS = (
    "address",
    "row_stride_words",
    "rows",
    "page_size",
    "bytes_per_token_words",
    "hashed_words",
)
"""Columns of a ``RealKV``'s source table (int64 ``[num_sources, 6]``, one row per source,
on the sources' device): the source's start in bytes, its row stride in 8-byte words, its
rows (pages), slots per row, a slot's stride in words and the words hashed per slot. The
kernels read the sources' geometry from it, so that any number of sources is one compiled
kernel with two arguments."""
REAL_KV_ALIGN = 16
"""Byte alignment of a real-KV source's start, row stride, ``bytes_per_token`` and
``read_bytes``; ``PARTIAL`` mode reads this many bytes a slot."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# --- the hashes (docs/contract.md, "Hashes"): constants as unsigned 64-bit values -------
SM_MUL1 = 0xBF58476D1CE4E5B9
SM_MUL2 = 0x94D049BB133111EB
SM_SHIFTS = (30, 27, 31)
ANCHOR_SEED = 0xC0FFEE1234567890
"""``H0 = sm(ANCHOR_SEED)``: the chain hash of a chain head."""
H0 = 0xDE7FAE23A9A1B716


STORE_FIELDS: tuple[Field, ...] = (
    Field("records", RECORD_DTYPE, (Extent("N"), Extent(None, RECORD_WIDTH)), "store",
          f"per slot: `TOKEN`, `POSITION`, `PREV_HASH`, `REAL_KV_HASH` (columns {TOKEN}.."
          f"{REAL_KV_HASH}); {RECORD_WIDTH * 8} bytes a slot, so `records.view(torch.uint8)` "
          "is SGLang's `canary_buf`; zero = never written"),
    Field("violations", RECORD_DTYPE, (Extent("V"), Extent(None, VIOLATION_WIDTH)), "store",
          f"the ring: `{', '.join(VIOLATION_COLUMNS)}`"),
    Field("violation_count", RECORD_DTYPE, _ONE, "store",
          "rows appended since the last `take_violations`, dropped ones included (`count - V` "
          "were dropped when it exceeds `V`)"),
    Field("kernel_runs", RECORD_DTYPE, _ONE, "store",
          "+1 per write or verify call, always (an overflowed plan included); never cleared "
          "by the library"),
    Field("slots_processed", RECORD_DTYPE, _ONE, "store",
          "write: records stored; verify: entries looked at (`min(verify_num_valid, "
          "verify_capacity)` per enabled call, skipped ones included); never cleared"),
    Field("chain_position_check", FLAG_DTYPE, _ONE, "store",
          "0 at allocation; not 0: the write checks that each written position is the "
          "previous one of its row + 1"),
    Field("status", FLAG_DTYPE, _ONE, "status",
          "sticky `CanaryStatus` bits, read and cleared by `take_status()`"),
    Field("owners", RECORD_DTYPE, (Extent("N"),), "store",
          "per slot, the `req_pool_index` of the plan row that last stamped its record "
          "(`0` = never written by the canary); stamped with the record, not part of "
          "SGLang's"),
    Field("violation_context", RECORD_DTYPE, (Extent("V"), Extent(None, CONTEXT_WIDTH)),
          "store",
          f"beside each ring row, at its index: `{', '.join(CONTEXT_COLUMNS)}` (verify: "
          "the entry's request, its position, the slot's writer; write: the writing row's "
          "request, the expected position, the row itself)"),
    Field("verify_skipped", RECORD_DTYPE, _ONE, "store",
          "+1 per verify call that checked nothing (`verify_enable = 0`: an overflowed or "
          "write-only plan); never cleared by the library"),
)  # fmt: skip
"""Every tensor a :class:`~kv_canary_buffers.CanaryStore` owns, in field (and arena)
order; ``N`` = ``num_slots``, ``V`` = ``violation_capacity``."""


def store_specs(
    num_slots: int, violation_capacity: int
) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
    """``(name, dtype, shape)`` of every field of a :class:`~kv_canary_buffers.CanaryStore`,
    in field (and arena) order."""
    return specs_of(STORE_FIELDS, {"N": num_slots, "V": violation_capacity})


# --- the split write's workspace (docs/contract-canary.md, "Write, split") -------------
ENTRY_WIDTH = 4
"""int64 columns of a workspace entry: the record's ``TOKEN``, ``POSITION`` and
``PREV_HASH`` (the same columns as a record's) and the slot the stamp writes."""
ENTRY_SLOT = 3
"""The entry column holding the slot (where a record holds ``REAL_KV_HASH``)."""

WORKSPACE_FIELDS: tuple[Field, ...] = (
    Field("entries", RECORD_DTYPE, (Extent("T"), Extent(None, ENTRY_WIDTH)), "workspace",
          "per token index `i` of the step the chain stamped: `TOKEN`, `POSITION`, "
          "`PREV_HASH` (the chain hash before the token) and the slot; unspecified where "
          "`entry_fills[i]` is not `fill`"),
    Field("entry_owners", RECORD_DTYPE, (Extent("T"),), "workspace",
          "per token index, the writing row's `row_req_pool_indices` value (the owner the "
          "stamp stores)"),
    Field("entry_fills", RECORD_DTYPE, (Extent("T"),), "workspace",
          "per token index, the fill (`fill`'s value) whose chain wrote the entry; the "
          "stamp stamps only the entries of the current fill"),
    Field("last_token", COUNTER_DTYPE, (Extent("N"),), "workspace",
          "per slot, the token index of its last entry in the fill that wrote it (a slot "
          "written twice within a row keeps the later record)"),
    Field("fill", RECORD_DTYPE, _ONE, "sync",
          "the number of chain launches this workspace has seen (each fill's entries carry "
          "it); `0` = never filled"),
    Field("chain_tickets", RECORD_DTYPE, _ONE, "sync",
          "the chain's programs count themselves here; the last one advances `fill` and "
          "zeroes it"),
    Field("stamp_tickets", RECORD_DTYPE, _ONE, "sync",
          "zeroed by each chain; each stamp program takes a ticket: tickets past the stamp's "
          "programs mean no fresh chain (a stamp repeated, or a chain skipped)"),
    Field("chain_launch", RECORD_DTYPE, _ONE, "sync",
          "the host launch number of the last chain (`WriteWorkspace` numbers them from 1); "
          "the stamp compares it with its own"),
)  # fmt: skip
"""Every tensor a :class:`~kv_canary_buffers.WriteWorkspace` owns, in field (and arena)
order; ``T`` = ``token_capacity``, ``N`` = ``slot_capacity``."""


def workspace_specs(
    token_capacity: int, slot_capacity: int
) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
    """``(name, dtype, shape)`` of every field of a :class:`~kv_canary_buffers.WriteWorkspace`,
    in field (and arena) order."""
    return specs_of(WORKSPACE_FIELDS, {"T": token_capacity, "N": slot_capacity})


assert (TOKEN, POSITION, PREV_HASH) == (0, 1, 2) and ENTRY_SLOT == REAL_KV_HASH
"""An entry's first three columns are a record's (the stamp copies them in place)."""

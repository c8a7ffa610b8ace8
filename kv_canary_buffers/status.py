"""The plan's status word: one sticky bit per kind of out-of-range input data, one,
``PLAN_SYNC_LOST``, for plans of one buffers object that overlapped, and one,
``VERIFY_OVERFLOW``, for a plan whose verify entries did not fit.

The Triton plan never reads outside a tensor. When the data asks it to, the read is not
made, the value it would have produced becomes the padding value (slot ``0`` for a slot,
``-1`` for an expected token) and the matching bit below is OR-ed into
``PlanBuffers.status``. Bits stay set across launches until
:meth:`PlanBuffers.take_status` reads and clears them. The torch reference raises
``ValueError`` for the same data instead, and sets ``VERIFY_OVERFLOW`` as the kernels do.
"""

from __future__ import annotations

import enum


class PlanStatus(enum.IntFlag):
    """Bits of ``PlanBuffers.status`` (int32 ``[1]``). ``0`` means every read was in range."""

    OK = 0
    REQ_POOL_INDEX_OUT_OF_RANGE = 1 << 0
    """An active row's ``req_pool_indices[r]`` is outside ``[0, req_to_token.shape[0])``:
    its seed and every slot it would read become ``0``, its expected tokens ``-1``."""
    PREFIX_LEN_OUT_OF_RANGE = 1 << 1
    """An active row's ``prefix_lens[r]`` exceeds ``req_to_token.shape[1]``: slots at
    positions past the table's width become ``0``."""
    LUT_SLOT_OUT_OF_RANGE = 1 << 2
    """A slot looked up in ``full_to_swa_index_mapping`` is at or past its length: the
    translated slot becomes ``0``. Negative slots are never looked up."""
    POOL_ROW_OUT_OF_RANGE = 1 << 3
    """An active row's ``req_pool_indices[r]`` is outside
    ``[0, req_to_verify_expected_tokens.shape[0])``: its expected tokens become ``-1``."""
    VALID_LEN_OUT_OF_RANGE = 1 << 4
    """An active row's ``req_to_verify_expected_tokens_valid_lens[r]`` exceeds
    ``req_to_verify_expected_tokens.shape[1]``: tokens past the pool's width become ``-1``."""
    PLAN_SYNC_LOST = 1 << 5
    """Not about data: a program of the eager one-launch large-batch plan (from
    ``SCAN_BLOCK`` rows to below ``LaunchConfig.one_launch_max_rows``) gave up waiting
    for another or found the launch's counters taken, because two plans ran on the same
    buffers at once (two streams, no ordering between them). The plan is unspecified and
    its ``verify_enable`` set to 0 (best effort). Run a ``PlanBuffers``' plans one at a
    time (one stream, or events between streams); two overlapping plans are not always
    caught."""
    NEGATIVE_LENGTH = 1 << 6
    """A busy row (``req_pool_indices[r] != 0``) has ``prefix_lens[r] < 0`` or
    ``extend_seq_lens[r] < 0``: the row is planned as padding (it writes nothing, verifies
    nothing, its seed is ``-1``) and no other check is made of it. (SGLang's plan reads a
    negative prefix as a fresh prefill; a negative length is an engine bug here.)"""
    VERIFY_OVERFLOW = 1 << 7
    """The plan's verify entries exceed ``verify_capacity``: no entry is written,
    ``verify_enable`` is 0 and a verify of this plan checks nothing. Not about data out of
    range, and not an error: the torch reference sets this bit too (the one it sets), so
    both paths leave the same status. Grow the buffers (``ensure_capacity`` with
    ``verify_entries_needed``). A write-only plan (``verify=False``) never sets it."""


class FailBits(enum.IntFlag):
    """Why a violation row was appended (its ``fail_bits`` column)."""

    OK = 0
    CHAIN = 1
    """verify: the record's chain hash differs from the hash of its predecessor's record
    (a slot reused by another request, a stale page, a record overwritten)."""
    POSITION = 2
    """verify: the record's position differs from the position the plan expects there
    (an off-by-one in a paged index, a slot given to two requests)."""
    REAL_KV = 4
    """verify: the hash of the slot's KV bytes differs from the one stored at write time
    (KV bytes overwritten)."""
    WRITE_TOKEN = 8
    """write: the token written differs from ``expected_input_ids``."""
    WRITE_POSITION = 16
    """write: the position written differs from ``expected_positions``, or (with the
    chain-position check on) is not the previous position of the row + 1."""
    VERIFY_TOKEN = 32
    """verify: the record's token differs from the expected token of the plan entry."""


class CanaryStatus(enum.IntFlag):
    """Bits of ``CanaryStore.status`` (int32 ``[1]``): data the write and verify kernels
    refused to follow out of bounds, and one flag on valid data. For the out-of-range
    bits the entry concerned is skipped (no record written, no check made) and the torch
    references raise ``ValueError`` for the same data instead; ``PADDING_SLOT_WRITTEN``
    skips nothing and both paths set it. Every bit stays set until
    :meth:`CanaryStore.take_status` clears it."""

    OK = 0
    SEED_OUT_OF_RANGE = 1 << 0
    """write: a row with tokens to write has ``write_seed_slot_indices[r] >= num_slots``:
    the row writes nothing."""
    WRITE_SLOT_OUT_OF_RANGE = 1 << 1
    """write: ``out_cache_loc[i] >= num_slots``: token ``i`` is skipped (as a negative
    slot is) and the row's chain does not advance over it."""
    WRITE_INDEX_OUT_OF_RANGE = 1 << 2
    """write: a row's range ``write_offsets[r] .. write_offsets[r + 1]`` reaches an index
    outside ``[0, len(out_cache_loc))``: those indices are not read."""
    VERIFY_SLOT_OUT_OF_RANGE = 1 << 3
    """verify: ``verify_slot_indices[i]`` is negative or ``>= num_slots``: entry skipped."""
    PREV_SLOT_OUT_OF_RANGE = 1 << 4
    """verify: ``verify_prev_slot_indices[i] >= num_slots``: entry skipped."""
    REAL_KV_ROW_OUT_OF_RANGE = 1 << 5
    """write or verify: a slot's real-KV page row ``slot // page_size`` is at or past a
    source's rows: that token or entry is skipped."""
    PLAN_COUNT_OUT_OF_RANGE = 1 << 6
    """``write_num_valid_reqs`` outside ``[0, write_req_capacity]`` or
    ``verify_num_valid`` outside ``[0, verify_capacity]`` (a plan buffer written by
    something other than a plan): the count is clamped into range."""
    PADDING_SLOT_WRITTEN = 1 << 7
    """write: a busy row stamped a token whose ``out_cache_loc`` is ``0``, the pool's
    padding slot (which the verify never checks): a padding bug, or a row the engine
    forgot to mask. Not a skip: the record and its owner are stamped all the same (as
    SGLang does), and the torch reference sets this bit too."""
    WRITE_CHAIN_STALE = 1 << 8
    """split write: a stamp found no fresh chain in its ``WriteWorkspace`` (a stamp
    replayed twice from a CUDA graph, a replay that skipped the chain, or a chain of
    another launch): it stamped nothing and counted nothing. The host-side check refuses
    the same in eager calls with a ``ValueError``; only a graph replay reaches this bit."""

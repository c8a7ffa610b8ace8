"""Triton helpers shared by the plan kernels (constants: :mod:`kv_canary_kernels.constants`)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..constants import (
    DUMMY_SLOT,
    INT64_MAX,
    LUT_SLOT_BIT,
    MAX_ROW_WRITES,
    NEGATIVE_LENGTH_BIT,
    NO_SLOT,
    PADDING_ROW,
    POOL_ROW_BIT,
    PREFIX_LEN_BIT,
    REQ_POOL_INDEX_BIT,
    UNCHECKED_TOKEN,
    VALID_LEN_BIT,
    VERIFY_OVERFLOW_BIT,
)

# The table the plan reads slots from (docs/contract.md, "The table"): the kernels' TABLE
# constexpr. A block table's position splits into (block, offset) by a shift and a mask
# when its page size is a power of two (the engines' usual pages), by a 64-bit division
# otherwise.
REQ_TO_TOKEN: tl.constexpr = tl.constexpr(0)
BLOCKS_POW2: tl.constexpr = tl.constexpr(1)
BLOCKS: tl.constexpr = tl.constexpr(2)


@triton.jit
def read_table(table, rp, pos, mask, TABLE: tl.constexpr, EVICTION: tl.constexpr):
    """``table(rp, pos)`` of the contract for the lanes in ``mask`` (each inside the
    table: ``0 <= rp < table_rows``, ``0 <= pos < table_cols``), slot 0 elsewhere, as
    int64. ``table``: ``(req_to_token_ptr, block_table_ptr, table_rows, table_cols,
    block_cols, page_size, page_shift)``, where ``table_cols`` is the positions the table
    maps (``min(max_blocks * page_size, 2**63 - 1)`` for a block table) and
    ``block_cols`` a block table's width; ``EVICTION``: the load's policy."""
    req_to_token_ptr, block_table_ptr, _, table_cols, block_cols, page_size, page_shift = table
    if TABLE == REQ_TO_TOKEN:
        slot = tl.load(
            req_to_token_ptr + rp * table_cols + pos,
            mask=mask,
            other=DUMMY_SLOT,
            eviction_policy=EVICTION,
        )
        slot = slot.to(tl.int64)
    else:
        if TABLE == BLOCKS_POW2:
            block = pos >> page_shift
        else:
            block = pos // page_size
        offset = pos - block * page_size
        ids = tl.load(
            block_table_ptr + rp * block_cols + block,
            mask=mask,
            other=DUMMY_SLOT,
            eviction_policy=EVICTION,
        )
        ids = ids.to(tl.int64)
        # No wrap: ids < 2**31 and page_size < 2**31. A negative block id: no slot.
        slot = tl.where(mask, tl.where(ids >= 0, ids * page_size + offset, NO_SLOT), DUMMY_SLOT)
    return slot


# Wrap-free arithmetic (docs/contract.md, "Extreme values"): every per-row input may hold
# any int64 and the window any value in [0, 2**63 - 1]. No helper below subtracts two
# unbounded values or sums unclamped counts.
@triton.jit
def verify_count(prefix_len, window):
    """The contract's ``max(0, P - ws)`` of a row, without a subtraction: ``min(P, W)``
    under a window, ``P`` without one, 0 for ``P <= 0``."""
    count = tl.where(window > 0, tl.minimum(prefix_len, window), prefix_len)
    return tl.maximum(count, 0)


@triton.jit
def window_start(prefix_len, window):
    """First verified position ``max(0, P - W)`` (0 without a window): ``P - count``,
    which lies in ``[0, P]``, and 0 for ``P <= 0``."""
    return tl.where(prefix_len > 0, prefix_len - verify_count(prefix_len, window), 0)


@triton.jit
def load_valid_lens(pool, rows, mask, HAS_POOL: tl.constexpr):
    """Valid lengths of the token pool for ``rows`` (masked lanes and no pool: zeros);
    ``pool`` as for :func:`write_entries`."""
    req_to_verify_expected_tokens_valid_lens_ptr = pool[1]
    if HAS_POOL:
        valid_len = tl.load(req_to_verify_expected_tokens_valid_lens_ptr + rows, mask=mask, other=0)
    else:
        valid_len = tl.zeros(rows.shape, tl.int64)
    return valid_len


@triton.jit
def load_verify_rows(row_inputs, rows, bs, window, verify_capacity):
    """Per-row inputs of the plan (``row_inputs``: ``(req_pool_indices_ptr,
    prefix_lens_ptr, extend_seq_lens_ptr)``), ``active`` and the contract's ``vcount``
    clamped to ``verify_capacity + 1``: exact when the plan does not overflow, and sums
    of at most ``2**31`` rows of at most ``2**31`` cannot wrap. A busy row of negative
    length is not active (``NEGATIVE_LENGTH``: planned as padding), so the verify count
    needs the extend lengths too."""
    req_pool_indices_ptr, prefix_lens_ptr, extend_seq_lens_ptr = row_inputs
    in_batch = rows < bs
    rp = tl.load(req_pool_indices_ptr + rows, mask=in_batch, other=PADDING_ROW)
    prefix = tl.load(prefix_lens_ptr + rows, mask=in_batch, other=0)
    extend = tl.load(extend_seq_lens_ptr + rows, mask=in_batch, other=0)
    active = in_batch & (rp != PADDING_ROW) & (prefix >= 0) & (extend >= 0)
    count_cap = verify_capacity.to(tl.int64) + 1  # 2**31 at most: int64
    vcount = tl.where(active, tl.minimum(verify_count(prefix, window), count_cap), 0)
    return in_batch, rp, prefix, extend, active, vcount


@triton.jit
def write_counts(extend, active):
    """The contract's ``wcount``: ``min(E, MAX_ROW_WRITES)`` of an active row (``E >=
    0`` there)."""
    return tl.where(active, tl.minimum(extend, MAX_ROW_WRITES), 0)


@triton.jit
def load_rows(row_inputs, rows, bs, window, verify_capacity):
    """Per-row inputs and the contract's ``(active, vcount, wcount)`` for ``rows``;
    ``row_inputs`` as for :func:`load_verify_rows`."""
    in_batch, rp, prefix, extend, active, vcount = load_verify_rows(
        row_inputs, rows, bs, window, verify_capacity
    )
    return in_batch, rp, prefix, active, vcount, write_counts(extend, active)


@triton.jit
def find_rows(first, n_rows, entry, offsets, IN_REGISTERS: tl.constexpr, BLOCK: tl.constexpr):
    """Per lane: the last index ``k`` in ``[first, first + n_rows)`` (``n_rows >= 1``) with
    ``offsets[k] <= entry``, by a binary search of ``bit_length(n_rows - 1)`` steps.
    ``offsets`` is a vector in registers (``IN_REGISTERS``, read with ``tl.gather``) or a
    pointer to the offsets in memory."""
    lo = tl.zeros([BLOCK], tl.int32) + first
    hi = lo + n_rows
    span = n_rows - 1
    while span > 0:
        mid = (lo + hi) // 2
        if IN_REGISTERS:
            value = tl.gather(offsets, mid, 0)
        else:
            value = tl.load(offsets + mid)
        go_right = value <= entry
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid)
        span = span // 2
    return lo


@triton.jit
def translate(slot, lut, mask):
    """``xlat`` of the contract for the lanes in ``mask``: non-negative slots are looked
    up in the LUT (``lut``: ``(full_to_swa_index_mapping_ptr, lut_len)``), negative ones
    pass through. A slot at or past ``lut_len`` is not read: it becomes slot 0 and its
    lane is reported in the second result."""
    full_to_swa_index_mapping_ptr, lut_len = lut
    looked_up = mask & (slot >= 0)
    in_range = slot < lut_len
    # The tables are re-read every step, while the outputs (often larger than L2) are
    # written once per step: ask L2 to keep the tables (evict_last) and to let the
    # streamed outputs go first (the .cs stores in write_entries).
    value = tl.load(
        full_to_swa_index_mapping_ptr + slot,
        mask=looked_up & in_range,
        other=DUMMY_SLOT,
        eviction_policy="evict_last",
    )
    return tl.where(looked_up, value, slot), looked_up & (slot >= lut_len)


@triton.jit
def _bitwise_or(a, b):
    return a | b


@triton.jit
def any_bit(flags, bit: tl.constexpr):
    """``bit`` if any lane of the boolean ``flags`` is set, else 0 (int32 scalar)."""
    return tl.max(flags.to(tl.int32), 0) * bit


@triton.jit
def write_offsets_and_counters(
    rows,
    in_batch,
    wcount,
    w_before,
    w_total,
    v_total,
    owns_counters,
    write_offsets_ptr,
    counters,
    bs,
    write_capacity,
    verify_capacity,
    VERIFY: tl.constexpr,
):
    """``write_offsets`` of a block of ``rows`` (the total at index ``bs``, zeros after it
    within the block) and, when ``owns_counters`` (the block holds index ``bs``), the three
    counters and, on overflow, ``VERIFY_OVERFLOW`` (``counters``:
    ``(write_num_valid_reqs_ptr, verify_num_valid_ptr, verify_enable_ptr, status_ptr)``).
    ``w_before``: write entries of the rows before the block. Without ``VERIFY`` (a
    write-only plan) ``v_total`` is not read: no entry, no overflow."""
    write_num_valid_reqs_ptr, verify_num_valid_ptr, verify_enable_ptr, status_ptr = counters
    w_excl = w_before + tl.cumsum(wcount, 0) - wcount
    w_out = tl.where(in_batch, w_excl, tl.where(rows == bs, w_total, 0))
    tl.store(write_offsets_ptr + rows, w_out, mask=rows <= write_capacity)
    tl.store(write_num_valid_reqs_ptr, bs, mask=owns_counters)
    if VERIFY:
        overflow = v_total > verify_capacity
        tl.store(
            verify_num_valid_ptr,
            tl.where(overflow, verify_capacity, v_total).to(tl.int32),
            mask=owns_counters,
        )
        tl.store(verify_enable_ptr, tl.where(overflow, 0, 1).to(tl.int32), mask=owns_counters)
        tl.atomic_or(status_ptr, VERIFY_OVERFLOW_BIT, mask=owns_counters & overflow, sem="relaxed")
    else:
        tl.store(verify_num_valid_ptr, tl.zeros([], tl.int32), mask=owns_counters)
        tl.store(verify_enable_ptr, tl.zeros([], tl.int32), mask=owns_counters)


@triton.jit
def write_seeds(
    rows,
    in_batch,
    rp,
    prefix,
    active,
    wcount,
    valid_len,
    table,
    lut,
    pool,
    row_outputs,
    HAS_LUT: tl.constexpr,
    HAS_POOL: tl.constexpr,
    TABLE: tl.constexpr,
):
    """Seeds and ``row_req_pool_indices`` of a block of ``rows``, and the status bits of
    the rows' own values (returned: req_pool_index, prefix_len, valid_len, pool row, and
    the seed's LUT slot). ``valid_len`` holds the rows' valid lengths of the token pool
    (ignored without it). ``row_outputs``: ``(write_seed_slot_indices_ptr,
    row_req_pool_indices_ptr)``; ``table``, ``lut``, ``pool``: as for
    :func:`write_entries`."""
    write_seed_slot_indices_ptr, row_req_pool_indices_ptr = row_outputs
    _, _, table_rows, table_cols, _, _, _ = table
    _, _, pool_rows, pool_cols, _ = pool
    rp_ok = (rp >= 0) & (rp < table_rows)
    wants_seed = active & (prefix > 0) & (wcount > 0)
    seed_pos = tl.maximum(prefix, 1) - 1  # P - 1 where a seed is read; no wrap at -2**63
    # A read that would leave the table is not made: the seed becomes slot 0, untranslated.
    seed_read = wants_seed & rp_ok & (seed_pos < table_cols)
    seed = read_table(table, rp, seed_pos, seed_read, TABLE, "")
    # Per-lane flags, OR-reduced once at the end (one reduction, not one per kind).
    flags = tl.where(active & ~rp_ok, REQ_POOL_INDEX_BIT, 0)
    # A busy row that is not active has a negative length (planned as padding).
    flags |= tl.where(in_batch & (rp != PADDING_ROW) & ~active, NEGATIVE_LENGTH_BIT, 0)
    flags |= tl.where(active & (prefix > table_cols), PREFIX_LEN_BIT, 0)
    if HAS_LUT:
        seed, bad_slot = translate(seed, lut, seed_read)
        flags |= tl.where(bad_slot, LUT_SLOT_BIT, 0)
    tl.store(write_seed_slot_indices_ptr + rows, tl.where(wants_seed, seed, NO_SLOT), mask=in_batch)
    tl.store(row_req_pool_indices_ptr + rows, rp, mask=in_batch)
    if HAS_POOL:
        flags |= tl.where(active & ((rp < 0) | (rp >= pool_rows)), POOL_ROW_BIT, 0)
        flags |= tl.where(active & (valid_len > pool_cols), VALID_LEN_BIT, 0)
    return tl.reduce(flags, 0, _bitwise_or)


@triton.jit
def write_seed_block(
    rows,
    row_inputs,
    table,
    lut,
    pool,
    row_outputs,
    bs,
    window,
    HAS_LUT: tl.constexpr,
    HAS_POOL: tl.constexpr,
    TABLE: tl.constexpr,
):
    """:func:`write_seeds` of a block of ``rows``, from their inputs loaded here (the
    large-batch paths' seed blocks need no scan); returns the rows' status bits.
    ``row_inputs`` as for :func:`load_rows`, ``row_outputs`` as for :func:`write_seeds`."""
    in_batch, rp, prefix, active, _vcount, wcount = load_rows(
        row_inputs,
        rows,
        bs,
        window,
        bs,  # the verify count is unused here: any capacity
    )
    return write_seeds(
        rows,
        in_batch,
        rp,
        prefix,
        active,
        wcount,
        load_valid_lens(pool, rows, in_batch, HAS_POOL),
        table,
        lut,
        pool,
        row_outputs,
        HAS_LUT,
        HAS_POOL,
        TABLE,
    )


@triton.jit
def zero_offsets_tail(
    write_offsets_ptr, bs, write_capacity, first_block, step, BLOCK: tl.constexpr
):
    """Zero the tail of ``write_offsets`` (indices ``bs + 1 .. write_capacity``) within
    blocks ``first_block, first_block + step, ...``: a reused buffer must not keep it."""
    n_blocks = (write_capacity + BLOCK) // BLOCK
    for block in range(first_block, n_blocks, step):
        idx = block * BLOCK + tl.arange(0, BLOCK)
        tl.store(
            write_offsets_ptr + idx,
            tl.zeros([BLOCK], tl.int64),
            mask=(idx > bs) & (idx <= write_capacity),
        )


@triton.jit
def write_entries(
    entry,
    in_range,
    row,
    rp,
    pos,
    valid_len,
    table,
    lut,
    pool,
    entries,
    HAS_LUT: tl.constexpr,
    HAS_POOL: tl.constexpr,
    BLOCK: tl.constexpr,
    TABLE: tl.constexpr,
):
    """Slot, expected token, position and prev slot of each verify ``entry`` (lanes in
    ``in_range``), given its ``row`` and that row's ``rp``, position and valid length.
    Returns the LUT status bit if a looked-up slot was out of range.

    The groups, as the kernels build them: ``table``, as for :func:`read_table`; ``lut``,
    ``(full_to_swa_index_mapping_ptr, lut_len)``; ``pool``, the expected-token pool
    ``(req_to_verify_expected_tokens_ptr, req_to_verify_expected_tokens_valid_lens_ptr,
    pool_rows, pool_cols, token_offset)``;
    ``entries``, the plan's four entry columns ``(verify_slot_indices_ptr,
    verify_expected_tokens_ptr, verify_expected_positions_ptr,
    verify_prev_slot_indices_ptr)``."""
    _, _, table_rows, table_cols, _, _, _ = table
    req_to_verify_expected_tokens_ptr, _, pool_rows, pool_cols, token_offset = pool
    (
        verify_slot_indices_ptr,
        verify_expected_tokens_ptr,
        verify_expected_positions_ptr,
        verify_prev_slot_indices_ptr,
    ) = entries
    rp_ok = (rp >= 0) & (rp < table_rows)
    # Reads that would leave the table are not made: those slots become 0, untranslated.
    slot_read = in_range & rp_ok & (pos >= 0) & (pos < table_cols)
    slot = read_table(table, rp, pos, slot_read, TABLE, "evict_last")
    has_prev = pos > 0
    prev_read = in_range & rp_ok & has_prev & (pos <= table_cols)
    bits = tl.full([], 0, tl.int32)
    if HAS_LUT:
        slot, bad_slot = translate(slot, lut, slot_read)
        # LUT reads are random: where the lane to the left holds position pos - 1 of the
        # same row, take its translated slot instead of reading the LUT a second time.
        left = tl.maximum(tl.arange(0, BLOCK) - 1, 0)
        from_left = (tl.arange(0, BLOCK) > 0) & (tl.gather(row, left, 0) == row)
        prev_read &= ~from_left
        prev = read_table(table, rp, pos - 1, prev_read, TABLE, "")
        prev, bad_prev = translate(prev, lut, prev_read)
        prev = tl.where(from_left, tl.gather(slot, left, 0), prev)
        bits = any_bit(bad_slot | bad_prev, LUT_SLOT_BIT)
    else:
        prev = read_table(table, rp, pos - 1, prev_read, TABLE, "")
    prev = tl.where(has_prev, prev, NO_SLOT)
    if HAS_POOL:
        # q = pos + offset saturated at INT64_MAX (pos >= 0): no wrap, and a saturated q
        # fails q < valid_len exactly when the true sum would.
        q = tl.minimum(pos, INT64_MAX - tl.maximum(token_offset.to(tl.int64), 0)) + token_offset
        checked = in_range & (q >= 0) & (q < valid_len)
        checked &= (q < pool_cols) & (rp >= 0) & (rp < pool_rows)
        token = tl.load(
            req_to_verify_expected_tokens_ptr + rp * pool_cols + q,
            mask=checked,
            other=UNCHECKED_TOKEN,
        )
        token = token.to(tl.int64)
    else:
        token = tl.full([BLOCK], UNCHECKED_TOKEN, tl.int64)
    # Streaming stores: see translate().
    tl.store(verify_slot_indices_ptr + entry, slot, mask=in_range, cache_modifier=".cs")
    tl.store(verify_expected_tokens_ptr + entry, token, mask=in_range, cache_modifier=".cs")
    tl.store(verify_expected_positions_ptr + entry, pos, mask=in_range, cache_modifier=".cs")
    tl.store(verify_prev_slot_indices_ptr + entry, prev, mask=in_range, cache_modifier=".cs")
    return bits

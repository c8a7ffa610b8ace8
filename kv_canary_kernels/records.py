"""Triton helpers shared by the write and verify kernels: the contract's hashes in
unsigned 64-bit arithmetic, the real-KV hash, and the violation-ring append. Constants
come from :mod:`kv_canary_kernels.constants`."""

from __future__ import annotations

import triton
import triton.language as tl

from .constants import (
    CTX_OWNER,
    CTX_POSITION,
    CTX_REQ,
    CTX_W,
    MAX_CAPACITY,
    MODE_NONE,
    MODE_PARTIAL,
    MODE_PARTIAL_WIDE,
    MUL1,
    MUL2,
    PTX_HIGH1,
    PTX_HIGH2,
    PTX_PRODUCTS,
    REAL_KV_ROW_BAD,
    SHIFT1,
    SHIFT2,
    SHIFT3,
    SRC_ADDRESS,
    SRC_BPT,
    SRC_PAGE_SIZE,
    SRC_ROW_STRIDE,
    SRC_ROWS,
    SRC_W,
    SRC_WORDS,
    VIOL_AUX,
    VIOL_BITS,
    VIOL_CHAIN,
    VIOL_EXPECTED_TOKEN,
    VIOL_POSITION,
    VIOL_SLOT,
    VIOL_STORED_TOKEN,
    VIOL_TAG,
    VIOL_W,
)


@triton.jit
def sm(x, LATENCY: tl.constexpr = False):
    """The contract's ``sm`` on uint64 lanes (shifts are logical, products wrap).

    ``LATENCY``: for a serial chain (the write's), whose speed is this function's latency:
    the products in PTX where :data:`PTX_PRODUCTS` allows (see :func:`_product_halves`).
    Elsewhere the hashes are many and independent, and Triton's own products serve as well
    at a fraction of the compile time."""
    if LATENCY and PTX_PRODUCTS:
        lo = x.to(tl.uint32)
        hi = (x >> 32).to(tl.uint32)
        lo, hi = _xorshift_halves(lo, hi, SHIFT1)
        lo, hi = _product_halves(lo, hi, MUL1, PTX_HIGH1)
        lo, hi = _xorshift_halves(lo, hi, SHIFT2)
        lo, hi = _product_halves(lo, hi, MUL2, PTX_HIGH2)
        lo, hi = _xorshift_halves(lo, hi, SHIFT3)
        x = lo.to(tl.uint64) | (hi.to(tl.uint64) << 32)
    else:
        x ^= x >> SHIFT1
        x *= MUL1
        x ^= x >> SHIFT2
        x *= MUL2
        x ^= x >> SHIFT3
    return x


@triton.jit
def _xorshift_halves(lo, hi, S: tl.constexpr):
    """``x ^ (x >> S)`` of the uint64 ``x = hi:lo``, ``0 < S < 32``, on its uint32 halves."""
    return lo ^ ((lo >> S) | (hi << (32 - S))), hi ^ (hi >> S)


@triton.jit
def _product_halves(lo, hi, M: tl.constexpr, HIGH_PTX: tl.constexpr):
    """``x * M`` (mod 2**64) of the uint64 ``x = hi:lo``, on its uint32 halves;
    ``HIGH_PTX`` is ``M``'s string of :mod:`constants` (``PTX_HIGH1`` for ``MUL1``).

    The high half in PTX: written in Triton, LLVM fuses the three partial products into a
    chain of three dependent multiply-adds (IMAD.WIDE, IMAD, IMAD), while this order lets
    ptxas start ``lo * M_hi`` first. A write row's hash chain is serial, so this latency
    is its speed: 92 against 104 ns a ``mix3`` on the H200 (benchmarks/probes/write_chain_floor.py).
    """
    low = lo * tl.full(lo.shape, M & 0xFFFFFFFF, tl.uint32)
    # The multipliers as immediates in the text (PTX_HIGH1, PTX_HIGH2): as register
    # operands, ptxas merges this ``mul.hi`` with the low product into one IMAD.WIDE,
    # slower here.
    high = tl.inline_asm_elementwise(
        HIGH_PTX, "=r,r,r", [lo, hi], dtype=tl.uint32, is_pure=True, pack=1
    )
    return low, high


@triton.jit
def u64(x):
    """The int64 lanes ``x`` as uint64, same bits."""
    return x.to(tl.uint64, bitcast=True)


@triton.jit
def i64(x):
    """The uint64 lanes ``x`` as int64, same bits."""
    return x.to(tl.int64, bitcast=True)


@triton.jit
def mix3(a, b, c, LATENCY: tl.constexpr = False):
    """``sm(sm(sm(a) ^ b) ^ c)``: ``a`` uint64, ``b`` and ``c`` int64; returns uint64.
    ``LATENCY`` as for :func:`sm`."""
    return sm(sm(sm(a, LATENCY) ^ u64(b), LATENCY) ^ u64(c), LATENCY)


@triton.jit
def _source_at(source_table_ptr, k):
    """Row ``k`` of a ``RealKV``'s source table (``layout.SOURCE_TABLE_COLUMNS``), as int64
    scalars: ``(address, row_stride, rows, page_size, bpt_words, words)``. The same words
    for every lane (broadcast loads, from L1 after the first block): three 16-byte loads,
    the table's rows and columns being 16-byte aligned (a fresh allocation, 48-byte rows)."""
    tl.static_assert(
        (SRC_W % 2 == 0)
        & (SRC_ROW_STRIDE == SRC_ADDRESS + 1)
        & (SRC_PAGE_SIZE == SRC_ROWS + 1)
        & (SRC_WORDS == SRC_BPT + 1)
        & (SRC_ADDRESS % 2 == 0)
        & (SRC_ROWS % 2 == 0)
        & (SRC_BPT % 2 == 0)
    )
    row = source_table_ptr + k * SRC_W
    pair = tl.arange(0, 2)
    address, row_stride = tl.split(tl.load(row + SRC_ADDRESS + pair))
    rows, page_size = tl.split(tl.load(row + SRC_ROWS + pair))
    bpt_words, words = tl.split(tl.load(row + SRC_BPT + pair))
    return address, row_stride, rows, page_size, bpt_words, words


@triton.jit
def _divided(slot32, page_size):
    """``(slot // page_size, slot % page_size)`` (int64 lanes) of the lanes' slots as
    uint32 (``slot32``), for a page size ``>= 1``. In 32 bits: an in-range slot is below
    ``MAX_CAPACITY`` (the store's counters are int32), and a 64-bit division is a call to
    a subroutine on NVIDIA GPUs (a 32-bit one a dozen instructions inline); a page size
    past that is clamped to it, which leaves every in-range slot in page 0 as it would
    be. Lanes of other slots get values nobody reads."""
    divisor = tl.minimum(page_size, MAX_CAPACITY).to(tl.uint32)
    page = slot32 // divisor
    return page.to(tl.int64), (slot32 - page * divisor).to(tl.int64)


@triton.jit
def _placed(slot32, page_size, size, page, within):
    """``(page_size, slot // page_size, slot % page_size)`` of the slot lanes, from the
    same of another page size ``size``: the division only where the page size changes
    (the sources of one KV pool share theirs: one division for all of them)."""
    if page_size != size:
        page, within = _divided(slot32, page_size)
        size = page_size
    return size, page, within


@triton.jit
def _slot_pointers(source, page, within, mask):
    """Each lane's first word of its slot in ``source`` (a :func:`_source_at` row), the
    lanes of ``mask`` to read and those whose page row lies at or past the source (not
    read; no arithmetic on them: their offset is 0)."""
    address, row_stride, rows, _, bpt_words, _ = source
    row_bad = mask & (page >= rows)
    ok = mask & ~row_bad
    word = tl.where(ok, page * row_stride + within * bpt_words, 0)
    # Rows, slots and the source's start are 16-byte aligned (validated): tell the
    # compiler, so that a 16-byte read is one vector load.
    words = (address + word * 8).to(tl.pointer_type(tl.int64), bitcast=True)
    return tl.multiple_of(words, 16), ok, row_bad


@triton.jit
def _partial_where(source, live, slot32, mask, size, page, within):
    """Where a source's 16 bytes of each lane's slot lie (:func:`_slot_pointers`: nothing
    to read unless ``live``, a lane vector), and the page size state (:func:`_placed`).
    ``source``: a :func:`_source_at` row."""
    size, page, within = _placed(slot32, source[3], size, page, within)
    words, ok, row_bad = _slot_pointers(source, page, within, mask & live)
    return words, ok, row_bad, size, page, within


@triton.jit
def _pair_at(words, ok):
    """The two words at ``words`` of the lanes in ``ok`` (a ``[lanes, 2]`` pair, zeros
    elsewhere): one 16-byte load a lane."""
    return tl.load(words[:, None] + tl.arange(0, 2)[None, :], mask=ok[:, None], other=0)


@triton.jit
def _fold_pair(h, pair):
    """``sm(h ^ acc)`` with ``acc`` a PARTIAL source's hash of its two words."""
    w0, w1 = tl.split(pair)
    return sm(h ^ sm(sm(u64(w0)) ^ u64(w1)))


@triton.jit
def _all_words(words, ok, kv_words, CHUNK: tl.constexpr):
    """One source's hash of ``kv_words`` words from each lane's ``words`` (mode ALL).

    CHUNK words a slot at a time, as one [slots, CHUNK] tile: lanes of a warp read
    neighbouring 16-byte pieces of a slot (coalesced) instead of one word of 32 slots
    each; the chain then takes the tile's words in order."""
    acc = tl.zeros(words.shape, tl.uint64)
    cols = tl.arange(0, CHUNK)
    for k in range(0, kv_words, CHUNK):
        tile = tl.load(
            words[:, None] + k + cols[None, :],
            mask=ok[:, None] & (k + cols[None, :] < kv_words),
            other=0,
        )
        if CHUNK == 8:
            chunk = _words8(tl.reshape(tile, [words.shape[0], 2, 2, 2]))
        elif CHUNK == 16:
            chunk = _words16(tl.reshape(tile, [words.shape[0], 2, 2, 2, 2]))
        else:
            chunk = _words32(tl.reshape(tile, [words.shape[0], 2, 2, 2, 2, 2]))
        for j in tl.static_range(CHUNK):
            acc = tl.where(k + j < kv_words, sm(acc ^ u64(chunk[j])), acc)
    return acc


@triton.jit
def _words8(t):
    """The eight words of ``t`` ([n, 2, 2, 2], word ``4a + 2b + c`` at ``[:, a, b, c]``),
    in order, as eight [n] tensors."""
    even, odd = tl.split(t)
    e0, e1 = tl.split(even)
    o0, o1 = tl.split(odd)
    w0, w4 = tl.split(e0)
    w2, w6 = tl.split(e1)
    w1, w5 = tl.split(o0)
    w3, w7 = tl.split(o1)
    return w0, w1, w2, w3, w4, w5, w6, w7


@triton.jit
def _words16(t):
    """The same for sixteen words ([n, 2, 2, 2, 2])."""
    even, odd = tl.split(t)
    e = _words8(even)
    o = _words8(odd)
    return (  # word 2k is e[k], word 2k + 1 is o[k]
        e[0], o[0], e[1], o[1], e[2], o[2], e[3], o[3], e[4], o[4], e[5], o[5], e[6], o[6],
        e[7], o[7],
    )  # fmt: skip


@triton.jit
def _words32(t):
    """The same for thirty-two words ([n, 2, 2, 2, 2, 2])."""
    even, odd = tl.split(t)
    e = _words16(even)
    o = _words16(odd)
    return (  # word 2k is e[k], word 2k + 1 is o[k]
        e[0], o[0], e[1], o[1], e[2], o[2], e[3], o[3], e[4], o[4], e[5], o[5], e[6], o[6],
        e[7], o[7], e[8], o[8], e[9], o[9], e[10], o[10], e[11], o[11], e[12], o[12],
        e[13], o[13], e[14], o[14], e[15], o[15],
    )  # fmt: skip


@triton.jit
def real_kv_hash(slot, mask, kv, MODE: tl.constexpr, CHUNK: tl.constexpr):
    """The contract's ``real_kv(s)`` for in-range slot lanes in ``mask`` (uint64), and the
    lanes whose page row lies past some source (their hash is unspecified).

    ``kv``: ``(source_table_ptr, num_sources)``, a ``RealKV``'s source table (each
    source's address and geometry, ``layout.SOURCE_TABLE_COLUMNS``) and its rows (at
    least one), as the kernels take them: any number of sources is one compiled variant,
    walked in order with a runtime count. PARTIAL takes the sources two at a time
    (``MODE_PARTIAL_WIDE``, for more than two sources: four), their loads issued together
    before their hashes (one memory round trip a group, as a kernel with the sources
    unrolled would); ALL one at a time, each in CHUNK-word tiles. ``MODE``: the kernels'
    (``sources.py``)."""
    source_table_ptr, num_sources = kv
    # The page size state of the first source: the others divide only where theirs differ.
    slot32 = slot.to(tl.uint32)
    size = tl.load(source_table_ptr + SRC_PAGE_SIZE)
    page, within = _divided(slot32, size)
    h = tl.zeros(slot.shape, tl.uint64)
    bad = mask & ~mask
    if MODE == MODE_PARTIAL or MODE == MODE_PARTIAL_WIDE:
        STEP: tl.constexpr = 4 if MODE == MODE_PARTIAL_WIDE else 2
        for k in range(0, num_sources, STEP):
            # The group's rows of the table first (past the last source: the last again),
            # then where each source's bytes lie, then their loads, then their hashes: the
            # loads of a group are in flight together.
            last = num_sources - 1
            lane_k = tl.zeros_like(slot) + k  # lanes: a scalar mask is not a bool
            s0 = _source_at(source_table_ptr, k)
            s1 = _source_at(source_table_ptr, tl.minimum(k + 1, last))
            if STEP == 4:
                s2 = _source_at(source_table_ptr, tl.minimum(k + 2, last))
                s3 = _source_at(source_table_ptr, tl.minimum(k + 3, last))
            w0, o0, b0, size, page, within = _partial_where(
                s0, lane_k < num_sources, slot32, mask, size, page, within
            )
            w1, o1, b1, size, page, within = _partial_where(
                s1, lane_k + 1 < num_sources, slot32, mask, size, page, within
            )
            if STEP == 4:
                w2, o2, b2, size, page, within = _partial_where(
                    s2, lane_k + 2 < num_sources, slot32, mask, size, page, within
                )
                w3, o3, b3, size, page, within = _partial_where(
                    s3, lane_k + 3 < num_sources, slot32, mask, size, page, within
                )
            p0 = _pair_at(w0, o0)
            p1 = _pair_at(w1, o1)
            if STEP == 4:
                p2 = _pair_at(w2, o2)
                p3 = _pair_at(w3, o3)
            bad |= b0 | b1
            h = _fold_pair(h, p0)
            if k + 1 < num_sources:
                h = _fold_pair(h, p1)
            if STEP == 4:
                bad |= b2 | b3
                if k + 2 < num_sources:
                    h = _fold_pair(h, p2)
                if k + 3 < num_sources:
                    h = _fold_pair(h, p3)
    else:
        for k in range(num_sources):
            source = _source_at(source_table_ptr, k)
            size, page, within = _placed(slot32, source[3], size, page, within)
            words, ok, row_bad = _slot_pointers(source, page, within, mask)
            h = sm(h ^ _all_words(words, ok, source[5], CHUNK))
            bad |= row_bad
    return h, bad


@triton.jit
def real_kv_or_zero(slot, ok, flags, kv, MODE: tl.constexpr, CHUNK: tl.constexpr):
    """``real_kv(s)`` (int64) of the lanes in ``ok``, zeros without a hash (``MODE``
    NONE); ``ok`` less the lanes whose page row lies past a source, whose bit goes into
    ``flags``. ``kv`` as for :func:`real_kv_hash`. (A launch's sources cover its store,
    checked on the host: the row test is a bounds check behind that rule.)"""
    if MODE != MODE_NONE:
        kv_hash, row_bad = real_kv_hash(slot, ok, kv, MODE, CHUNK)
        flags |= tl.where(row_bad, REAL_KV_ROW_BAD, 0)
        ok &= ~row_bad
        kv_hash = i64(kv_hash)
    else:
        kv_hash = tl.zeros(slot.shape, tl.int64)
    return kv_hash, ok, flags


@triton.jit
def store_rows(keep, index, columns, context, violations_ptr, violation_context_ptr):
    """Store one violation row and its context row per lane in ``keep`` at ring row
    ``index`` (``columns``, ``context``: as for :func:`append_violations`)."""
    tag, slot, position, stored_token, expected_token, chain, aux, bits = columns
    request, expected_position, owner = context
    row = violations_ptr + index * VIOL_W
    tl.store(row + VIOL_TAG, tl.zeros_like(slot) + tag, mask=keep)
    tl.store(row + VIOL_SLOT, slot, mask=keep)
    tl.store(row + VIOL_POSITION, position, mask=keep)
    tl.store(row + VIOL_STORED_TOKEN, stored_token, mask=keep)
    tl.store(row + VIOL_EXPECTED_TOKEN, expected_token, mask=keep)
    tl.store(row + VIOL_CHAIN, chain, mask=keep)
    tl.store(row + VIOL_AUX, aux, mask=keep)
    tl.store(row + VIOL_BITS, bits.to(tl.int64), mask=keep)
    ctx = violation_context_ptr + index * CTX_W
    tl.store(ctx + CTX_REQ, request, mask=keep)
    tl.store(ctx + CTX_POSITION, expected_position, mask=keep)
    tl.store(ctx + CTX_OWNER, owner, mask=keep)


@triton.jit
def append_violations(bad, columns, context, store):
    """Append one row per lane in ``bad``: ``columns`` holds the row's columns in ring
    order (``launch_tag, slot, position, stored_token, expected_token, stored_chain_hash,
    expected_aux, fail_bits``; the tag a scalar, the rest lanes), ``context`` its context
    row (``req_pool_index, expected_position, owner``, lanes), stored at the same index
    of ``violation_context``; ``store`` is the store's ``(records_ptr, violations_ptr,
    violation_count_ptr, violation_capacity, owners_ptr, violation_context_ptr)``.

    One predicated atomic per lane reserves its ring index, rows past the capacity are
    counted but not stored (fill once), nor is their context. No reduction, no branch and
    no shared memory: a clean step (no lane in ``bad``) pays a few predicated-off
    instructions (the verify and the write's walks go further: they append only from a
    replay that runs when a lane failed). A step with violations on most lanes serializes
    its atomics on one counter, which is the cost of a badly broken engine, not of a
    healthy one."""
    violations_ptr, violation_count_ptr, violation_capacity = store[1], store[2], store[3]
    slot = columns[1]
    # Every atomic of the kernels is relaxed (but the one-launch plan's sync words in
    # large_batch.py, which order its programs): Triton's default (acq_rel) compiles to a
    # MEMBAR.GPU (waiting for every store in flight) and an L1 invalidate around each one,
    # about 0.6 us a decode write on the H200. Nothing orders memory through these words:
    # readers are later kernels or the host after a sync.
    index = tl.atomic_add(
        violation_count_ptr + tl.zeros_like(slot),
        tl.full(slot.shape, 1, tl.int64),
        mask=bad,
        sem="relaxed",
    )
    store_rows(
        bad & (index < violation_capacity), index, columns, context, violations_ptr, store[5]
    )


@triton.jit
def raise_status(status_ptr, flags):
    """OR the lanes' status bits (int32) into the store's status word: one predicated
    atomic per lane that has bits, none on a clean step. A reduction across the block
    first would cost every program a shared-memory round and two barriers at its end
    (measured on the H200: 0.1 to 0.3 us a verify launch); lanes with bits are the rare
    case of out-of-range data."""
    tl.atomic_or(status_ptr + tl.zeros_like(flags), flags, mask=flags != 0, sem="relaxed")

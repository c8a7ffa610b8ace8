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
    MODE_PARTIAL,
    MUL1,
    MUL2,
    PTX_HIGH1,
    PTX_HIGH2,
    PTX_PRODUCTS,
    REAL_KV_ROW_BAD,
    SHIFT1,
    SHIFT2,
    SHIFT3,
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
def source_hash(
    src_ptr,
    row_stride_words,
    src_rows,
    page,
    first_word,
    mask,
    kv_words,
    MODE: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One source's hash of the slots' bytes (uint64 lanes) and the lanes whose page row
    lies at or past the source (not read). ``first_word``: word offset within the row."""
    row_bad = mask & (page >= src_rows)
    ok = mask & ~row_bad
    words = src_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    # Rows, tokens and the source's start are 16-byte aligned (validated): tell the
    # compiler, so that a 16-byte read is one vector load.
    offset = tl.multiple_of(page * row_stride_words + first_word, 2)
    base = words + offset
    acc = tl.zeros(page.shape, tl.uint64)
    if MODE == MODE_PARTIAL:
        pair = tl.load(base[:, None] + tl.arange(0, 2)[None, :], mask=ok[:, None], other=0)
        w0, w1 = tl.split(pair)
        acc = sm(acc ^ u64(w0))
        acc = sm(acc ^ u64(w1))
    else:
        # CHUNK words a slot at a time, as one [slots, CHUNK] tile: lanes of a warp read
        # neighbouring 16-byte pieces of a slot (coalesced) instead of one word of 32
        # slots each; the chain then takes the tile's words in order.
        cols = tl.arange(0, CHUNK)
        for k in range(0, kv_words, CHUNK):
            tile = tl.load(
                base[:, None] + k + cols[None, :],
                mask=ok[:, None] & (k + cols[None, :] < kv_words),
                other=0,
            )
            if CHUNK == 8:
                chunk = _words8(tl.reshape(tile, [page.shape[0], 2, 2, 2]))
            elif CHUNK == 16:
                chunk = _words16(tl.reshape(tile, [page.shape[0], 2, 2, 2, 2]))
            else:
                chunk = _words32(tl.reshape(tile, [page.shape[0], 2, 2, 2, 2, 2]))
            for j in tl.static_range(CHUNK):
                acc = tl.where(k + j < kv_words, sm(acc ^ u64(chunk[j])), acc)
    return acc, row_bad


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
def real_kv_hash(
    slot, mask, kv, NUM_SOURCES: tl.constexpr, MODE: tl.constexpr, CHUNK: tl.constexpr
):
    """The contract's ``real_kv(s)`` for in-range slot lanes in ``mask`` (uint64), and the
    lanes whose page row lies past some source (their hash is unspecified).

    ``kv``: the real-KV geometry, ``(page_size, bpt_words, kv_words, sources, strides,
    rows)``, the last three four-tuples (each source's pointer, row stride in words and
    row count; the first ``NUM_SOURCES`` are read), as the kernels take them."""
    page_size, bpt_words, kv_words, sources, strides, rows = kv
    page = slot // page_size
    first_word = (slot % page_size) * bpt_words
    h = tl.zeros(slot.shape, tl.uint64)
    bad = mask & ~mask
    for i in tl.static_range(NUM_SOURCES):
        a, b = source_hash(
            sources[i], strides[i], rows[i], page, first_word, mask, kv_words, MODE, CHUNK
        )
        h = sm(h ^ a)
        bad |= b
    return h, bad


@triton.jit
def real_kv_or_zero(
    slot, ok, flags, kv, NUM_SOURCES: tl.constexpr, MODE: tl.constexpr, CHUNK: tl.constexpr
):
    """``real_kv(s)`` (int64) of the lanes in ``ok``, zeros without sources; ``ok`` less
    the lanes whose page row lies past a source, whose bit goes into ``flags``. ``kv`` as
    for :func:`real_kv_hash`."""
    if NUM_SOURCES > 0:
        kv_hash, row_bad = real_kv_hash(slot, ok, kv, NUM_SOURCES, MODE, CHUNK)
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

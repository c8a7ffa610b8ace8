"""What the write and verify benchmarks compare the library's kernels against.

- :class:`TorchVerify`: the verify stage in torch with static shapes (one lane per
  ``verify_capacity`` entry, masks instead of data-dependent sizes, violation rows placed
  with ``searchsorted`` instead of ``nonzero``): no sync, so it can be captured in a CUDA
  graph. Same records, ring rows (in entry order, like ``verify_reference``) and counters
  as the contract for in-range data; out-of-range entries are skipped without a status bit.
- :func:`verify_traffic` and :func:`write_traffic`: not implementations but references
  timed the same way: Triton kernels that make only the stage's unavoidable memory accesses
  and no logic (no hash, no chain, no checks). Each program also stores one word (the sum
  of what it loaded) to ``sink[program]`` so that no load can be dropped; the smoke mode
  checks those sums against torch.

All assume valid data and are benchmark baselines only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kv_canary_buffers import CanaryStore, PlanBuffers, RealKV
from kv_canary_buffers.hashing import H0_SIGNED, mix3, sm
from kv_canary_buffers.layout import POSITION, PREV_HASH, REAL_KV_HASH, TOKEN

# --- torch-only verify ----------------------------------------------------------------


def _source_words(real_kv: RealKV | None) -> tuple[list[torch.Tensor], int, int, int]:
    """The sources as int64 words ``[rows, words]``, words hashed per slot and source,
    words per token, page size. The baselines take 2-D sources of one geometry (the
    benchmark's)."""
    if real_kv is None or real_kv.hashed_bytes == 0:
        return [], 0, 0, 1
    first = real_kv.sources[0]
    geometry = {(s.page_size, s.bytes_per_token, s.read_bytes) for s in real_kv.sources}
    assert len(geometry) == 1, "the baselines take sources of one geometry"
    words = []
    for src in real_kv.tensors:
        w = src.view(torch.int64)
        assert w.dim() == 2 and w.shape[0] == src.shape[0]
        words.append(w)
    per_source = real_kv.hashed_bytes // len(words)
    return words, per_source // 8, first.bytes_per_token // 8, first.page_size


class TorchVerify:
    """``launch_verify(store, buffers, launch_tag=..., check_expected_tokens=...,
    real_kv=...)`` in torch, capturable: call the object. Every tensor it needs beyond the
    store and the buffers is made here, never during a call."""

    def __init__(
        self,
        store: CanaryStore,
        buffers: PlanBuffers,
        *,
        launch_tag: int = 0,
        check_expected_tokens: bool = True,
        real_kv: RealKV | None = None,
    ):
        self.store, self.buffers = store, buffers
        self.launch_tag = launch_tag
        self.check_tokens = check_expected_tokens
        self.words, self.kv_words, self.bpt_words, self.page_size = _source_words(real_kv)
        self.min_rows = min((w.shape[0] for w in self.words), default=0)
        device = store.device
        self.lanes = torch.arange(buffers.verify_capacity, device=device)
        self.ring_rows = torch.arange(store.violation_capacity, device=device)
        self.unchecked = torch.full(
            (buffers.verify_capacity,), -1, dtype=torch.int64, device=device
        )

    def real_kv(self, slot: torch.Tensor, ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The contract's ``real_kv(s)`` per lane, and ``ok`` less the lanes whose page row
        lies past a source."""
        h = torch.zeros_like(slot)
        if not self.words:
            return h, ok
        page = torch.div(slot, self.page_size, rounding_mode="floor")
        ok = ok & (page < self.min_rows)
        page = torch.where(ok, page, 0)
        first = (slot - page * self.page_size) * self.bpt_words
        first = torch.where(ok, first, 0)
        for words in self.words:
            acc = torch.zeros_like(slot)
            for k in range(self.kv_words):
                acc = sm(acc ^ words[page, first + k])
            h = sm(h ^ acc)
        return h, ok

    def __call__(self) -> None:
        st, b = self.store, self.buffers
        cap, num_slots = b.verify_capacity, st.num_slots
        enabled = b.verify_enable != 0
        n = torch.where(enabled, b.verify_num_valid.long().clamp(0, cap), 0)  # [1]
        slot = b.verify_slot_indices
        prev = b.verify_prev_slot_indices
        ok = (self.lanes < n) & (slot > 0) & (slot < num_slots) & (prev < num_slots)
        kv, ok = self.real_kv(torch.where(ok, slot, 0), ok)
        s = torch.where(ok, slot, 0)
        rec = st.records.index_select(0, s)
        r_tok, r_pos, r_prev, r_kv = (
            rec[:, TOKEN],
            rec[:, POSITION],
            rec[:, PREV_HASH],
            rec[:, REAL_KV_HASH],
        )
        p = torch.where(ok & (prev > 0), prev, 0)
        prec = st.records.index_select(0, p)
        chain = torch.where(
            prev < 0, H0_SIGNED, mix3(prec[:, PREV_HASH], prec[:, TOKEN], prec[:, POSITION])
        )
        reachable = prev != 0
        expected_chain = torch.where(reachable, chain, r_prev)
        want_tok = b.verify_expected_tokens if self.check_tokens else self.unchecked
        bits = (
            torch.where(reachable & (r_prev != expected_chain), 1, 0)
            | torch.where(r_pos != b.verify_expected_positions, 2, 0)
            | torch.where(r_kv != kv, 4, 0)
            | torch.where((want_tok != -1) & (r_tok != want_tok), 32, 0)
        )
        hit = ok & (bits != 0)
        # Ring row count + k takes the lane of the (k+1)-th hit: no nonzero, no sync.
        csum = torch.cumsum(hit.long(), 0)
        total = csum[-1:]
        k = self.ring_rows - st.violation_count
        fill = (k >= 0) & (k < total)
        lane = torch.searchsorted(csum, (k + 1).clamp_min(1)).clamp_max(cap - 1)
        columns = (s, r_pos, r_tok, want_tok, r_prev, expected_chain, bits)
        new = torch.stack(
            [torch.full_like(lane, self.launch_tag)] + [c.index_select(0, lane) for c in columns],
            dim=1,
        )
        st.violations.copy_(torch.where(fill[:, None], new, st.violations))
        st.violation_count.add_(total)
        st.kernel_runs.add_(1)
        st.slots_processed.add_(n)


# --- traffic-only verify ---------------------------------------------------------------
VERIFY_TRAFFIC_BLOCK = 256
"""Entries per program (NONE and PARTIAL), like the verify kernel's blocks."""
VERIFY_TRAFFIC_ALL_BLOCK = 16
"""Entries per program in mode ALL: a [16, words] tile, each slot's bytes read as one
contiguous row (coalesced, 16-byte vectors) instead of a word per lane and step."""
VERIFY_TRAFFIC_WARPS = 4


@triton.jit(do_not_specialize=["n", "page_size", "bpt_words", "stride0", "stride1"])
def _verify_traffic_kernel(
    slot_ptr,
    token_ptr,
    position_ptr,
    prev_ptr,
    records_ptr,
    src0,
    src1,
    sink_ptr,
    count_ptr,
    n,
    page_size,
    bpt_words,
    stride0,
    stride1,
    NUM_SOURCES: tl.constexpr,
    WORDS: tl.constexpr,
    BOTH_RECORDS: tl.constexpr,
    COUNT_ON_DEVICE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    if COUNT_ON_DEVICE:
        n = tl.minimum(tl.load(count_ptr).to(tl.int64), n)
    m = idx < n
    slot = tl.load(slot_ptr + idx, mask=m, other=0)
    prev = tl.load(prev_ptr + idx, mask=m, other=0)
    token = tl.load(token_ptr + idx, mask=m, other=0)
    position = tl.load(position_ptr + idx, mask=m, other=0)
    acc = slot ^ prev ^ token ^ position
    four = tl.arange(0, 4)
    rec = tl.load(records_ptr + slot[:, None] * 4 + four[None, :], mask=m[:, None], other=0)
    acc += tl.sum(rec, 1)
    if BOTH_RECORDS:
        has_prev = m & (prev > 0)
        prec = tl.load(
            records_ptr + tl.maximum(prev, 0)[:, None] * 4 + four[None, :],
            mask=has_prev[:, None],
            other=0,
        )
        acc += tl.sum(prec, 1)
    if NUM_SOURCES > 0:
        page = slot // page_size
        first = (slot % page_size) * bpt_words
        words = tl.arange(0, WORDS)
        kv = tl.load(
            src0 + (page * stride0 + first)[:, None] + words[None, :], mask=m[:, None], other=0
        )
        acc += tl.sum(kv, 1)
        if NUM_SOURCES > 1:
            kv = tl.load(
                src1 + (page * stride1 + first)[:, None] + words[None, :], mask=m[:, None], other=0
            )
            acc += tl.sum(kv, 1)
    acc = tl.where(m, acc, 0)
    tl.store(sink_ptr + pid, tl.sum(acc, 0))


def verify_traffic_grid(entries: int, real_kv: RealKV | None) -> int:
    """Programs of :func:`verify_traffic` (the size its ``sink`` needs)."""
    sources = 0 if real_kv is None else len(real_kv.sources)
    all_mode = sources > 0 and real_kv is not None and real_kv.hashed_bytes > 16 * sources
    return max(
        1, triton.cdiv(entries, VERIFY_TRAFFIC_ALL_BLOCK if all_mode else VERIFY_TRAFFIC_BLOCK)
    )


def verify_traffic(
    store: CanaryStore,
    buffers: PlanBuffers,
    entries: int,
    sink: torch.Tensor,
    *,
    real_kv: RealKV | None = None,
    both_records: bool = False,
    count_on_device: bool = False,
) -> None:
    """The verify stage's memory accesses for the first ``entries`` entries of a plan: the
    four entry columns it reads (slot, expected position, predecessor, expected token), the
    slot's 32-byte record, the hashed bytes of each real-KV source (16 bytes in PARTIAL,
    ``read_bytes`` in ALL, as one contiguous row per slot) and, with ``both_records``, the
    predecessor's record too (SGLang's verify reads both). With ``count_on_device``, each
    program first reads the plan's ``verify_num_valid`` (at most ``entries`` are used), as
    a kernel must that runs with no sync and replays in a CUDA graph with refilled inputs:
    the entry columns wait for that read. At most 2 sources; the hashed words per source
    must be a power of two. ``sink``: int64, at least :func:`verify_traffic_grid` words."""
    words, kv_words, bpt_words, page_size = _source_words(real_kv)
    assert len(words) <= 2 and (kv_words & (kv_words - 1)) == 0
    grid = verify_traffic_grid(entries, real_kv)
    assert sink.numel() >= grid and sink.dtype == torch.int64
    stand_in = store.records
    src = list(words) + [stand_in] * (2 - len(words))
    strides = [w.stride(0) for w in words] + [0] * (2 - len(words))
    block = VERIFY_TRAFFIC_ALL_BLOCK if kv_words > 2 else VERIFY_TRAFFIC_BLOCK
    _verify_traffic_kernel[(grid,)](
        buffers.verify_slot_indices,
        buffers.verify_expected_tokens,
        buffers.verify_expected_positions,
        buffers.verify_prev_slot_indices,
        store.records,
        src[0],
        src[1],
        sink,
        buffers.verify_num_valid,
        entries,
        page_size,
        bpt_words,
        strides[0],
        strides[1],
        NUM_SOURCES=len(words),
        WORDS=max(kv_words, 1),
        BOTH_RECORDS=both_records,
        COUNT_ON_DEVICE=count_on_device,
        BLOCK=block,
        num_warps=VERIFY_TRAFFIC_WARPS,
    )


def verify_traffic_expected(
    store: CanaryStore,
    buffers: PlanBuffers,
    entries: int,
    *,
    real_kv: RealKV | None = None,
    both_records: bool = False,
) -> torch.Tensor:
    """What :func:`verify_traffic` sums (int64, wrapping): for the smoke checks."""
    b = buffers
    sl = b.verify_slot_indices[:entries]
    pv = b.verify_prev_slot_indices[:entries]
    acc = sl ^ pv ^ b.verify_expected_tokens[:entries] ^ b.verify_expected_positions[:entries]
    acc = acc + store.records.index_select(0, sl).sum(1)
    if both_records:
        prec = store.records.index_select(0, pv.clamp_min(0)).sum(1)
        acc = acc + torch.where(pv > 0, prec, 0)
    words, kv_words, bpt_words, page_size = _source_words(real_kv)
    for w in words:
        page = torch.div(sl, page_size, rounding_mode="floor")
        first = (sl % page_size) * bpt_words
        for k in range(kv_words):
            acc = acc + w[page, first + k]
    return acc.sum()


# --- traffic-only write ------------------------------------------------------------------
WRITE_TRAFFIC_BLOCK = 128
WRITE_TRAFFIC_WARPS = 4


@triton.jit(do_not_specialize=["n", "num_rows", "token_programs"])
def _write_traffic_kernel(
    ids_ptr,
    pos_ptr,
    ocl_ptr,
    offsets_ptr,
    seeds_ptr,
    records_ptr,
    out_records_ptr,
    sink_ptr,
    n,
    num_rows,
    token_programs,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    four = tl.arange(0, 4)
    if pid < token_programs:
        # per token: read id, position and slot, write the slot's 32-byte record
        idx = pid * BLOCK + tl.arange(0, BLOCK)
        m = idx < n
        slot = tl.load(ocl_ptr + idx, mask=m, other=0)
        token = tl.load(ids_ptr + idx, mask=m, other=0)
        position = tl.load(pos_ptr + idx, mask=m, other=0)
        col = four[None, :]
        rec = tl.where(
            col == 0,
            token[:, None],
            tl.where(
                col == 1, position[:, None], tl.where(col == 2, (token ^ position)[:, None], 0)
            ),
        )
        tl.store(out_records_ptr + slot[:, None] * 4 + col, rec, mask=m[:, None])
    else:
        # per row: read its offsets and seed, and the seed's record (token, position, prev)
        rows = (pid - token_programs) * BLOCK + tl.arange(0, BLOCK)
        m = rows < num_rows
        lo = tl.load(offsets_ptr + rows, mask=m, other=0)
        hi = tl.load(offsets_ptr + rows + 1, mask=m, other=0)
        seed = tl.load(seeds_ptr + rows, mask=m, other=-1)
        seeded = m & (seed >= 0) & (hi > lo)
        srec = tl.load(
            records_ptr + tl.maximum(seed, 0)[:, None] * 4 + four[None, :],
            mask=seeded[:, None] & (four[None, :] < 3),
            other=0,
        )
        acc = tl.where(m, (lo ^ hi ^ seed) + tl.sum(srec, 1), 0)
        tl.store(sink_ptr + pid, tl.sum(acc, 0))


def write_traffic_grid(n: int, num_rows: int) -> tuple[int, int]:
    """(token programs, all programs) of :func:`write_traffic`."""
    token_programs = triton.cdiv(n, WRITE_TRAFFIC_BLOCK)
    return token_programs, token_programs + max(1, triton.cdiv(num_rows, WRITE_TRAFFIC_BLOCK))


def write_traffic(
    store: CanaryStore,
    buffers: PlanBuffers,
    num_rows: int,
    out_records: torch.Tensor,
    sink: torch.Tensor,
    *,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """The write stage's memory accesses for a plan of ``num_rows`` rows: per token, its
    id, position and slot read and a 32-byte record written at the slot (into
    ``out_records``, int64 ``[num_slots, 4]``, so that the store stays valid); per row,
    its offsets, its seed and the seed's record read from the store. Token-parallel: no
    chain. Every slot must be in range. ``sink``: int64, at least
    ``write_traffic_grid(n, num_rows)[1]`` words (row programs store there)."""
    n = out_cache_loc.shape[0]
    token_programs, grid = write_traffic_grid(n, num_rows)
    assert sink.numel() >= grid and out_records.shape == store.records.shape
    _write_traffic_kernel[(grid,)](
        input_ids,
        positions,
        out_cache_loc,
        buffers.write_offsets,
        buffers.write_seed_slot_indices,
        store.records,
        out_records,
        sink,
        n,
        num_rows,
        token_programs,
        BLOCK=WRITE_TRAFFIC_BLOCK,
        num_warps=WRITE_TRAFFIC_WARPS,
    )


def write_traffic_expected(store: CanaryStore, buffers: PlanBuffers, num_rows: int) -> torch.Tensor:
    """What the row programs of :func:`write_traffic` sum (int64, wrapping)."""
    lo = buffers.write_offsets[:num_rows]
    hi = buffers.write_offsets[1 : num_rows + 1]
    seed = buffers.write_seed_slot_indices[:num_rows]
    seeded = (seed >= 0) & (hi > lo)
    srec = store.records.index_select(0, seed.clamp_min(0))[:, :3].sum(1)
    return ((lo ^ hi ^ seed) + torch.where(seeded, srec, 0)).sum()


def verify_bytes(entries: int, real_kv: RealKV | None) -> int:
    """Bytes a verify of ``entries`` entries must move: per entry the four entry columns
    (slot, expected position, predecessor, expected token: 32 bytes), the slot's record
    (32) and the hashed bytes of each source."""
    hashed = 0 if real_kv is None else real_kv.hashed_bytes  # all sources together
    return entries * (32 + 32 + hashed)


def write_bytes(n: int, num_rows: int, seeded_rows: int) -> int:
    """Bytes a write must move: per token its id, position and slot (24), its record (32,
    written) and its owner (8, written); per row an offset, a seed and its request (24);
    per seeded row the seed's token, position and chain hash (24)."""
    return n * (24 + 32 + 8) + num_rows * 24 + seeded_rows * 24


def multiset(rows: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    return sorted(tuple(int(v) for v in r) for r in rows)

"""The differential harness: one engine-shaped history run through SGLang 0.5.23's torch
references and through this project's two paths (the torch references and the Triton
kernels), every output compared after every call.

A *scenario* is a short run of one KV pool: a prefill of every request's prefix (the
history), a step that verifies the prefix and writes the step's tokens, and a decode plan
whose verify covers what the step wrote. Between the history and the step a corruption may
be applied to the records, the KV bytes, the expected tokens or the step's inputs, the same
on every side. Each side keeps its own record store, starting from the same junk bytes;
the real-KV sources are the engine's tensors, read by all sides.

What is compared (``docs/porting-sglang.md`` gives the correspondence):

- plan: ``write_offsets`` (all ``write_req_capacity + 1`` elements),
  ``write_seed_slot_indices[:bs]``, ``write_num_valid_reqs``, ``verify_num_valid``,
  ``enable`` / ``verify_enable`` and, when enabled, the four entry arrays up to
  ``verify_num_valid``, against SGLang's ``plan_ref``; and (``run_plan_only``) all but the
  entries against SGLang's Triton offsets kernel, run in the interpreter;
- write and verify: the records byte for byte (``CanaryStore.records.view(uint8)`` against
  SGLang's ``canary_buf``), the violation rows each call appended (in order for the
  references; as a multiset for the kernels, whose row order within a call is unspecified),
  the violation count and both counters.

Inputs are generated inside the range both implementations define the same way; each
deliberate difference is kept out with a comment naming it (and listed in
``docs/porting-sglang.md``, "Where this project deliberately differs"):

- [D1] no ``extend_seq_lens`` above ``2**32`` (this project clamps a row's write count);
- [D2] no data outside the tables or the store: active rows' ``req_pool_indices`` inside the
  table and the token pool, ``prefix_lens <= max_seq_len``, valid lengths ``<= pool_cols``,
  LUT lookups inside the LUT, slots and seeds inside the store, real-KV rows inside every
  source (SGLang's references index Python-style there: a negative index wraps, a large one
  raises; this project's references raise and its kernels skip and flag a status bit);
- [D3] no two rows of one write call writing one slot or seeding from a slot another row
  writes (unspecified in this project's contract; SGLang's reference runs rows in order);
- [D4] positions far from ``2**63 - 1`` (the chain-position check's ``prev + 1`` wraps here,
  not in SGLang's Python reference);
- [D5] ``bs <= write_req_capacity`` and valid lengths only with a token pool (host-side
  errors here, silently truncated or ignored by SGLang's reference).
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field
from typing import Any

import torch

from kv_canary_buffers import (
    CanaryStore,
    PlanBuffers,
    RealKV,
    RealKVMode,
    RealKVSource,
    plan_reference,
    verify_reference,
    write_reference,
)
from kv_canary_kernels import launch_plan, launch_verify, launch_write
from tests.sglang.sglang_refs import SglangRefs

I64, I32, U8 = torch.int64, torch.int32, torch.uint8
JUNK = -7777
"""Poison of plan outputs before a plan: an element a plan should write and did not shows."""
KERNEL_RING = 512
"""Ring rows of SGLang's log and of the kernel stores: which rows an overflowing ring keeps
is unspecified for the kernels, so theirs never overflows; the reference stores keep
``Spec.ring`` rows and are compared with SGLang's first that many (both fill once)."""
CORRUPTIONS = ("none", "record", "kv", "pool", "input", "reuse", "skip")
"""What is changed between the history and the step: nothing; a record's position; KV bytes
a real-KV mode hashes; an expected token of the pool; a token or position of the step's
inputs; a slot of a verified prefix written by another row (a page handed out twice); or
step tokens not written (``out_cache_loc = -1``) that the decode plan then verifies."""


# --- scenario ------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """What a scenario exercises; the rest is drawn from ``seed``."""

    seed: int
    mode: int = 0
    """RealKVMode / RealKvHashMode: 0 NONE, 1 PARTIAL, 2 ALL."""
    swa: bool = False
    corruption: str = "none"
    pool: bool = True
    """An expected-token pool with valid lengths."""
    expected_inputs: bool = True
    """The write's input check (``expected_input_ids`` / ``enable_write_input_assert``)."""
    chain_check: bool = True
    """The chain-position check (``chain_position_check`` / ``enable_chain_position_assert``)."""
    overflow: bool = False
    """The step's verify capacity one short of its entries."""
    ring: int = 64
    """Violation ring rows of this project's reference store (see :data:`KERNEL_RING`)."""
    holes: bool = False
    """``req_to_token`` entries of 0 (unfilled: the padding slot) and -1 (no slot) in the
    active rows (plans only: a write would then give slot 0 to several rows, [D3])."""

    def __str__(self) -> str:
        parts = [f"seed{self.seed}", ("NONE", "PARTIAL", "ALL")[self.mode], self.corruption]
        parts += ["swa"] if self.swa else []
        parts += [] if self.pool else ["nopool"]
        parts += [] if self.expected_inputs else ["noinputcheck"]
        parts += [] if self.chain_check else ["nochain"]
        parts += ["overflow"] if self.overflow else []
        parts += [f"ring{self.ring}"] if self.ring != 64 else []
        parts += ["holes"] if self.holes else []
        return "-".join(parts)


@dataclass(frozen=True)
class Geometry:
    """One real-KV source's geometry: each source has its own, as SGLang's
    ``RealKvSource`` (a scenario's sources share one, or each draws its own)."""

    page_size: int
    bytes_per_token: int
    read_bytes: int
    dtype: torch.dtype
    pad_bytes: int
    """Bytes past ``page_size * bytes_per_token`` in each row (never read)."""
    gap_bytes: int
    """Bytes between rows that belong to the backing tensor, not the view."""


@dataclass
class Batch:
    """An engine's tables and one batch of rows (SGLang's plan inputs)."""

    num_slots: int
    rows: int
    max_len: int
    req_to_token: torch.Tensor  # int32 [rows, max_len], full-pool slots
    lut: torch.Tensor | None  # int64 [num_slots]: full slot -> SWA slot (the store's)
    window: int
    rp: list[int]
    prefix: list[int]
    extend: list[int]
    pool: torch.Tensor | None  # int32 [rows, pool_cols]
    valid_lens: list[int] | None
    offset: int
    tokens: dict[tuple[int, int], int] = field(default_factory=dict)  # (rp, pos) -> token

    @property
    def bs(self) -> int:
        return len(self.rp)

    def slot(self, rp: int, pos: int) -> int:
        """The store's slot of (rp, pos): ``req_to_token`` then the LUT."""
        s = int(self.req_to_token[rp, pos])
        return int(self.lut[s]) if self.lut is not None else s

    def active(self, r: int) -> bool:
        return self.rp[r] != 0


def draw_batch(rng: random.Random, spec: Spec) -> Batch:
    rows, max_len = 6, 10
    num_slots = rows * max_len + 1  # slot 0: the padding slot
    # [D2, D3] every active row's slots are distinct slots of [1, num_slots) (row 0, the
    # padding row, stays 0 as SGLang's ReqToTokenPool leaves it).
    universe = list(range(1, num_slots))
    rng.shuffle(universe)
    table = torch.zeros(rows, max_len, dtype=I32)
    for r in range(1, rows):
        table[r] = torch.tensor(universe[(r - 1) * max_len : r * max_len], dtype=I32)
    if spec.holes:
        for _ in range(rng.randint(1, 8)):
            table[rng.randrange(1, rows), rng.randrange(max_len)] = rng.choice([0, -1])
    lut = None
    window = 0
    if spec.swa:
        perm = list(range(1, num_slots))
        rng.shuffle(perm)
        lut = torch.tensor([0, *perm], dtype=I64)  # [D2] every lookup inside the LUT
        # 0: a LUT without a window translates too; 2**62: a window past every prefix
        window = rng.choice([0, 1, 3, 4, 2**62])
    bs = rng.randint(1, 5)
    # [D3] distinct request rows: two rows of one batch never share a slot.
    active_rows = rng.sample(range(1, rows), k=bs)
    rp, prefix, extend = [], [], []
    for r in range(bs):
        if rng.random() < 0.25:  # a padding row, whatever its lengths hold
            rp.append(0)
            prefix.append(rng.choice([0, 5, 99, -3]))
            extend.append(rng.choice([0, 1, 99, -1]))
            continue
        rp.append(active_rows[r])
        # [D6] no negative length on a busy row: SGLang plans a negative prefix as a fresh
        # prefill and a negative extend as no write; here both are NEGATIVE_LENGTH (the row
        # planned as padding). Padding rows above still hold negative lengths.
        e = rng.choice([0, 1, 1, 2, 3, 5])
        p = rng.randint(0, max_len - e)  # [D2] prefix + extend <= max_len
        prefix.append(p)
        extend.append(e)
    if not any(rp[r] and prefix[r] > 0 for r in range(bs)):  # something to verify
        rp[0] = active_rows[0]
        extend[0] = rng.choice([0, 1, 2])
        prefix[0] = rng.randint(1, max_len - extend[0])
    batch = Batch(num_slots, rows, max_len, table, lut, window, rp, prefix, extend, None, None, 0)
    bound = 2**31 if spec.pool else 2**63  # the pool holds int32 tokens; records int64
    for r in range(1, rows):
        for pos in range(max_len + 1):
            batch.tokens[(r, pos)] = rng.randint(-bound, bound - 1)
    if spec.pool:
        batch.offset = rng.choice([0, 0, 1, -2, 2**40, -(2**62)])
        cols = max_len + 2
        pool = torch.full((rows, cols), -5, dtype=I32)
        for r in range(1, rows):
            for q in range(cols):
                token = batch.tokens.get((r, q - batch.offset))
                if token is not None:
                    pool[r, q] = token
        batch.pool = pool
        # [D2] valid lengths inside the pool's width; some shorter than the prefix (tokens
        # past them are not checked), some 0.
        batch.valid_lens = [rng.choice([rng.randint(0, cols), -3]) for _ in range(bs)]
    return batch


def _draw_one(rng: random.Random, page_sizes: tuple[int, ...]) -> Geometry:
    bpt = rng.choice([16, 32, 64])
    return Geometry(
        page_size=rng.choice(page_sizes),
        bytes_per_token=bpt,
        read_bytes=rng.choice([r for r in (16, 32, 48, 64) if r <= bpt]),
        dtype=rng.choice([U8, torch.bfloat16]),
        pad_bytes=rng.choice([0, 16]),
        gap_bytes=rng.choice([0, 32]),
    )


def draw_geometry(rng: random.Random, mode: int) -> list[Geometry] | None:
    """Each source's geometry: 1, 2 or 4 sources of one geometry, or (half the time) each
    of its own, page sizes 1, 4 and 16 mixed in one call."""
    if mode == 0 and rng.random() < 0.5:
        return None  # no real KV at all
    count = rng.choice([1, 2, 4])
    if rng.random() < 0.5:
        return [_draw_one(rng, (1, 4))] * count
    return [_draw_one(rng, (1, 4, 16)) for _ in range(count)]


def make_sources(geos: list[Geometry], num_slots: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Views of backing tensors, as an engine's ``k_buffer[layer].view(pages, -1)``: [D2]
    enough pages for every slot of the store."""
    out = []
    for geo in geos:
        pages = -(-num_slots // geo.page_size)
        row = geo.page_size * geo.bytes_per_token + geo.pad_bytes
        item = torch.empty((), dtype=geo.dtype).element_size()
        backing = torch.randint(0, 256, (pages, row + geo.gap_bytes), dtype=U8, generator=gen)
        out.append(backing.view(geo.dtype)[:, : row // item])
    return out


# --- the three sides -----------------------------------------------------------------
class Sglang:
    """SGLang's side: a ``canary_buf``, a violation log and the two plans, driven through
    its torch references."""

    def __init__(self, refs: SglangRefs, init: torch.Tensor, spec: Spec, cw: int, cv: int):
        self.refs = refs
        self.buf = init.clone().view(U8)  # uint8 [num_slots, 32]
        self.ring = torch.zeros(KERNEL_RING, 8, dtype=I64)  # no scenario appends this many
        self.write_index = torch.zeros(1, dtype=I32)
        self.slot_runs = torch.zeros(1, dtype=I64)
        self.kernel_runs = torch.zeros(1, dtype=I64)
        self.chain = torch.tensor([int(spec.chain_check)], dtype=I32)
        self.verify_plan = refs.verify.VerifyPlan.allocate(verify_capacity=cv, device="cpu")
        self.write_plan = refs.write.WritePlan.allocate(write_req_capacity=cw, device="cpu")
        self.sources: tuple[Any, ...] = ()
        self.mode = 0

    def set_real_kv(
        self, sources: list[torch.Tensor], geos: list[Geometry] | None, mode: int
    ) -> None:
        self.mode = mode
        if geos is None:
            self.sources = ()
            return
        make = self.refs.verify.RealKvSource
        self.sources = tuple(
            make(
                tensor=t,
                page_size=geo.page_size,
                num_bytes_per_token=geo.bytes_per_token,
                read_bytes=geo.read_bytes,
            )
            for t, geo in zip(sources, geos)
        )

    def context(self, tag: int, real_kv: bool) -> Any:
        consts = self.refs.consts
        return self.refs.verify.VerifyOrWriteContext(
            canary_buf=self.buf,
            kernel_kind=self.refs.verify.CanaryLaunchTag(tag),
            violation_ring=self.ring,
            violation_write_index=self.write_index,
            slot_run_counter=self.slot_runs,
            kernel_run_counter=self.kernel_runs,
            real_kv_sources=self.sources if real_kv else (),
            real_kv_hash_mode=consts.RealKvHashMode(self.mode if real_kv else 0),
            enable_chain_position_assert=self.chain,
        )

    def plan(self, kw: dict[str, Any]) -> None:
        for name in self.refs.verify.VerifyPlan.__dataclass_fields__:
            getattr(self.verify_plan, name).fill_(JUNK)
        for name in self.refs.write.WritePlan.__dataclass_fields__:
            getattr(self.write_plan, name).fill_(JUNK)
        self.refs.plan_ref(
            verify_plan_out=self.verify_plan,
            write_plan_out=self.write_plan,
            verify_capacity=int(self.verify_plan.verify_slot_indices.shape[0]),
            **kw,
        )

    def write(self, tag: int, real_kv: bool, tok: dict[str, Any]) -> None:
        check = tok["expected_input_ids"] is not None
        self.refs.write_ref(
            context=self.context(tag, real_kv),
            plan=self.write_plan,
            input_ids=tok["input_ids"],
            positions=tok["positions"],
            out_cache_loc=tok["out_cache_loc"],
            enable_write_input_assert=check,
            expected_input_tokens=tok["expected_input_ids"],
            expected_input_positions=tok["expected_positions"],
        )

    def verify(self, tag: int, real_kv: bool, check_tokens: bool) -> None:
        self.refs.verify_ref(
            context=self.context(tag, real_kv),
            plan=self.verify_plan,
            check_verify_expected_token=check_tokens,
        )

    def state(self) -> tuple[torch.Tensor, int, int, int]:
        """records (int64 [N, 4]), violation count, kernel runs, slots processed."""
        return (
            self.buf.view(I64),
            int(self.write_index[0]),
            int(self.kernel_runs[0]),
            int(self.slot_runs[0]),
        )

    def rows(self, start: int, stop: int) -> list[tuple[int, ...]]:
        stop = min(stop, self.ring.shape[0])
        return [tuple(r) for r in self.ring[start:stop].tolist()]


class Ours:
    """This project's side: a ``CanaryStore`` and a ``PlanBuffers``, driven through the
    references or the kernels."""

    def __init__(self, kernels: bool, init: torch.Tensor, spec: Spec, cw: int, cv: int):
        self.kernels = kernels
        ring = KERNEL_RING if kernels else spec.ring
        self.store = CanaryStore.allocate(
            num_slots=init.shape[0], violation_capacity=ring, device="cpu"
        )
        self.store.records.copy_(init)
        if spec.chain_check:
            self.store.enable_chain_position_check()
        self.plan_buffers = PlanBuffers.allocate(
            write_req_capacity=cw, verify_capacity=cv, device="cpu"
        )
        self.real_kv: RealKV | None = None

    @property
    def name(self) -> str:
        return "kernels" if self.kernels else "reference"

    def set_real_kv(
        self, sources: list[torch.Tensor], geos: list[Geometry] | None, mode: int
    ) -> None:
        if geos is None:
            self.real_kv = None
            return
        if len(set(geos)) == 1:  # one geometry: plain tensors take the RealKV's
            geo = geos[0]
            self.real_kv = RealKV(
                mode=RealKVMode(mode),
                sources=tuple(sources),
                page_size=geo.page_size,
                bytes_per_token=geo.bytes_per_token,
                read_bytes=geo.read_bytes,
            )
            return
        self.real_kv = RealKV(
            mode=RealKVMode(mode),
            sources=[
                RealKVSource(
                    t,
                    page_size=geo.page_size,
                    bytes_per_token=geo.bytes_per_token,
                    read_bytes=geo.read_bytes,
                )
                for t, geo in zip(sources, geos)
            ],
        )

    def plan(self, kw: dict[str, Any]) -> None:
        b = self.plan_buffers
        for name in (
            "write_offsets",
            "write_seed_slot_indices",
            "write_num_valid_reqs",
            "verify_slot_indices",
            "verify_expected_tokens",
            "verify_expected_positions",
            "verify_prev_slot_indices",
            "verify_num_valid",
            "verify_enable",
        ):
            getattr(b, name).fill_(JUNK)
        (launch_plan if self.kernels else plan_reference)(b, **kw)

    def write(self, tag: int, real_kv: bool, tok: dict[str, Any]) -> None:
        (launch_write if self.kernels else write_reference)(
            self.store,
            self.plan_buffers,
            launch_tag=tag,
            real_kv=self.real_kv if real_kv else None,
            **tok,
        )

    def verify(self, tag: int, real_kv: bool, check_tokens: bool) -> None:
        (launch_verify if self.kernels else verify_reference)(
            self.store,
            self.plan_buffers,
            launch_tag=tag,
            check_expected_tokens=check_tokens,
            real_kv=self.real_kv if real_kv else None,
        )

    def state(self) -> tuple[torch.Tensor, int, int, int]:
        s = self.store
        return (
            s.records,
            int(s.violation_count),
            int(s.kernel_runs),
            int(s.slots_processed),
        )

    def rows(self, start: int, stop: int) -> list[tuple[int, ...]]:
        stop = min(stop, self.store.violation_capacity)
        # SGLang's 8 columns (this project may keep more beside them, issue 26 section 1).
        return [tuple(r) for r in self.store.violations[start:stop, :8].tolist()]


# --- comparisons ---------------------------------------------------------------------
def assert_plans_equal(sg: Sglang, ours: Ours, bs: int, where: str) -> None:
    """Field by field, over what both define."""
    b, vp, wp = ours.plan_buffers, sg.verify_plan, sg.write_plan
    tag = f"{where}: {ours.name} plan vs SGLang plan_ref"
    assert torch.equal(b.write_offsets, wp.write_offsets), (
        f"{tag}: write_offsets {b.write_offsets.tolist()} != {wp.write_offsets.tolist()}"
    )
    assert torch.equal(b.write_seed_slot_indices[:bs], wp.write_seed_slot_indices[:bs]), (
        f"{tag}: write_seed_slot_indices {b.write_seed_slot_indices[:bs].tolist()} != "
        f"{wp.write_seed_slot_indices[:bs].tolist()}"
    )
    assert int(b.write_num_valid_reqs) == int(wp.write_num_valid_reqs), tag
    n, enable = int(vp.verify_num_valid), int(vp.enable)
    assert (int(b.verify_num_valid), int(b.verify_enable)) == (n, enable), (
        f"{tag}: (verify_num_valid, enable) {int(b.verify_num_valid), int(b.verify_enable)} "
        f"!= {(n, enable)}"
    )
    if enable:
        for name in ("slot_indices", "expected_tokens", "expected_positions", "prev_slot_indices"):
            mine = getattr(b, f"verify_{name}")[:n]
            theirs = getattr(vp, f"verify_{name}")[:n]
            assert torch.equal(mine, theirs), (
                f"{tag}: verify_{name} {mine.tolist()} != {theirs.tolist()}"
            )


def assert_call_equal(sg: Sglang, ours: Ours, before: int, where: str) -> int:
    """Records byte for byte, the rows this call appended, the count and both counters.
    Returns the violations this call appended."""
    rec_s, count_s, runs_s, slots_s = sg.state()
    rec_o, count_o, runs_o, slots_o = ours.state()
    tag = f"{where}: {ours.name} vs SGLang"
    if not torch.equal(rec_o.view(U8), rec_s.view(U8)):
        bad = (rec_o != rec_s).any(dim=1).nonzero().squeeze(1).tolist()
        raise AssertionError(
            f"{tag}: records differ at slots {bad[:8]}: "
            + "; ".join(f"{s}: {rec_o[s].tolist()} != {rec_s[s].tolist()}" for s in bad[:3])
        )
    assert (count_o, runs_o, slots_o) == (count_s, runs_s, slots_s), (
        f"{tag}: (violation count, kernel runs, slots processed) "
        f"{(count_o, runs_o, slots_o)} != {(count_s, runs_s, slots_s)}"
    )
    kept = min(count_s, ours.store.violation_capacity)  # fill once: the first rows stay
    mine, theirs = ours.rows(before, kept), sg.rows(before, kept)
    if ours.kernels:  # the kernels' row order within a call is unspecified
        assert collections.Counter(mine) == collections.Counter(theirs), (
            f"{tag}: violation rows differ:\n  ours   {sorted(mine)}\n  SGLang {sorted(theirs)}"
        )
    else:
        assert mine == theirs, f"{tag}: violation rows differ:\n  ours   {mine}\n  SGLang {theirs}"
    return count_s - before


# --- the run -------------------------------------------------------------------------
@dataclass
class Outcome:
    """What a scenario produced (SGLang's side), for the tests' own assertions."""

    violations: int = 0
    """Violations appended after the history (the step and the decode plan)."""
    verify_entries: int = 0
    written: int = 0
    overflowed: bool = False
    caught: bool = False
    """Whether the corruption applied is one every verify or write must report."""
    kind: str = "none"
    """The corruption applied (``none`` where the drawn batch left nothing to corrupt)."""
    stores: dict[str, Any] = field(default_factory=dict)


def plan_kwargs(batch: Batch, prefix: list[int], extend: list[int]) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        req_pool_indices=torch.tensor(batch.rp, dtype=I64),
        prefix_lens=torch.tensor(prefix, dtype=I64),
        extend_seq_lens=torch.tensor(extend, dtype=I64),
        req_to_token=batch.req_to_token,
        swa_window_size=batch.window,
        full_to_swa_index_mapping=batch.lut,
        req_to_verify_expected_tokens=batch.pool,
        req_to_verify_expected_tokens_valid_lens=(
            torch.tensor(batch.valid_lens, dtype=I64) if batch.valid_lens is not None else None
        ),
        kv_token_id_vs_position_offset=batch.offset,
    )
    return kw


def token_inputs(
    rng: random.Random,
    batch: Batch,
    prefix: list[int],
    extend: list[int],
    expected: bool,
    skip_some: bool,
) -> tuple[dict[str, Any], list[int]]:
    """The forward's flat per-token inputs in ``write_offsets`` order, a CUDA-graph padding
    tail of ``-1`` slots, and the slots written."""
    ids, pos, loc, written = [], [], [], []
    for r in range(batch.bs):
        if not batch.active(r) or extend[r] <= 0:
            continue
        rp, p = batch.rp[r], max(prefix[r], 0)
        for k in range(extend[r]):
            s = batch.slot(rp, p + k)
            if skip_some and rng.random() < 0.15:
                s = -1  # a token the (SWA) pool does not hold: skipped
            ids.append(batch.tokens[(rp, p + k)])
            pos.append(p + k)
            loc.append(s)
            if s >= 0:
                written.append(s)
    pad = rng.randint(0, 3)
    ids += [rng.randint(-9, 9) for _ in range(pad)]
    pos += [rng.randint(0, 9) for _ in range(pad)]
    loc += [-1] * pad
    tok: dict[str, Any] = dict(
        input_ids=torch.tensor(ids, dtype=I64),
        positions=torch.tensor(pos, dtype=I64),
        out_cache_loc=torch.tensor(loc, dtype=I64),
        expected_input_ids=torch.tensor(ids, dtype=I64) if expected else None,
        expected_positions=torch.tensor(pos, dtype=I64) if expected else None,
    )
    return tok, written


class Run:
    """The three sides of one scenario and the calls they all make."""

    def __init__(self, refs: SglangRefs, spec: Spec, batch: Batch, cw: int, cv: int):
        gen = torch.Generator().manual_seed(spec.seed)
        init = torch.randint(-(2**62), 2**62, (batch.num_slots, 4), dtype=I64, generator=gen)
        self.sg = Sglang(refs, init, spec, cw, cv)
        self.ours = [Ours(False, init, spec, cw, cv), Ours(True, init, spec, cw, cv)]
        self.batch = batch

    def set_real_kv(
        self, sources: list[torch.Tensor], geos: list[Geometry] | None, mode: int
    ) -> None:
        for side in (self.sg, *self.ours):
            side.set_real_kv(sources, geos, mode)

    def plan(self, kw: dict[str, Any], where: str) -> None:
        self.sg.plan(kw)
        for side in self.ours:
            side.plan(kw)
            assert_plans_equal(self.sg, side, self.batch.bs, where)

    def call(self, where: str, op: str, *args: Any) -> int:
        before = self.sg.state()[1]
        counts = [side.state()[1] for side in self.ours]
        assert counts == [before, before], f"{where}: violation counts diverged before the call"
        getattr(self.sg, op)(*args)
        appended = 0
        for side in self.ours:
            getattr(side, op)(*args)
            appended = assert_call_equal(self.sg, side, before, f"{where} ({op})")
        return appended


def _window(batch: Batch, prefix: int) -> range:
    """Positions a plan verifies for a row of prefix ``prefix``."""
    start = max(0, prefix - batch.window) if batch.window else 0
    return range(start, max(prefix, 0))


def run_scenario(refs: SglangRefs, spec: Spec) -> Outcome:
    rng = random.Random(spec.seed)
    batch = draw_batch(rng, spec)
    geo = draw_geometry(rng, spec.mode)
    cw = batch.bs + rng.randint(0, 2)  # [D5] bs <= write_req_capacity
    entries = sum(len(_window(batch, p)) for r, p in enumerate(batch.prefix) if batch.active(r))
    if spec.overflow and entries > 1:
        cv = entries - 1  # one short: both plans disable the verify and write no entry
    else:  # room for the decode plan's entries too (the step's prefix plus its tokens)
        after = [max(p, 0) + max(e, 0) for p, e in zip(batch.prefix, batch.extend)]
        decode = sum(len(_window(batch, p)) for r, p in enumerate(after) if batch.active(r))
        cv = max(entries, decode) + rng.randint(0, 4)
    run = Run(refs, spec, batch, cw, cv)
    gen = torch.Generator().manual_seed(spec.seed + 1)
    sources = make_sources(geo, batch.num_slots, gen) if geo is not None else []
    run.set_real_kv(sources, geo, spec.mode)
    out = Outcome()
    tags = list(range(12))  # SGLang's CanaryLaunchTag values

    # 1. History: every active row's prefix written in one prefill (plan P = 0, E = prefix).
    hist_prefix = [0] * batch.bs
    hist_extend = [max(p, 0) if batch.active(r) else 0 for r, p in enumerate(batch.prefix)]
    run.plan(plan_kwargs(batch, hist_prefix, hist_extend), "history plan")
    tok, _ = token_inputs(rng, batch, hist_prefix, hist_extend, spec.expected_inputs, False)
    run.call("history write", "write", rng.choice(tags), True, tok)
    assert run.sg.state()[1] == 0, "the history wrote violation rows"

    # 2. A corruption of what the step verifies: the same bytes changed on every side.
    step_prefix, step_extend = batch.prefix, batch.extend
    out.overflowed = entries > cv
    verified = [
        (r, pos)
        for r in range(batch.bs)
        if batch.active(r)
        for pos in _window(batch, step_prefix[r])
    ]
    kind = spec.corruption
    if kind == "kv" and (geo is None or spec.mode == 0):
        kind = "record"
    if kind in ("record", "kv", "pool", "reuse") and (not verified or out.overflowed):
        kind = "none"
    if kind == "pool" and (batch.pool is None or batch.valid_lens is None):
        kind = "none"
    out.caught = kind in ("record", "kv", "pool", "input")
    if kind == "record":  # a record overwritten: its position, so that verify must see it
        r, pos = rng.choice(verified)
        s = batch.slot(batch.rp[r], pos)
        bit = 1 << rng.randrange(40)
        for side in (run.sg, *run.ours):
            side.state()[0][s, 1] ^= bit
    elif kind == "kv":  # KV bytes overwritten inside the 16 bytes both modes hash
        assert geo is not None
        r, pos = rng.choice(verified)
        s = batch.slot(batch.rp[r], pos)
        i = rng.randrange(len(sources))
        page, bpt = geo[i].page_size, geo[i].bytes_per_token
        byte = (s % page) * bpt + rng.randrange(16)
        sources[i].view(U8)[s // page, byte] ^= 0x5A
    elif kind == "pool":  # an expected token that a checked entry disagrees with
        assert batch.pool is not None and batch.valid_lens is not None
        checked = [(r, pos) for r, pos in verified if 0 <= pos + batch.offset < batch.valid_lens[r]]
        if checked:
            r, pos = rng.choice(checked)
            batch.pool[batch.rp[r], pos + batch.offset] ^= 1 << rng.randrange(31)
        else:
            out.caught = False
    tok, written = token_inputs(
        rng, batch, step_prefix, step_extend, spec.expected_inputs, kind == "skip"
    )
    live = (tok["out_cache_loc"] >= 0).nonzero().squeeze(1).tolist()
    if kind == "input" and live and (spec.expected_inputs or spec.chain_check):
        # The forward ran another token or position than the scheduler meant: the input
        # check sees either, the chain-position check a position.
        k = rng.choice(live)
        if spec.expected_inputs and rng.random() < 0.5:
            tok["input_ids"][k] += 1
        else:
            tok["positions"][k] += rng.choice([-1, 1, 2])
    elif kind == "input":
        out.caught = False
    if kind == "reuse":
        # A page handed to a second request while the first still holds it: the step
        # writes over a slot of another row's verified prefix ([D3] never a slot the
        # call also seeds from or writes elsewhere).
        seeds = {
            batch.slot(batch.rp[r], step_prefix[r] - 1)
            for r in range(batch.bs)
            if batch.active(r) and step_prefix[r] > 0 and step_extend[r] > 0
        }
        victims = [batch.slot(batch.rp[r], pos) for r, pos in verified]
        victims = [v for v in victims if v not in seeds and v not in written]
        if victims and live:
            tok["out_cache_loc"][rng.choice(live)] = rng.choice(victims)

    # 3. The step, on one store: plan, verify before the forward, the forward writes the
    # step's KV bytes, then the write and a verify after it.
    run.plan(plan_kwargs(batch, step_prefix, step_extend), "step plan")
    assert out.overflowed == (int(run.sg.verify_plan.enable) == 0)
    if not out.overflowed:
        out.verify_entries += int(run.sg.verify_plan.verify_num_valid)
    out.violations += run.call(
        "step verify before the forward", "verify", rng.choice(tags), True, rng.random() < 0.7
    )
    if geo is not None:
        for s in written:
            for src, g in zip(sources, geo):
                row = src.view(U8)[s // g.page_size]
                start = (s % g.page_size) * g.bytes_per_token
                row[start : start + g.bytes_per_token] = torch.randint(
                    0, 256, (g.bytes_per_token,), dtype=U8, generator=gen
                )
    out.violations += run.call("step write", "write", rng.choice(tags), True, tok)
    out.written += len(written)
    out.violations += run.call(
        "step verify after the write", "verify", rng.choice(tags), True, True
    )

    # 4. The next (decode) plan verifies what the step wrote as well.
    next_prefix = [
        max(p, 0) + max(e, 0) if batch.active(r) else p
        for r, (p, e) in enumerate(zip(step_prefix, step_extend))
    ]
    next_extend = [
        1 if batch.active(r) and next_prefix[r] < batch.max_len else 0 for r in range(batch.bs)
    ]
    run.plan(plan_kwargs(batch, next_prefix, next_extend), "decode plan")
    if int(run.sg.verify_plan.enable):
        out.verify_entries += int(run.sg.verify_plan.verify_num_valid)
    out.violations += run.call("decode verify", "verify", rng.choice(tags), True, True)
    out.stores = {"sglang": run.sg, "reference": run.ours[0], "kernels": run.ours[1]}
    out.kind = kind
    return out


def assert_offsets_equal(refs: SglangRefs, ours: Ours, kw: dict[str, Any], bs: int) -> None:
    """SGLang's Triton offsets kernel (the half of its plan that is not CUDA C++), run in
    the interpreter as ``launch_canary_plan_kernels`` runs it, against this project's plan:
    write offsets, seeds, both counts and ``enable``."""
    b = ours.plan_buffers
    cw, cv = b.write_req_capacity, b.verify_capacity
    out = dict(
        out_write_offsets=torch.zeros(cw + 1, dtype=I64),  # the launcher zeroes it first
        out_write_seed_slot_indices=torch.full((cw,), JUNK, dtype=I64),
        out_verify_num_valid=torch.full((1,), JUNK, dtype=I32),
        out_verify_enable=torch.full((1,), JUNK, dtype=I32),
        out_write_num_valid_reqs=torch.full((1,), JUNK, dtype=I32),
    )
    refs.plan_offsets(
        req_pool_indices=kw["req_pool_indices"],
        prefix_lens=kw["prefix_lens"],
        extend_seq_lens=kw["extend_seq_lens"],
        req_to_token=kw["req_to_token"],
        full_to_swa_index_mapping=kw["full_to_swa_index_mapping"],
        out_verify_offsets_scratch=torch.zeros(4096 + 1, dtype=I64),
        swa_window_size=kw["swa_window_size"],
        verify_capacity=cv,
        **out,
    )
    tag = f"{ours.name} plan vs SGLang's Triton offsets kernel"
    assert out["out_write_offsets"].tolist() == b.write_offsets.tolist(), tag
    assert (
        out["out_write_seed_slot_indices"][:bs].tolist() == b.write_seed_slot_indices[:bs].tolist()
    ), tag
    for name, mine in (
        ("out_verify_num_valid", b.verify_num_valid),
        ("out_verify_enable", b.verify_enable),
        ("out_write_num_valid_reqs", b.write_num_valid_reqs),
    ):
        assert int(out[name]) == int(mine), f"{tag}: {name}"


def run_plan_only(refs: SglangRefs, spec: Spec) -> tuple[int, bool]:
    """One plan of a drawn batch on every side (SGLang's reference and its Triton offsets
    kernel, this project's reference and kernels), compared; returns (verify entries the
    batch asks for, whether the plan overflowed)."""
    rng = random.Random(spec.seed)
    batch = draw_batch(rng, spec)
    cw = batch.bs + rng.randint(0, 3)  # [D5]
    entries = sum(len(_window(batch, p)) for r, p in enumerate(batch.prefix) if batch.active(r))
    cv = max(entries - 1, 1) if spec.overflow else entries + rng.randint(0, 3)
    run = Run(refs, spec, batch, cw, cv)
    kw = plan_kwargs(batch, batch.prefix, batch.extend)
    run.plan(kw, "plan")
    for side in run.ours:
        assert_offsets_equal(refs, side, kw, batch.bs)
    return entries, entries > cv

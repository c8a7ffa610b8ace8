"""A tiny paged engine for the runtime's unit tests (no engine installed): block tables
(rows from 0, like vLLM and transformers), a reserved null block 0, LIFO block reuse,
chunked prefill, a prefix cache of full blocks, and a fake KV layer the "forward" writes.

Each step it hands the runtime a :class:`StepBatch` (block tables or per-token slot
lists), runs its forward, then calls ``end_step``. ``faults`` are hooks that make the
engine itself misbehave (``inject_*``), the way the fault module does for real engines.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from kv_canary_buffers import RealKVMode
from kv_canary_engines import (
    BlockTable,
    CanaryConfig,
    CanaryReport,
    CanaryRuntime,
    KVGroup,
    Row,
    StepBatch,
    SweepBatch,
    TokenSlots,
)

PAGE = 4
KV_ELEMS = 8  # float32: 32 bytes a token


@attrs.define(eq=False)
class Req:
    id: str
    prompt: list[int]
    output_len: int
    tokens: list[int] = attrs.Factory(list)
    blocks: list[int] = attrs.Factory(list)
    cached: int = 0  # positions whose KV is written
    shared: int = 0  # leading blocks taken from the prefix cache

    @property
    def total(self) -> int:
        return len(self.prompt) + self.output_len


@attrs.define(eq=False)
class FakeEngine:
    num_blocks: int = 96
    chunk: int = 6
    device: str = "cpu"
    tables: str = "block"  # "block" or "token"
    seed: int = 0
    prefix_cache: bool = True
    runtime: CanaryRuntime | None = None
    kv: torch.Tensor = attrs.field(init=False)
    free: list[int] = attrs.field(init=False)
    running: list[Req] = attrs.Factory(list)
    waiting: list[Req] = attrs.Factory(list)
    finished: dict[str, list[int]] = attrs.Factory(dict)
    cache: dict[tuple[int, ...], int] = attrs.Factory(dict)  # prefix tokens -> block
    refs: dict[int, int] = attrs.Factory(dict)
    gen: torch.Generator = attrs.field(init=False)
    step_no: int = 0
    reports: list[CanaryReport] = attrs.Factory(list)
    before_schedule: list[Callable[[FakeEngine], None]] = attrs.Factory(list)
    in_forward: list[Callable[[FakeEngine, list[Req], torch.Tensor], None]] = attrs.Factory(list)
    slot_shift: dict[str, int] = attrs.Factory(dict)  # request -> off-by-one in out slots
    hold: set[str] = attrs.Factory(set)  # running requests left out of the batches
    speculate: int = 0  # drafts proposed per decode step
    rollback: bool = True  # rejected drafts rolled back (False: the fault)
    stale_cache: bool = False  # a reallocated block keeps its prefix-cache entry (fault)
    force_block: tuple[int, frozenset[str]] | None = None  # next alloc outside the set
    double_alloc: list[tuple[str, int]] | None = None  # the next two requests' blocks: one
    allocations: list[tuple[str, int]] = attrs.Factory(list)
    doubled: tuple[str, str, int] | None = None  # (first, second, block) of double_alloc
    window: int = 0  # also a sliding-window group "swa" over the same slots (identity LUT)
    input_dtype: torch.dtype = torch.int64  # input_ids' and positions' (transformers: int32)

    def __attrs_post_init__(self) -> None:
        self.kv = torch.zeros(self.num_blocks, PAGE, KV_ELEMS, device=self.device)
        self.free = list(range(self.num_blocks - 1, 0, -1))  # block 0: the null block
        self.gen = torch.Generator().manual_seed(self.seed)

    # --- the canary ------------------------------------------------------------
    def attach(self, config: CanaryConfig, **kwargs: object) -> CanaryRuntime:
        group = KVGroup(
            name="full",
            num_slots=self.num_blocks * PAGE,
            page_size=PAGE,
            real_kv_sources=(self.kv.view(self.num_blocks, PAGE * KV_ELEMS),),
            real_kv_bytes_per_token=KV_ELEMS * 4,
        )
        groups = [group]
        if self.window:
            lut = torch.arange(self.num_blocks * PAGE, dtype=torch.int64, device=self.device)
            groups.append(attrs.evolve(group, name="swa", window=self.window, lut=lut))
        self.runtime = CanaryRuntime(
            config, groups, device=self.device, sweep_source=self.sweep_batch, **kwargs
        )
        return self.runtime

    def _per_group(self, value: object) -> dict[str, object]:
        return {"full": value, "swa": value} if self.window else {"full": value}

    def sweep_batch(self) -> SweepBatch | None:
        reqs = [r for r in self.running if r.cached]
        if not reqs:
            return None
        return SweepBatch(
            requests=[(r.id, r.cached) for r in reqs],
            tables=self._per_group(self._table(reqs, [r.cached for r in reqs])),  # type: ignore[arg-type]
        )

    # --- requests ----------------------------------------------------------------
    def add(self, rid: str, prompt: list[int], output_len: int) -> None:
        self.waiting.append(Req(rid, list(prompt), output_len, tokens=list(prompt)))

    def alone(self, req: Req) -> bool:
        """Whether no other request holds any of ``req``'s blocks."""
        return all(self.refs.get(b, 0) == 1 for b in req.blocks)

    def rand_tokens(self, n: int) -> list[int]:
        return torch.randint(0, 500, (n,), generator=self.gen).tolist()

    def _alloc(self, req: Req) -> int:
        if self.force_block is not None and req.id not in self.force_block[1]:
            block = self.force_block[0]  # handed out although another request holds it
            self.force_block = None
            self.refs[block] = self.refs.get(block, 0) + 1
        elif self.double_alloc and self.double_alloc[0][0] != req.id:
            block = self.double_alloc[0][1]
            self.doubled = (self.double_alloc[0][0], req.id, block)
            self.double_alloc = None
            self.refs[block] += 1
        else:
            block = self.free.pop()
            if not self.stale_cache:
                for key in [k for k, b in self.cache.items() if b == block]:
                    del self.cache[key]  # the block's cached content is gone
            self.refs[block] = 1
            if self.double_alloc == []:
                self.double_alloc.append((req.id, block))
        self.allocations.append((req.id, block))
        return block

    def _unref(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            del self.refs[block]
            self.free.append(block)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < 6:
            req = self.waiting.pop(0)
            if self.prefix_cache:
                # full prompt blocks already cached (never the whole prompt)
                for b in range((len(req.prompt) - 1) // PAGE):
                    block = self.cache.get(tuple(req.prompt[: (b + 1) * PAGE]))
                    if block is None:
                        break
                    req.blocks.append(block)
                    self.refs[block] = self.refs.get(block, 0) + 1
                    if block in self.free:
                        self.free.remove(block)
                req.cached = req.shared = len(req.blocks) * PAGE
            self.running.append(req)

    # --- one step --------------------------------------------------------------------
    def step(self) -> None:
        for hook in self.before_schedule:
            hook(self)
        self._admit()
        batch = [r for r in self.running if r.id not in self.hold]
        if not batch:
            self.step_no += 1
            return
        extends, drafts = [], []
        for req in batch:
            decoding = req.cached >= len(req.prompt)
            e = 1 if decoding else min(self.chunk, len(req.prompt) - req.cached)
            k = self.speculate if decoding and self.speculate else 0
            if k:  # propose k drafts after the token being written
                req.tokens = req.tokens[: req.cached + 1] + self.rand_tokens(k)
            extends.append(e + k)
            drafts.append(k)
            while len(req.blocks) * PAGE < req.cached + e + k:
                req.blocks.append(self._alloc(req))
        slots = []
        for req, e in zip(batch, extends):
            for pos in range(req.cached, req.cached + e):
                s = req.blocks[pos // PAGE] * PAGE + pos % PAGE
                slots.append(s + self.slot_shift.get(req.id, 0))
        out = torch.tensor(slots, dtype=torch.int64, device=self.device)
        ids = torch.tensor(
            [t for req, e in zip(batch, extends) for t in req.tokens[req.cached : req.cached + e]],
            dtype=self.input_dtype,
            device=self.device,
        )
        positions = torch.tensor(
            [p for req, e in zip(batch, extends) for p in range(req.cached, req.cached + e)],
            dtype=self.input_dtype,
            device=self.device,
        )
        if self.runtime is not None:
            ends = [r.cached + e for r, e in zip(batch, extends)]
            self.runtime.begin_step(
                StepBatch(
                    rows=[
                        Row(
                            request_id=r.id,
                            prefix_len=r.cached,
                            extend_len=e,
                            tokens=r.tokens,
                            draft_len=k,
                        )
                        for r, e, k in zip(batch, extends, drafts)
                    ],
                    tables=self._per_group(self._table(batch, ends)),  # type: ignore[arg-type]
                    out_cache_loc=self._per_group(out),  # type: ignore[arg-type]
                    input_ids=ids,
                    positions=positions,
                )
            )
        # the forward: fresh KV bytes at this step's slots
        flat = self.kv.view(-1, KV_ELEMS)
        flat[out] = torch.randn(len(slots), KV_ELEMS, generator=self.gen).to(self.device)
        for forward_hook in self.in_forward:
            forward_hook(self, batch, out)
        if self.runtime is not None:
            report = self.runtime.end_step()
            if report is not None:
                self.reports.append(report)
        self._finish(batch, extends, drafts)
        self.step_no += 1

    def _finish(self, batch: list[Req], extends: list[int], drafts: list[int]) -> None:
        for req, e, k in zip(batch, extends, drafts):
            if req not in self.running:
                continue  # aborted during the step
            if k:
                # verification: the first `accepted` drafts stand; the target model's own
                # tokens replace the rejected ones
                accepted = int(torch.randint(0, k + 1, (1,), generator=self.gen))
                base = req.cached + 1
                kept = req.tokens[: base + accepted]
                if self.rollback:
                    req.tokens = kept
                    req.cached = base + accepted
                else:  # the rejected drafts' KV stays as if it held the real tokens
                    real = [(t + 1) % 500 for t in req.tokens[base + accepted : base + k]]
                    req.tokens = kept + real
                    req.cached = base + k
                req.tokens.append(self.rand_tokens(1)[0])
                if len(req.tokens) >= req.total:
                    self.drop(req)
                    self.finished[req.id] = req.tokens
                continue
            req.cached += e
            if self.prefix_cache:
                for b in range(req.shared // PAGE, min(req.cached, len(req.prompt)) // PAGE):
                    self.cache.setdefault(tuple(req.prompt[: (b + 1) * PAGE]), req.blocks[b])
            if req.cached >= len(req.prompt):
                req.tokens.append(self.rand_tokens(1)[0])
            if len(req.tokens) >= req.total and req.cached >= req.total - 1:
                self.drop(req)
                self.finished[req.id] = req.tokens

    def drop(self, req: Req) -> None:
        self.running.remove(req)
        for block in req.blocks:
            if block in self.refs:
                self._unref(block)
        if self.runtime is not None:
            self.runtime.release(req.id)

    def abort(self, ids: frozenset[object]) -> None:
        for req in [r for r in self.running if r.id in ids]:
            self.drop(req)

    def _table(self, reqs: list[Req], lengths: list[int]) -> BlockTable | TokenSlots:
        if self.tables == "block":
            width = max(len(r.blocks) for r in reqs)
            rows = [r.blocks + [0] * (width - len(r.blocks)) for r in reqs]
            return BlockTable(table=torch.tensor(rows, dtype=torch.int32, device=self.device))
        slots = [
            r.blocks[p // PAGE] * PAGE + p % PAGE for r, n in zip(reqs, lengths) for p in range(n)
        ]
        return TokenSlots(slots=torch.tensor(slots, dtype=torch.int64, device=self.device))

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()


def default_config(**changes: object) -> CanaryConfig:
    kwargs: dict[str, object] = dict(stages="reference", real_kv=RealKVMode.PARTIAL)
    kwargs.update(changes)
    return CanaryConfig(**kwargs)  # type: ignore[arg-type]

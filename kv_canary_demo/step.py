"""The canary's part of a step, per buffer group: its plan buffers, HEAD and TAIL stores and
fake KV layer; the plan and HEAD verify before the forward, the writes and TAIL verify
after it (in the order of the package docstring), eager or replayed from two CUDA graphs;
growing every buffer; reading a store back."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeAlias

import attrs
import torch

from kv_canary_buffers import (
    CanaryStore,
    GraphInputs,
    PlanBuffers,
    RealKV,
    RealKVMode,
    ViolationReport,
    verify_entries_needed,
)

from .config import SimConfig, Stats
from .scheduler import Scheduler
from .stages import Stages

EventPair: TypeAlias = tuple[torch.cuda.Event, torch.cuda.Event]

KV_ELEMS = 16
"""bfloat16 elements of one slot's fake KV (32 bytes: a multiple of 16, as RealKV needs)."""
PAGE_SIZE = 16
"""Slots per row of the fake KV layer as the real-KV hash reads it."""


class LaunchTag(enum.IntEnum):
    """The ``launch_tag`` of each write and verify launch (written into violation rows)."""

    HEAD_VERIFY_FULL = 0
    HEAD_WRITE_FULL = 1
    TAIL_WRITE_FULL = 2
    TAIL_VERIFY_FULL = 3
    HEAD_VERIFY_SWA = 4
    HEAD_WRITE_SWA = 5
    TAIL_WRITE_SWA = 6
    TAIL_VERIFY_SWA = 7


def tag(group: str, launch: str) -> int:
    return int(LaunchTag[f"{launch}_{group.upper()}"])


@attrs.define(eq=False)
class Group:
    """One buffer group: its plan buffers, HEAD/TAIL stores, fake KV layer and staging
    (``oracle`` and the ``shadow_`` stores are the reference copies shadow.py checks)."""

    name: str
    window: int
    buffers: PlanBuffers
    oracle: PlanBuffers
    head: CanaryStore
    tail: CanaryStore | None
    shadow_head: CanaryStore | None
    shadow_tail: CanaryStore | None
    kv: torch.Tensor
    real_kv: RealKV
    staging: GraphInputs | None = None
    tokens: TokenInputs | None = None

    def stores(self) -> list[tuple[str, CanaryStore, CanaryStore | None]]:
        """``(name, store, its reference shadow)`` for HEAD and (if kept) TAIL."""
        out = [("HEAD", self.head, self.shadow_head)]
        if self.tail is not None:
            out.append(("TAIL", self.tail, self.shadow_tail))
        return out


@attrs.define(eq=False)
class TokenInputs:
    """The write's per-token inputs at fixed addresses (int64 ``[capacity]`` each), for
    graph replay: :meth:`fill` copies a step's ``n`` tokens in place and makes the rest
    skipped writes (``out_cache_loc = -1``), which no plan reaches anyway."""

    capacity: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    expected_input_ids: torch.Tensor
    expected_positions: torch.Tensor

    @classmethod
    def allocate(cls, capacity: int, device: torch.device) -> TokenInputs:
        def make() -> torch.Tensor:
            return torch.zeros(capacity, dtype=torch.int64, device=device)

        return cls(capacity, make(), make(), make(), make(), make())

    def fill(self, tokens: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        n = tokens["out_cache_loc"].shape[0]
        for name, src in tokens.items():
            dst = getattr(self, name)
            dst[:n].copy_(src)
            dst[n:].fill_(-1 if name == "out_cache_loc" else 0)
        return self.as_kwargs()

    def as_kwargs(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in _TOKEN_FIELDS}


_TOKEN_FIELDS = (
    "input_ids",
    "positions",
    "out_cache_loc",
    "expected_input_ids",
    "expected_positions",
)
_PLAIN_FIELDS = ("input_ids", "positions", "out_cache_loc")
"""The TAIL write's token inputs: no expected tokens (the HEAD write checks those)."""


def real_kv(kv: torch.Tensor) -> RealKV:
    """The PARTIAL real-KV hash over a fake KV layer ``[num_slots, KV_ELEMS]``, viewed as
    pages of ``PAGE_SIZE`` slots (a view, never a copy)."""
    pages = kv.view(kv.shape[0] // PAGE_SIZE, PAGE_SIZE * KV_ELEMS)
    return RealKV(
        mode=RealKVMode.PARTIAL,
        sources=(pages,),
        page_size=PAGE_SIZE,
        bytes_per_token=KV_ELEMS * kv.element_size(),
    )


def plain_tokens(tokens: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: tokens[k] for k in _PLAIN_FIELDS}


class CanaryStep:
    """The ``full`` and ``swa`` groups and the launches of each step. The rows and tables
    the plan reads are the scheduler's; ``changed`` says a buffer grew since the last timed
    step (that step is left out of the timing)."""

    def __init__(
        self,
        config: SimConfig,
        *,
        stages: Stages,
        scheduler: Scheduler,
        stats: Stats,
        say: Callable[[str], None],
    ):
        self.config = config
        self.stages = stages
        self.scheduler = scheduler
        self.device = scheduler.device
        self.stats = stats
        self.say = say
        cap = config.max_batch * config.verify_capacity_per_row
        self.groups = [self._group("full", 0, cap), self._group("swa", config.swa_window, cap)]
        self.graphs: tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph] | None = None
        self.graph_key: tuple[object, ...] | None = None
        self.changed = False
        self.rows: dict[str, torch.Tensor] = {}
        self.verify_totals: dict[str, int] = {}

    # --- construction and growth -----------------------------------------------------
    def _group(self, name: str, window: int, verify_capacity: int) -> Group:
        def make() -> PlanBuffers:
            return PlanBuffers.allocate(
                write_req_capacity=self.config.max_batch,
                verify_capacity=verify_capacity,
                device=self.device,
            )

        num_slots = self.scheduler.pool.num_slots
        kv = torch.zeros(num_slots, KV_ELEMS, dtype=torch.bfloat16, device=self.device)
        tail = self.config.tail
        shadow = self.stages.kernels and self.config.check_stores
        return Group(
            name=name,
            window=window,
            buffers=make(),
            oracle=make(),
            head=self._store(num_slots),
            tail=self._store(num_slots) if tail else None,
            shadow_head=self._store(num_slots) if shadow else None,
            shadow_tail=self._store(num_slots) if shadow and tail else None,
            kv=kv,
            real_kv=real_kv(kv),
        )

    def _store(self, num_slots: int) -> CanaryStore:
        store = CanaryStore.allocate(
            num_slots=num_slots,
            violation_capacity=self.config.violation_capacity,
            device=self.device,
        )
        store.enable_chain_position_check()
        return store

    def resize_pool(self, old: int, new: int) -> None:
        """New KV layers of ``new`` slots (the old bytes copied), every store resized
        (``CanaryStore.resize`` keeps the records), new RealKV sources."""
        for g in self.groups:
            kv = torch.zeros(new, KV_ELEMS, dtype=torch.bfloat16, device=self.device)
            kv[:old].copy_(g.kv)
            g.kv, g.real_kv = kv, real_kv(kv)
            g.head = g.head.resize(num_slots=new)
            g.tail = g.tail.resize(num_slots=new) if g.tail is not None else None
            if g.shadow_head is not None:
                g.shadow_head = g.shadow_head.resize(num_slots=new)
            if g.shadow_tail is not None:
                g.shadow_tail = g.shadow_tail.resize(num_slots=new)
        self.changed = True

    def grow_for_step(self, bs: int, n_tokens: int) -> None:
        """Room for a batch of ``bs`` rows (and, with graphs, the fixed inputs of
        ``n_tokens`` tokens), before the plan."""
        for g in self.groups:
            grown = g.buffers.ensure_capacity(write_reqs=bs)
            if grown is not g.buffers:
                self.say(
                    f"{g.name} plan buffers grew: write_req_capacity "
                    f"{g.buffers.write_req_capacity} -> {grown.write_req_capacity}, "
                    f"generation {grown.generation}"
                    + (", graphs re-captured" if self.config.graphs else "")
                )
                g.buffers = grown
                g.oracle = g.oracle.ensure_capacity(write_reqs=bs)
                self.stats.plan_resizes += 1
                self.changed = True
        if self.config.graphs:
            need = max(self.scheduler.max_batch * self.config.prefill_chunk, n_tokens)
            for g in self.groups:
                if g.tokens is None or g.tokens.capacity < need:
                    g.tokens = TokenInputs.allocate(need, self.device)
                if g.staging is None or g.staging.built_for is not g.buffers:
                    # staging is linked to its buffers: after any resize, build it again
                    g.staging = GraphInputs.for_buffers(g.buffers)

    def count_verify_entries(self, g: Group, host: dict[str, list[int]]) -> tuple[int, bool]:
        """The step's verify entries of ``g``, counted on the host from the scheduler's
        lists, and whether they overflow its ``verify_capacity`` (the step then verifies
        nothing: ``verify_enable = 0``)."""
        total = verify_entries_needed(
            host["prefix_lens"],
            req_pool_indices=host["req_pool_indices"],
            swa_window_size=g.window,
        )
        self.verify_totals[g.name] = total
        overflow = total > g.buffers.verify_capacity
        if overflow:
            self.stats.overflow_steps += 1
            self.say(
                f"{g.name}: {total} verify entries > verify_capacity "
                f"{g.buffers.verify_capacity}: this step verifies nothing (verify_enable=0)"
            )
        else:
            self.stats.verify_entries += total * (2 if g.tail is not None else 1)
        return total, overflow

    def grow_after_overflow(self, step_tokens: int) -> None:
        for g in self.groups:
            total = self.verify_totals.get(g.name, 0)
            if total > g.buffers.verify_capacity:
                # next step's prefixes are at most this step's plus this step's tokens
                need = total + step_tokens
                g.buffers = g.buffers.ensure_capacity(verify_entries=need)
                g.oracle = g.oracle.ensure_capacity(verify_entries=need)
                self.stats.plan_resizes += 1
                self.say(
                    f"{g.name} plan buffers grew: verify_capacity -> "
                    f"{g.buffers.verify_capacity}, generation {g.buffers.generation}"
                )

    # --- the launches ----------------------------------------------------------------
    def begin(self, rows: dict[str, torch.Tensor], valid_lens: torch.Tensor) -> None:
        """This step's rows (copied into the fixed staging with graphs)."""
        self.rows = rows
        if self.config.graphs:
            for g in self.groups:
                assert g.staging is not None
                g.staging.fill(valid_lens=valid_lens, **rows)

    def plan_kwargs(self, g: Group, valid_lens: torch.Tensor) -> dict[str, Any]:
        if self.config.graphs:
            assert g.staging is not None
            rows = g.staging.plan_kwargs(with_valid_lens=True)
        else:
            rows = dict(self.rows, req_to_verify_expected_tokens_valid_lens=valid_lens)
        sched = self.scheduler
        return dict(
            rows,
            req_to_token=sched.req_to_token,
            swa_window_size=g.window,
            full_to_swa_index_mapping=sched.pool.lut if g.window else None,
            req_to_verify_expected_tokens=sched.token_pool,
        )

    def group_tokens(self, g: Group, tokens: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The write's token inputs of group ``g`` (in its fixed staging with graphs)."""
        if g.window:
            tokens = dict(tokens, out_cache_loc=self.scheduler.pool.lut[tokens["out_cache_loc"]])
        if self.config.graphs:
            assert g.tokens is not None
            return g.tokens.fill(tokens)
        return tokens

    def _launch_pre(self, valid_lens: torch.Tensor) -> None:
        st = self.stages
        for g in self.groups:
            st.plan(g.buffers, **self.plan_kwargs(g, valid_lens))
            st.verify(g.head, g.buffers, launch_tag=tag(g.name, "HEAD_VERIFY"), real_kv=g.real_kv)

    def _launch_post(self, group_tokens: dict[str, dict[str, torch.Tensor]]) -> None:
        st = self.stages
        for g in self.groups:
            tokens = group_tokens[g.name]
            st.write(
                g.head,
                g.buffers,
                launch_tag=tag(g.name, "HEAD_WRITE"),
                real_kv=g.real_kv,
                **tokens,
            )
            if g.tail is not None:
                st.write(
                    g.tail,
                    g.buffers,
                    launch_tag=tag(g.name, "TAIL_WRITE"),
                    real_kv=g.real_kv,
                    **plain_tokens(tokens),
                )
                st.verify(
                    g.tail, g.buffers, launch_tag=tag(g.name, "TAIL_VERIFY"), real_kv=g.real_kv
                )

    def pre(self, eager: bool, valid_lens: torch.Tensor) -> EventPair | None:
        """Plan and HEAD verify of every group (steps 2-3)."""
        if self.graphs is None or eager:
            self._launch_pre(valid_lens)
            return None
        return _timed_replay(self.graphs[0])

    def post(self, eager: bool, tokens: dict[str, dict[str, torch.Tensor]]) -> EventPair | None:
        """Writes and TAIL verify of every group (steps 5-6)."""
        if self.graphs is None or eager:
            self._launch_post(tokens)
            return None
        return _timed_replay(self.graphs[1])

    # --- CUDA graphs -----------------------------------------------------------------
    def _graph_key(self) -> tuple[object, ...]:
        parts: list[object] = [self.scheduler.pool.num_slots]
        for g in self.groups:
            parts += [
                g.buffers.generation,
                g.head.generation,
                g.kv.data_ptr(),
                g.staging.capacity if g.staging else 0,
                g.tokens.capacity if g.tokens else 0,
            ]
        return tuple(parts)

    def runs_eagerly(self) -> bool:
        """Whether this step runs eagerly (always without graphs; with graphs, on the
        first step of a generation, which then captures)."""
        if not self.config.graphs:
            return True
        return self.graph_key != self._graph_key()

    def capture(self, valid_lens: torch.Tensor, tokens: dict[str, dict[str, torch.Tensor]]) -> None:
        """Capture the pre (plan + HEAD verify) and post (write + TAIL verify) graphs on
        the fixed inputs; this step already ran them eagerly (compiling every kernel)."""
        torch.cuda.synchronize()
        pre, post = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(pre):
            self._launch_pre(valid_lens)
        with torch.cuda.graph(post):
            self._launch_post(tokens)
        self.graphs = (pre, post)
        self.graph_key = self._graph_key()
        self.stats.captures += 1
        self.say(f"captured the pre and post graphs (capture {self.stats.captures})")

    # --- reading back ----------------------------------------------------------------
    def read_store(self, g: Group, name: str, store: CanaryStore) -> ViolationReport:
        """A store's status word (counted, said when not OK) and its violations (a sync)."""
        flags = store.take_status()
        self.stats.canary_flags |= flags
        if flags:
            self.say(f"{name} {g.name} store status: {flags!r}")
        return store.take_violations()


def _timed_replay(graph: torch.cuda.CUDAGraph) -> EventPair:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    return start, end

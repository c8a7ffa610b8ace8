"""The toy engine: :class:`Simulation` composes the scheduler, the canary step, the
corruption injector and the shadow checks, in the step order of the package docstring."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import cast

import torch

from kv_canary_buffers import PlanStatus

from .config import SimConfig, Stats
from .corruption import Corruption, Injection, Injector, Seen
from .scheduler import Request, Scheduler, StepInputs
from .shadow import Shadow
from .stages import REFERENCE_STAGES, Stages, kernel_stages
from .step import KV_ELEMS, PAGE_SIZE, CanaryStep, EventPair, Group


class Simulation:
    """The toy engine. Call :meth:`step` once per engine step; :meth:`inject` queues a
    corruption for the next step that has a request to put it in."""

    def __init__(
        self,
        config: SimConfig,
        *,
        stages: Stages | None = None,
        log: Callable[[str], None] | None = None,
    ):
        self.config = config
        self.device = _device(config.device)
        if stages is None:
            stages = kernel_stages(self.device) if config.kernels else REFERENCE_STAGES
        self.stages = stages
        self.log = log or (lambda _text: None)
        self.gen = torch.Generator().manual_seed(config.seed)
        self.step_index = 0
        self.stats = Stats()
        self.messages: list[str] = []
        self.seen: list[Seen] = []

        # the KV pool: enough slots for max_batch requests of max_seq_len, slot 0 reserved
        num_slots = _round_up(config.max_batch * config.max_seq_len + 1, PAGE_SIZE)
        self.scheduler = Scheduler(
            config,
            gen=self.gen,
            device=self.device,
            stats=self.stats,
            num_slots=num_slots,
            grow_pool=self.grow_pool,
        )
        self.canary = CanaryStep(
            config, stages=stages, scheduler=self.scheduler, stats=self.stats, say=self._say
        )
        self.shadow = Shadow(config, device=self.device, stats=self.stats, say=self._say)
        self.injector = Injector(self.scheduler, self._say)

    # --- what the demo and the tests read -------------------------------------------
    @property
    def groups(self) -> list[Group]:
        return self.canary.groups

    @property
    def running(self) -> list[Request]:
        return self.scheduler.running

    @property
    def max_batch(self) -> int:
        return self.scheduler.max_batch

    @property
    def num_slots(self) -> int:
        return self.scheduler.pool.num_slots

    @property
    def lut(self) -> torch.Tensor:
        """The ``swa`` group's slot of each full-pool slot (on the device)."""
        return self.scheduler.pool.lut

    @property
    def pending(self) -> list[Corruption]:
        return self.injector.pending

    @property
    def injections(self) -> list[Injection]:
        return self.injector.injections

    def explained(self, seen: Seen) -> bool:
        """Whether a violation concerns a request some injection damaged."""
        return self.injector.explained(seen)

    # --- what the engine does beside its steps ---------------------------------------
    def inject(self, kind: Corruption) -> None:
        """Queue ``kind``: it is put in at the next step where a request can take it
        (see :attr:`injections` for where it went and what caught it)."""
        self.pending.append(kind)

    def raise_batch_limit(self) -> None:
        """Double the batch limit (the plan buffers grow at the next step that needs it)
        and the KV pool with it (the stores grow now)."""
        self.scheduler.max_batch *= 2
        self._say(f"the engine raises its batch limit to {self.max_batch}")
        self.grow_pool("room for the larger batches")

    def grow_pool(self, why: str) -> None:
        """Double the KV pool: new KV layers (old bytes copied), the LUT extended, every
        store resized (``CanaryStore.resize`` keeps the records), new RealKV sources."""
        old, new = self.scheduler.pool.grow(self.gen)
        self.canary.resize_pool(old, new)
        self.stats.pool_resizes += 1
        gens = ", ".join(f"{g.name} store generation {g.head.generation}" for g in self.groups)
        self._say(
            f"KV pool grew ({why}): {old} -> {new} slots, stores resized ({gens})"
            + (", graphs re-captured" if self.config.graphs else "")
        )

    # --- one step -------------------------------------------------------------------
    def step(self) -> None:
        """One engine step: schedule, plan, HEAD verify, forward, write, TAIL verify, read
        back (see the package docstring)."""
        cfg, canary = self.config, self.canary
        batch, extends = self._schedule()  # 1
        inputs = self.scheduler.step_inputs(batch, extends)
        rows, valid_lens, tokens = inputs.rows, inputs.valid_lens, inputs.tokens
        bs = rows["req_pool_indices"].shape[0]
        canary.grow_for_step(bs, len(tokens["positions"]))
        eager = canary.runs_eagerly()
        canary.begin(rows, valid_lens)

        # 2-3: plan and HEAD verify
        t0 = time.perf_counter()
        timing = canary.pre(eager, valid_lens)
        pre_s = time.perf_counter() - t0
        self._check_plans(inputs)
        self.shadow.pre(canary.groups)

        # 4: the forward writes this step's KV bytes
        self.injector.in_forward(
            self.step_index, batch, tokens, inputs.offsets, extends, canary.groups[0].kv
        )
        self._forward(tokens["out_cache_loc"])

        # 5-6: write and TAIL verify (the swa group writes its LUT-translated slots)
        token_inputs = {g.name: canary.group_tokens(g, tokens) for g in canary.groups}
        t1 = time.perf_counter()
        timing2 = canary.post(eager, token_inputs)
        post_s = time.perf_counter() - t1
        self.shadow.post(canary.groups, token_inputs)
        if eager and cfg.graphs:
            canary.capture(valid_lens, token_inputs)
        self._time_step(timing, timing2, pre_s + post_s, eager)

        # 7: read back, abort flagged requests, retire finished ones
        self._read_back()
        canary.grow_after_overflow(len(tokens["positions"]))
        self.scheduler.finish_step(batch, extends, bs, len(canary.groups))
        self.injector.after_step(self.step_index, canary.groups[0])
        self.step_index += 1

    def _schedule(self) -> tuple[list[Request], dict[int, int]]:
        """Admit requests, pick the batch (every running request) and its token counts,
        allocate the slots into ``req_to_token`` and the tokens into the token pool; the
        corruption that happens between steps or at allocation goes in here."""
        sched = self.scheduler
        sched.admit()
        batch, extends = sched.pick_batch()
        self.injector.before_schedule(self.step_index, extends)
        new_slots = sched.allocate(batch, extends)
        self.injector.double_allocation(self.step_index, batch, new_slots)
        sched.place(batch, extends, new_slots)
        return batch, extends

    def _check_plans(self, inputs: StepInputs) -> None:
        """Per group: count the verify entries on the host (an overflow step verifies
        nothing), then check the plan against the references."""
        for g in self.groups:
            kwargs = self.canary.plan_kwargs(g, inputs.valid_lens)
            total, overflow = self.canary.count_verify_entries(g, inputs.host)
            if self.config.check_plans:
                self.shadow.check_plan(g, kwargs, inputs.host, total, overflow)

    def _forward(self, slots: torch.Tensor) -> None:
        """The model's KV write: fresh bytes at this step's slots in both groups' layers."""
        if not slots.numel():
            return
        values = torch.randn(slots.numel(), KV_ELEMS, generator=self.gen)
        values = values.to(device=self.device, dtype=torch.bfloat16)
        for g in self.groups:
            g.kv[slots if g.name == "full" else self.lut[slots]] = values

    def _time_step(
        self, pre: EventPair | None, post: EventPair | None, host_s: float, eager: bool
    ) -> None:
        """GPU time of the replays, or host time of the eager launches; warm-up,
        compilation, capture and resize steps are counted as untimed."""
        if pre is not None and post is not None:
            torch.cuda.synchronize()
            us = (pre[0].elapsed_time(pre[1]) + post[0].elapsed_time(post[1])) * 1e3
        else:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            us = host_s * 1e6
        if self.step_index < 2 or self.canary.changed or (eager and self.config.graphs):
            self.stats.untimed_steps += 1
        else:
            self.stats.step_us.append(us)
        self.canary.changed = False

    def _read_back(self) -> None:
        flagged: dict[int, Seen] = {}
        for g in self.groups:
            # An overflow (VERIFY_OVERFLOW) is the demo's own small first capacity, counted
            # on the host as an overflow step: not a fault of the run.
            self.stats.plan_flags |= g.buffers.take_status() & ~PlanStatus.VERIFY_OVERFLOW
            for name, store, shadow in g.stores():
                report = self.canary.read_store(g, name, store)
                if shadow is not None:
                    self.shadow.compare_store(g, name, store, shadow, report)
                for v in report.violations:
                    full = v.slot if g.name == "full" else int(self.scheduler.pool.inv_lut[v.slot])
                    seen = Seen(self.step_index, g.name, name, v, full)
                    self.seen.append(seen)
                    flagged.setdefault(full, seen)
                    self.injector.match(seen)
        for inj in self.injections:
            if inj.caught and inj.caught_step == self.step_index:
                self._say(f"caught {inj.kind.value} ({inj.caught_by}): {inj.first}")
        if flagged:
            self._abort(flagged)

    def _abort(self, flagged: dict[int, Seen]) -> None:
        """Abort every running request that holds a flagged slot."""
        holders = self.scheduler.pool.holders
        for slot in flagged:
            self.injector.holders_then[(self.step_index, slot)] = set(holders.get(slot, ()))
        victims = {rid for slot in flagged for rid in holders.get(slot, ())}
        for req in [r for r in self.running if r.id in victims]:
            slots = sorted(s for s in flagged if req.id in holders.get(s, ()))
            self.scheduler.release(req)
            self.stats.aborted += 1
            self._say(
                f"aborted request {req.id} (row {req.row}): "
                f"{len(slots)} of its slots flagged ({_short(slots)})"
            )

    def _say(self, text: str) -> None:
        line = f"step {self.step_index}: {text}"
        self.messages.append(line)
        self.log(line)


def _device(name: str) -> torch.device:
    """``torch.device(name)`` with a bare ``cuda`` pinned to the current index, as the
    library's owners report their device."""
    device = torch.device(name)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ValueError(f"kv-canary simulation: device {name!r}: CUDA is not available")
    index = cast("int | None", device.index)  # torch's stubs say int: None for a bare "cuda"
    return device if index is not None else torch.device("cuda", torch.cuda.current_device())


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _short(values: Sequence[int], limit: int = 6) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (f", ... {len(values) - limit} more" if len(values) > limit else "")

"""A toy serving engine that runs the whole canary around its forward pass.

The demo (``python -m kv_canary_buffers``) and the end-to-end tests drive a
:class:`Simulation`: requests arrive, prefill in chunks, decode one token a step and
finish; their KV slots come from a LIFO free list, so finished requests' slots are reused
at once. The KV pool has two buffer groups, as a hybrid model's would: ``full`` (full
attention) and ``swa`` (a sliding window of ``swa_window`` tokens, whose slots are the full
pool's translated by a LUT, ``full_to_swa_index_mapping``). Each group has a fake KV layer
(a bfloat16 tensor the "forward" writes random bytes into) that the canary fingerprints with
a PARTIAL real-KV hash, and an expected-token pool (the tokens the scheduler believes are
in the cache) that the verify checks.

Step order (what an engine does around each forward pass)
----------------------------------------------------------
Per KV pool (buffer group) the engine owns one :class:`PlanBuffers` and two
:class:`CanaryStore` objects, the HEAD store and the TAIL store, holding the same records
in a correct run. Every step:

1. **schedule** (host): admit requests, pick the batch, allocate this step's slots into
   ``req_to_token`` and put the scheduled tokens into the expected-token pool.
2. **plan** each group (``launch_plan`` / ``plan_reference``): which slots this step
   writes and which prefix slots the batch attends to.
3. **HEAD verify**, before the forward: check every prefix slot of the batch against the
   HEAD store (chain, position, expected token, real-KV hash). It catches what happened
   *between* steps (a slot handed to two requests, a page freed while still referenced, an
   off-by-one in the paged index, a stale expected token, KV bytes or records overwritten)
   before attention reads the damaged KV.
4. **forward**: the model writes this step's KV bytes at ``out_cache_loc``.
5. **write**, after the forward (the real-KV hash must see the bytes just written): stamp
   this step's slots into the HEAD store with ``expected_input_ids`` /
   ``expected_positions`` from the scheduler's view (a token the forward consumed that
   differs from the scheduled one shows as ``WRITE_TOKEN``), and into the TAIL store.
6. **TAIL verify**, after the write: check the same prefix slots against the TAIL store.
   It catches what *this* step's forward and write did (a stray kernel overwriting a live
   slot's KV, a slot handed to two requests of the same batch) in the same step instead
   of the next. Because the TAIL store is a second copy of the records, a record damaged
   in one store only (a stray write into canary memory) is told apart from damage to the
   KV pool itself, which both stores see.
7. **read back** (host, a sync): the violations and status words; the engine aborts every
   request that holds a flagged slot. A real engine reads every N steps; the simulation
   reads every step so that it can say which step caught what.

In code, per step and group (each launch has its own ``launch_tag``, :class:`LaunchTag`,
so a violation row names the endpoint and group that saw it)::

    launch_plan(buffers, req_pool_indices=..., prefix_lens=..., extend_seq_lens=...,
                req_to_token=..., req_to_verify_expected_tokens=pool,
                req_to_verify_expected_tokens_valid_lens=prefix_lens_of_rows)
    launch_verify(head, buffers, launch_tag=HEAD_VERIFY, real_kv=real_kv)
    model.forward(...)                     # writes KV at out_cache_loc
    launch_write(head, buffers, input_ids=..., positions=..., out_cache_loc=...,
                 expected_input_ids=..., expected_positions=..., real_kv=real_kv,
                 launch_tag=HEAD_WRITE)
    launch_write(tail, buffers, input_ids=..., positions=..., out_cache_loc=...,
                 real_kv=real_kv, launch_tag=TAIL_WRITE)
    launch_verify(tail, buffers, launch_tag=TAIL_VERIFY, real_kv=real_kv)
    if step % N == 0:                      # a sync: outside graphs, not every step
        report = head.take_violations()    # and tail's, and take_status() of each

The ``swa`` group passes its LUT to the plan and its translated slots
(``LUT[out_cache_loc]``) to the write. The stores are created once per pool with
``enable_chain_position_check()``; when the KV pool grows, each store is replaced by
``store.resize(num_slots=...)`` (records kept) and each ``RealKV`` rebuilt on the new KV
tensors; a grown batch or prefix total is ``buffers.ensure_capacity(...)``. A step's verify
entries are counted on the host, from the scheduler's lists, with
``verify_entries_needed(prefix_lens, req_pool_indices=..., swa_window_size=...)``; an
engine grows ``verify_capacity`` from it before the plan, while the simulation lets the
full group's small first capacity overflow once (``verify_enable = 0``) to show it, then
grows from the same count.

Turning the TAIL store off (``tail=False``) halves the canary's memory and launches; the
HEAD store alone still catches every corruption kind, one step later for those that
happen during a forward. On CUDA with the kernels, steps 2-3 and 5-6 are each captured
once per generation in a CUDA graph (``pre`` and ``post``) and replayed after refilling
fixed input tensors (:class:`GraphInputs` for the rows, :class:`TokenInputs` for the
tokens); a grown plan buffer, store or KV pool is a new generation and is re-captured.

This module never imports Triton: the kernels are imported inside :func:`kernel_stages`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias

import attrs
import torch

from .buffers import PlanBuffers
from .compare import plans_equal
from .devices import normalize_device
from .plan import plan_reference
from .real_kv import RealKV, RealKVMode
from .report import Violation
from .sizing import verify_entries_needed
from .staging import GraphInputs
from .status import CanaryStatus, FailBits, PlanStatus
from .store import CanaryStore
from .verify import verify_reference
from .write import write_reference

_EventPair: TypeAlias = tuple[torch.cuda.Event, torch.cuda.Event]

VOCAB = 32000
KV_ELEMS = 16
"""bfloat16 elements of one slot's fake KV (32 bytes: a multiple of 16, as RealKV needs)."""
PAGE_SIZE = 16
"""Slots per row of the fake KV layer as the real-KV hash reads it."""
ROW_BUCKET = 4
"""Eager batches are padded to a multiple of this with padding rows (garbage lengths)."""


# --- stages -------------------------------------------------------------------------
@attrs.frozen
class Stages:
    """The three canary stages: the torch references or the Triton kernels."""

    name: str
    plan: Callable[..., None]
    write: Callable[..., None]
    verify: Callable[..., None]
    kernels: bool


REFERENCE_STAGES = Stages(
    "torch references (plan_reference, verify_reference, write_reference)",
    plan_reference,
    write_reference,
    verify_reference,
    False,
)


def kernel_stages(device: torch.device) -> Stages:
    """The Triton kernels (imported here: the rest of this package never imports Triton)."""
    from kv_canary_kernels import launch_plan, launch_verify, launch_write

    where = "GPU" if device.type == "cuda" else "CPU, Triton interpreter"
    return Stages(
        f"Triton kernels (launch_plan, launch_verify, launch_write; {where})",
        launch_plan,
        launch_write,
        launch_verify,
        True,
    )


# --- corruption kinds ----------------------------------------------------------------
class Corruption(enum.Enum):
    """What ``Simulation.inject`` can break, and where the canary must see it."""

    DOUBLE_ALLOCATION = "slot given to two requests"
    FREED_PAGE_REUSED = "page freed and reused while referenced"
    RECORD_OVERWRITTEN = "record overwritten"
    KV_OVERWRITTEN = "KV bytes overwritten"
    POSITION_OFF_BY_ONE = "position off by one"
    WRONG_TOKEN_WRITTEN = "wrong token written"
    STALE_EXPECTED_TOKEN = "stale expected token"

    @property
    def expected_bits(self) -> FailBits:
        """The bits a violation must carry, at a slot the injection names (the ``swa``
        group's slots translated back through the LUT), for the kind to count as caught."""
        return _EXPECTED_BITS[self]


_EXPECTED_BITS = {
    Corruption.DOUBLE_ALLOCATION: FailBits.CHAIN | FailBits.POSITION,
    Corruption.FREED_PAGE_REUSED: FailBits.CHAIN,
    Corruption.RECORD_OVERWRITTEN: FailBits.CHAIN | FailBits.POSITION | FailBits.REAL_KV,
    Corruption.KV_OVERWRITTEN: FailBits.REAL_KV,
    Corruption.POSITION_OFF_BY_ONE: FailBits.CHAIN | FailBits.POSITION,
    Corruption.WRONG_TOKEN_WRITTEN: FailBits.WRITE_TOKEN,
    Corruption.STALE_EXPECTED_TOKEN: FailBits.VERIFY_TOKEN,
}


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


def _tag(group: str, launch: str) -> int:
    return int(LaunchTag[f"{launch}_{group.upper()}"])


@attrs.define(eq=False)
class Injection:
    """One injected corruption: where it was put and, once seen, what caught it."""

    kind: Corruption
    step: int
    where: str
    slots: frozenset[int]
    """Full-pool slots at which a violation with ``kind.expected_bits`` is expected."""
    victims: set[int]
    """Ids of the requests the corruption damages (their violations are explained)."""
    caught_step: int | None = None
    caught_by: str = ""
    first: Violation | None = None

    @property
    def caught(self) -> bool:
        return self.first is not None


@attrs.frozen
class Seen:
    """One violation row read back, with the store it came from."""

    step: int
    group: str
    store: str
    """"HEAD" or "TAIL"."""
    violation: Violation
    full_slot: int
    """The violation's slot in full-pool numbering (the ``swa`` group's translated back)."""


# --- configuration and state ---------------------------------------------------------
@attrs.frozen(kw_only=True)
class SimConfig:
    """Everything that shapes a run; the defaults are the demo's."""

    max_batch: int = 32
    device: str = "cpu"
    seed: int = 0
    kernels: bool = False
    """Run the Triton kernels (GPU, or CPU with ``TRITON_INTERPRET=1``), else the torch
    references."""
    graphs: bool = False
    """Replay the canary from CUDA graphs (CUDA with the kernels only)."""
    tail: bool = True
    """Keep a TAIL store (written and verified after the forward)."""
    max_seq_len: int = 256
    max_prompt: int = 200
    min_output: int = 16
    max_output: int = 96
    prefill_chunk: int = 64
    max_arrivals: int = 4
    swa_window: int = 32
    verify_capacity_per_row: int = 32
    """Initial verify capacity of each group, per batch row: small, so that a long batch
    overflows (``verify_enable = 0``) and the buffers grow."""
    check_plans: bool = True
    """Compare every plan with ``plan_reference`` and the contract's invariants."""
    check_stores: bool = True
    """With the kernels: keep reference stores fed with the same inputs and compare
    records, counters and violations every step."""
    violation_capacity: int = 4096

    @classmethod
    def for_max_seq_len(cls, max_seq_len: int, **kwargs: Any) -> SimConfig:
        """Request shapes scaled from the longest request (the defaults are those of
        256): prompts up to 25/32 of it, outputs of 1/16 to 3/8 of it, prefill chunks of
        1/4, a sliding window of 1/8 and an initial verify capacity of 1/8 per row."""
        n = max_seq_len
        shapes: dict[str, Any] = dict(
            max_seq_len=n,
            max_prompt=max(1, 25 * n // 32),
            min_output=max(1, n // 16),
            max_output=max(1, 3 * n // 8),
            prefill_chunk=max(2, n // 4),
            swa_window=max(2, n // 8),
            verify_capacity_per_row=max(1, n // 8),
        )
        shapes.update(kwargs)
        return cls(**shapes)

    def __attrs_post_init__(self) -> None:
        if self.max_seq_len < 8:
            raise ValueError("kv-canary simulation: max_seq_len must be >= 8")
        if self.graphs and not (self.kernels and torch.device(self.device).type == "cuda"):
            raise ValueError("kv-canary simulation: graphs need the kernels on a CUDA device")


@attrs.define(eq=False)
class Request:
    id: int
    row: int
    prompt_len: int
    output_len: int
    prefix: int = 0
    """Tokens whose KV is written and stamped."""
    slots: list[int] = attrs.Factory(list)
    """KV slot of each position (this step's included once allocated)."""
    tokens: list[int] = attrs.Factory(list)
    """The scheduler's token at each position."""

    @property
    def total(self) -> int:
        return self.prompt_len + self.output_len

    @property
    def done(self) -> bool:
        return self.prefix >= self.total


@attrs.define(eq=False)
class Group:
    """One buffer group: its plan buffers, HEAD/TAIL stores, fake KV layer and staging."""

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


@attrs.define
class Stats:
    steps: int = 0
    admitted: int = 0
    finished: int = 0
    aborted: int = 0
    rows: int = 0
    active_rows: int = 0
    prefill_rows: int = 0
    decode_rows: int = 0
    reused_slots: int = 0
    """Allocations of a slot that an earlier request had held."""
    write_entries: int = 0
    verify_entries: int = 0
    overflow_steps: int = 0
    plan_resizes: int = 0
    pool_resizes: int = 0
    captures: int = 0
    plan_mismatches: int = 0
    store_mismatches: int = 0
    plan_flags: PlanStatus = PlanStatus.OK
    canary_flags: CanaryStatus = CanaryStatus.OK
    step_us: list[float] = attrs.Factory(list)
    untimed_steps: int = 0


# --- the engine ----------------------------------------------------------------------
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
        self.device = normalize_device(config.device)
        if stages is None:
            stages = kernel_stages(self.device) if config.kernels else REFERENCE_STAGES
        self.stages = stages
        self.log = log or (lambda _text: None)
        self.gen = torch.Generator().manual_seed(config.seed)
        self.step_index = 0
        self.max_batch = config.max_batch
        self.stats = Stats()
        self.messages: list[str] = []

        self.rows = 4 * config.max_batch + 1  # row 0 is never a request: it marks padding
        shape = (self.rows, config.max_seq_len)
        self.req_to_token = torch.zeros(shape, dtype=torch.int32, device=self.device)
        self.token_pool = torch.zeros(shape, dtype=torch.int32, device=self.device)
        self.free_rows = list(range(self.rows - 1, 0, -1))
        self.running: list[Request] = []
        self.next_id = 1

        # the KV pool: enough slots for max_batch requests of max_seq_len, slot 0 reserved
        self.num_slots = _round_up(config.max_batch * config.max_seq_len + 1, PAGE_SIZE)
        self.free: list[int] = []
        self.in_free: set[int] = set()
        self._add_free(range(1, self.num_slots))
        self.holders: dict[int, set[int]] = {}
        self.used_slots: set[int] = set()
        self.lut = torch.cat(
            [
                torch.zeros(1, dtype=torch.int64),
                1 + torch.randperm(self.num_slots - 1, generator=self.gen),
            ]
        )
        self.inv_lut = torch.argsort(self.lut)
        self.lut = self.lut.to(self.device)

        cap = config.max_batch * config.verify_capacity_per_row
        self.groups = [self._group("full", 0, cap), self._group("swa", config.swa_window, cap)]

        self.pending: list[Corruption] = []
        self.injections: list[Injection] = []
        self.seen: list[Seen] = []
        self.tainted: set[int] = set()

        self.graphs: tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph] | None = None
        self.graph_key: tuple[object, ...] | None = None
        self._changed = False  # a resize or growth since the last timed step
        self._step_rows: dict[str, torch.Tensor] = {}
        self._verify_totals: dict[str, int] = {}
        self._host_rows: dict[str, list[int]] = {}
        self._holders_then: dict[tuple[int, int], set[int]] = {}

    # --- construction helpers ---------------------------------------------------
    def _group(self, name: str, window: int, verify_capacity: int) -> Group:
        def make() -> PlanBuffers:
            return PlanBuffers.allocate(
                write_req_capacity=self.max_batch,
                verify_capacity=verify_capacity,
                device=self.device,
            )

        kv = torch.zeros(self.num_slots, KV_ELEMS, dtype=torch.bfloat16, device=self.device)
        tail = self.config.tail
        shadow = self.stages.kernels and self.config.check_stores
        return Group(
            name=name,
            window=window,
            buffers=make(),
            oracle=make(),
            head=self._store(),
            tail=self._store() if tail else None,
            shadow_head=self._store() if shadow else None,
            shadow_tail=self._store() if shadow and tail else None,
            kv=kv,
            real_kv=_real_kv(kv),
        )

    def _store(self) -> CanaryStore:
        store = CanaryStore.allocate(
            num_slots=self.num_slots,
            violation_capacity=self.config.violation_capacity,
            device=self.device,
        )
        store.enable_chain_position_check()
        return store

    def _say(self, text: str) -> None:
        line = f"step {self.step_index}: {text}"
        self.messages.append(line)
        self.log(line)

    def _rand(self, low: int, high: int) -> int:
        """A random int in ``[low, high)`` from the run's generator."""
        return int(torch.randint(low, high, (1,), generator=self.gen))

    # --- the slot allocator -------------------------------------------------------
    def _add_free(self, slots: Iterable[int]) -> None:
        for s in slots:
            if s not in self.in_free:
                self.free.append(s)
                self.in_free.add(s)

    def _alloc(self) -> int:
        if not self.free:
            self.grow_pool("the free list ran out")
        s = self.free.pop()
        self.in_free.discard(s)
        if s in self.used_slots:
            self.stats.reused_slots += 1
        self.used_slots.add(s)
        return s

    def _hold(self, req: Request, slot: int) -> None:
        self.holders.setdefault(slot, set()).add(req.id)

    def _release(self, req: Request) -> None:
        """Give back a finished or aborted request's row and slots (a slot still held by
        another request stays out of the free list)."""
        for s in dict.fromkeys(req.slots):
            owners = self.holders.get(s)
            if owners is None:
                continue
            owners.discard(req.id)
            if not owners:
                del self.holders[s]
                self._add_free([s])
        self.req_to_token[req.row].zero_()
        self.free_rows.append(req.row)
        self.running.remove(req)

    def grow_pool(self, why: str) -> None:
        """Double the KV pool: new KV layers (old bytes copied), the LUT extended, every
        store resized (``CanaryStore.resize`` keeps the records), new RealKV sources."""
        old, new = self.num_slots, 2 * self.num_slots
        extra = old + torch.randperm(new - old, generator=self.gen)
        lut = torch.cat([self.lut.cpu(), extra])
        self.lut = lut.to(self.device)
        self.inv_lut = torch.argsort(lut)
        self.free[:0] = list(range(old, new))  # below the old free slots: used last
        self.in_free.update(range(old, new))
        self.num_slots = new
        for g in self.groups:
            kv = torch.zeros(new, KV_ELEMS, dtype=torch.bfloat16, device=self.device)
            kv[:old].copy_(g.kv)
            g.kv, g.real_kv = kv, _real_kv(kv)
            g.head = g.head.resize(num_slots=new)
            g.tail = g.tail.resize(num_slots=new) if g.tail is not None else None
            if g.shadow_head is not None:
                g.shadow_head = g.shadow_head.resize(num_slots=new)
            if g.shadow_tail is not None:
                g.shadow_tail = g.shadow_tail.resize(num_slots=new)
        self.stats.pool_resizes += 1
        self._changed = True
        gens = ", ".join(f"{g.name} store generation {g.head.generation}" for g in self.groups)
        self._say(
            f"KV pool grew ({why}): {old} -> {new} slots, stores resized ({gens})"
            + (", graphs re-captured" if self.config.graphs else "")
        )

    # --- corruption ---------------------------------------------------------------
    def inject(self, kind: Corruption) -> None:
        """Queue ``kind``: it is put in at the next step where a request can take it
        (see :attr:`injections` for where it went and what caught it)."""
        self.pending.append(kind)

    def _take(self, kind: Corruption) -> bool:
        if kind in self.pending:
            self.pending.remove(kind)
            return True
        return False

    def _victim(
        self,
        *,
        min_prefix: int,
        extends: dict[int, int] | None = None,
        exclude: Sequence[Request] = (),
    ) -> Request | None:
        """A random running request with at least ``min_prefix`` stamped tokens, not
        already damaged, that lives for 4 more steps (time for the canary to see it)."""
        extends = extends or {}
        pool = [
            r
            for r in self.running
            if r.prefix >= min_prefix
            and r.id not in self.tainted
            and r not in exclude
            and self._steps_left(r, r.prefix + extends.get(r.id, 0)) >= 4
        ]
        return pool[self._rand(0, len(pool))] if pool else None

    def _steps_left(self, req: Request, prefix: int) -> int:
        """Steps ``req`` runs once ``prefix`` tokens are stamped."""
        steps = 0
        while prefix < req.total:
            prefix += self.config.prefill_chunk if prefix < req.prompt_len else 1
            steps += 1
        return steps

    def _record(
        self, kind: Corruption, where: str, slots: Iterable[int], victims: Iterable[Request]
    ) -> None:
        ids = {r.id for r in victims}
        self.tainted |= ids
        self.injections.append(
            Injection(
                kind=kind, step=self.step_index, where=where, slots=frozenset(slots), victims=ids
            )
        )
        self._say(f"injected {kind.value}: {where}")

    def _inject_before_schedule(self, extends: dict[int, int]) -> None:
        kind = Corruption.FREED_PAGE_REUSED
        if kind in self.pending:
            req = self._victim(min_prefix=4, extends=extends)
            if req is not None:
                self._take(kind)
                # not the last position: that slot seeds the request's write this step,
                # and a seed written by another row of the same call is unspecified
                p = self._rand(1, req.prefix - 2)
                freed = req.slots[p : min(p + 4, req.prefix - 1)]
                for s in freed:  # on top of the free list: the next allocations take them
                    if s in self.in_free:
                        self.free.remove(s)
                    self.free.append(s)
                    self.in_free.add(s)
                self._record(
                    kind,
                    f"request {req.id} (row {req.row}) still references "
                    f"positions {p}..{p + len(freed) - 1}, slots {freed}, now free",
                    freed,
                    [req],
                )
        kind = Corruption.POSITION_OFF_BY_ONE
        if kind in self.pending:
            req = self._victim(min_prefix=3, extends=extends)
            if req is not None:
                self._take(kind)
                p = self._rand(0, req.prefix - 1)
                a, b = req.slots[p], req.slots[p + 1]
                req.slots[p], req.slots[p + 1] = b, a
                self.req_to_token[req.row, p : p + 2] = torch.tensor([b, a], dtype=torch.int32)
                self._record(
                    kind,
                    f"req_to_token of request {req.id} (row {req.row}) "
                    f"swapped positions {p} and {p + 1}: position {p} -> slot {b}",
                    [b],
                    [req],
                )
        kind = Corruption.STALE_EXPECTED_TOKEN
        if kind in self.pending:
            req = self._victim(min_prefix=1, extends=extends)
            if req is not None:
                self._take(kind)
                p = self._rand(0, req.prefix)
                stale = (req.tokens[p] + 1 + self._rand(0, VOCAB - 1)) % VOCAB
                self.token_pool[req.row, p] = stale
                self._record(
                    kind,
                    f"token pool of request {req.id} (row {req.row}) holds "
                    f"{stale} at position {p} (slot {req.slots[p]}), "
                    f"{req.tokens[p]} was written",
                    [req.slots[p]],
                    [req],
                )

    def _inject_double_allocation(
        self, batch: list[Request], new_slots: dict[int, list[int]]
    ) -> None:
        kind = Corruption.DOUBLE_ALLOCATION
        if kind not in self.pending:
            return
        takers = [r for r in batch if new_slots[r.id] and r.id not in self.tainted]
        if not takers:
            return
        taker = takers[self._rand(0, len(takers))]
        extends = {r.id: len(new_slots[r.id]) for r in batch}
        owner = self._victim(min_prefix=3, extends=extends, exclude=[taker])
        if owner is None:
            return
        self._take(kind)
        taker_pos = taker.prefix  # the taker's first new position
        # not the owner's last position: it seeds the owner's write in this same call
        choices = [p for p in range(owner.prefix - 1) if p != taker_pos]
        p = choices[self._rand(0, len(choices))]
        s = owner.slots[p]
        self._add_free([new_slots[taker.id][0]])  # the slot it should have had
        new_slots[taker.id][0] = s
        self._record(
            kind,
            f"request {taker.id} (row {taker.row}) got slot {s} for position "
            f"{taker_pos}, live at position {p} of request {owner.id} "
            f"(row {owner.row})",
            [s],
            [owner, taker],
        )

    def _inject_in_forward(
        self,
        batch: list[Request],
        tokens: dict[str, torch.Tensor],
        offsets: dict[int, int],
        extends: dict[int, int],
    ) -> None:
        kind = Corruption.WRONG_TOKEN_WRITTEN
        if kind in self.pending:
            writers = [r for r in batch if extends[r.id] and r.id not in self.tainted]
            if writers:
                self._take(kind)
                req = writers[self._rand(0, len(writers))]
                i = offsets[req.id]
                want = int(tokens["expected_input_ids"][i])
                got = (want + 1 + self._rand(0, VOCAB - 1)) % VOCAB
                tokens["input_ids"][i] = got
                s = int(tokens["out_cache_loc"][i])
                self._record(
                    kind,
                    f"the forward consumed token {got} for request {req.id} "
                    f"(row {req.row}) at position {req.prefix}, slot {s}; the "
                    f"scheduler sent {want}",
                    [s],
                    [req],
                )
        kind = Corruption.KV_OVERWRITTEN
        if kind in self.pending:
            victim = self._victim(min_prefix=1, extends=extends)
            if victim is not None:
                self._take(kind)
                p = self._rand(0, victim.prefix)
                s = victim.slots[p]
                bits = self.groups[0].kv.view(torch.int16)[s, :8]
                bits ^= 0x1111  # a stray kernel scribbles over a live slot's first 16 bytes
                self._record(
                    kind,
                    f"the forward overwrote the KV bytes of slot {s} "
                    f"(position {p} of request {victim.id}, row {victim.row})",
                    [s],
                    [victim],
                )

    def _inject_after_step(self) -> None:
        kind = Corruption.RECORD_OVERWRITTEN
        if kind not in self.pending:
            return
        req = self._victim(min_prefix=1)
        if req is None:
            return
        self._take(kind)
        p = self._rand(0, req.prefix)
        s = req.slots[p]
        g = self.groups[0]
        mask = torch.tensor(
            [0x5A5A, 7, 0x1234_5678_9ABC, 0x0F0F_0F0F], dtype=torch.int64, device=self.device
        )
        for store in (g.head, g.shadow_head):
            if store is not None:
                store.records[s] ^= mask  # a stray write into the HEAD store's memory
        self._record(
            kind,
            f"HEAD store record of slot {s} (position {p} of request "
            f"{req.id}, row {req.row}) overwritten",
            [s],
            [req],
        )

    # --- one step -----------------------------------------------------------------
    def step(self) -> None:
        """One engine step: schedule, plan, HEAD verify, forward, write, TAIL verify, read
        back (see the module docstring)."""
        cfg = self.config
        batch, extends = self._schedule()  # 1
        rows, valid_lens, tokens, offsets = self._step_inputs(batch, extends)
        self._grow_plan_buffers(rows["req_pool_indices"].shape[0], len(tokens["positions"]))
        eager = self._prepare_graphs()
        self._step_rows = rows
        if cfg.graphs:
            for g in self.groups:
                assert g.staging is not None
                g.staging.fill(valid_lens=valid_lens, **rows)

        # 2-3: plan and HEAD verify
        t0 = time.perf_counter()
        timing = self._pre(eager, valid_lens)
        pre_s = time.perf_counter() - t0
        self._check_plans(valid_lens)
        self._shadow_pre()

        # 4: the forward writes this step's KV bytes
        self._inject_in_forward(batch, tokens, offsets, extends)
        self._forward(tokens["out_cache_loc"])

        # 5-6: write and TAIL verify (the swa group writes its LUT-translated slots)
        token_inputs = {g.name: self._group_tokens(g, tokens) for g in self.groups}
        t1 = time.perf_counter()
        timing2 = self._post(eager, token_inputs)
        post_s = time.perf_counter() - t1
        self._shadow_post(token_inputs)
        if eager and cfg.graphs:
            self._capture(valid_lens, token_inputs)

        # timing: GPU time of the replays, or host time of the eager launches
        if timing is not None and timing2 is not None:
            torch.cuda.synchronize()
            us = (timing[0].elapsed_time(timing[1]) + timing2[0].elapsed_time(timing2[1])) * 1e3
        else:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            us = (pre_s + post_s) * 1e6
        if self.step_index < 2 or self._changed or (eager and cfg.graphs):
            self.stats.untimed_steps += 1  # warm-up, compilation, capture or a resize
        else:
            self.stats.step_us.append(us)
        self._changed = False

        # 7: read back, abort flagged requests, retire finished ones
        self._read_back()
        self._grow_after_overflow(len(tokens["positions"]))
        self._finish_step(batch, extends, rows)
        self._inject_after_step()
        self.step_index += 1

    def _schedule(self) -> tuple[list[Request], dict[int, int]]:
        """Admit requests, pick the batch (every running request) and its token counts,
        allocate the slots into ``req_to_token`` and the tokens into the token pool."""
        self._admit()
        batch = list(self.running)
        extends: dict[int, int] = {}
        for req in batch:  # chunked prefill, then one token a step
            chunk = self.config.prefill_chunk if req.prefix < req.prompt_len else 1
            extends[req.id] = min(chunk, req.total - req.prefix)
        self.stats.prefill_rows += sum(1 for r in batch if r.prefix < r.prompt_len)
        self.stats.decode_rows += sum(1 for r in batch if r.prefix >= r.prompt_len)
        self._inject_before_schedule(extends)
        new_slots = {r.id: [self._alloc() for _ in range(extends[r.id])] for r in batch}
        self._inject_double_allocation(batch, new_slots)
        for req in batch:
            e = extends[req.id]
            span = slice(req.prefix, req.prefix + e)
            req.slots[span] = new_slots[req.id]
            for s in new_slots[req.id]:
                self._hold(req, s)
            new_tokens = torch.randint(0, VOCAB, (e,), generator=self.gen).tolist()
            req.tokens[span] = new_tokens
            self.req_to_token[req.row, span] = torch.tensor(new_slots[req.id], dtype=torch.int32)
            self.token_pool[req.row, span] = torch.tensor(new_tokens, dtype=torch.int32)
        return batch, extends

    def _step_inputs(
        self, batch: list[Request], extends: dict[int, int]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, torch.Tensor], dict[int, int]]:
        """The batch as the plan sees it (rows, padded to a bucket with padding rows of
        garbage lengths, and the token pool's valid lengths) and as the write sees it (the
        tokens flat in row order; ``offsets``: each request's first index)."""
        pad = (-len(batch)) % ROW_BUCKET

        def garbage() -> list[int]:  # a padding row's lengths may hold anything
            return torch.randint(-9, 10**6, (pad,), generator=self.gen).tolist()

        # the host lists the batch is built from (what an engine's scheduler holds)
        self._host_rows = {
            "req_pool_indices": [r.row for r in batch] + [0] * pad,
            "prefix_lens": [r.prefix for r in batch] + garbage(),
        }
        rows = dict(
            req_pool_indices=_i64(self._host_rows["req_pool_indices"], self.device),
            prefix_lens=_i64(self._host_rows["prefix_lens"], self.device),
            extend_seq_lens=_i64([extends[r.id] for r in batch] + garbage(), self.device),
        )
        valid_lens = _i64([r.prefix for r in batch] + [0] * pad, self.device)
        offsets: dict[int, int] = {}
        flat_slots: list[int] = []
        flat_pos: list[int] = []
        flat_tok: list[int] = []
        for req in batch:
            e = extends[req.id]
            offsets[req.id] = len(flat_slots)
            flat_slots += req.slots[req.prefix : req.prefix + e]
            flat_pos += list(range(req.prefix, req.prefix + e))
            flat_tok += req.tokens[req.prefix : req.prefix + e]
        tokens = {
            "input_ids": _i64(flat_tok, self.device),  # what the forward consumes
            "positions": _i64(flat_pos, self.device),
            "out_cache_loc": _i64(flat_slots, self.device),
            "expected_input_ids": _i64(flat_tok, self.device),  # the scheduler's view
            "expected_positions": _i64(flat_pos, self.device),
        }
        return rows, valid_lens, tokens, offsets

    def _forward(self, slots: torch.Tensor) -> None:
        """The model's KV write: fresh bytes at this step's slots in both groups' layers."""
        if not slots.numel():
            return
        values = torch.randn(slots.numel(), KV_ELEMS, generator=self.gen)
        values = values.to(device=self.device, dtype=torch.bfloat16)
        for g in self.groups:
            g.kv[slots if g.name == "full" else self.lut[slots]] = values

    def _finish_step(
        self, batch: list[Request], extends: dict[int, int], rows: dict[str, torch.Tensor]
    ) -> None:
        """Advance the surviving requests, retire the finished ones, count the step."""
        for req in batch:
            if req in self.running:
                req.prefix += extends[req.id]
        for req in [r for r in self.running if r.done]:
            self._release(req)
            self.stats.finished += 1
        s = self.stats
        s.steps += 1
        s.rows += rows["req_pool_indices"].shape[0]
        s.active_rows += len(batch)
        s.write_entries += sum(extends.values()) * len(self.groups)

    def _admit(self) -> None:
        cfg = self.config
        arrivals = self._rand(0, cfg.max_arrivals + 1)
        if not self.running:
            arrivals = max(arrivals, 1)  # never plan an empty step
        for _ in range(arrivals):
            if len(self.running) >= self.max_batch or not self.free_rows:
                break
            prompt = self._rand(1, cfg.max_prompt + 1)
            output = self._rand(cfg.min_output, cfg.max_output + 1)
            req = Request(
                id=self.next_id,
                row=self.free_rows.pop(),
                prompt_len=prompt,
                output_len=max(1, min(output, cfg.max_seq_len - prompt)),
            )
            self.next_id += 1
            self.running.append(req)
            self.stats.admitted += 1

    def raise_batch_limit(self) -> None:
        """Double the batch limit (the plan buffers grow at the next step that needs it)
        and the KV pool with it (the stores grow now)."""
        self.max_batch *= 2
        self._say(f"the engine raises its batch limit to {self.max_batch}")
        self.grow_pool("room for the larger batches")

    def _grow_plan_buffers(self, bs: int, n_tokens: int) -> None:
        for g in self.groups:
            grown = g.buffers.ensure_capacity(write_reqs=bs)
            if grown is not g.buffers:
                self._say(
                    f"{g.name} plan buffers grew: write_req_capacity "
                    f"{g.buffers.write_req_capacity} -> {grown.write_req_capacity}, "
                    f"generation {grown.generation}"
                    + (", graphs re-captured" if self.config.graphs else "")
                )
                g.buffers = grown
                g.oracle = g.oracle.ensure_capacity(write_reqs=bs)
                self.stats.plan_resizes += 1
                self._changed = True
        if self.config.graphs:
            need = max(self.max_batch * self.config.prefill_chunk, n_tokens)
            for g in self.groups:
                if g.tokens is None or g.tokens.capacity < need:
                    g.tokens = TokenInputs.allocate(need, self.device)
                if g.staging is None or g.staging.built_for is not g.buffers:
                    # staging is linked to its buffers: after any resize, build it again
                    g.staging = GraphInputs.for_buffers(g.buffers)

    def _grow_after_overflow(self, step_tokens: int) -> None:
        for g in self.groups:
            total = self._verify_totals.get(g.name, 0)
            if total > g.buffers.verify_capacity:
                # next step's prefixes are at most this step's plus this step's tokens
                need = total + step_tokens
                g.buffers = g.buffers.ensure_capacity(verify_entries=need)
                g.oracle = g.oracle.ensure_capacity(verify_entries=need)
                self.stats.plan_resizes += 1
                self._say(
                    f"{g.name} plan buffers grew: verify_capacity -> "
                    f"{g.buffers.verify_capacity}, generation {g.buffers.generation}"
                )

    # --- the canary launches --------------------------------------------------------
    def _plan_kwargs(self, g: Group, valid_lens: torch.Tensor) -> dict[str, Any]:
        if self.config.graphs:
            assert g.staging is not None
            rows = g.staging.plan_kwargs(with_valid_lens=True)
        else:
            rows = dict(self._step_rows, req_to_verify_expected_tokens_valid_lens=valid_lens)
        return dict(
            rows,
            req_to_token=self.req_to_token,
            swa_window_size=g.window,
            full_to_swa_index_mapping=self.lut if g.window else None,
            req_to_verify_expected_tokens=self.token_pool,
        )

    def _launch_pre(self, valid_lens: torch.Tensor) -> None:
        st = self.stages
        for g in self.groups:
            st.plan(g.buffers, **self._plan_kwargs(g, valid_lens))
            st.verify(g.head, g.buffers, launch_tag=_tag(g.name, "HEAD_VERIFY"), real_kv=g.real_kv)

    def _group_tokens(self, g: Group, tokens: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The write's token inputs of group ``g`` (in its fixed staging with graphs)."""
        if g.window:
            tokens = dict(tokens, out_cache_loc=self.lut[tokens["out_cache_loc"]])
        if self.config.graphs:
            assert g.tokens is not None
            return g.tokens.fill(tokens)
        return tokens

    def _launch_post(self, group_tokens: dict[str, dict[str, torch.Tensor]]) -> None:
        st = self.stages
        for g in self.groups:
            tokens = group_tokens[g.name]
            plain = {k: tokens[k] for k in ("input_ids", "positions", "out_cache_loc")}
            st.write(
                g.head,
                g.buffers,
                launch_tag=_tag(g.name, "HEAD_WRITE"),
                real_kv=g.real_kv,
                **tokens,
            )
            if g.tail is not None:
                st.write(
                    g.tail,
                    g.buffers,
                    launch_tag=_tag(g.name, "TAIL_WRITE"),
                    real_kv=g.real_kv,
                    **plain,
                )
                st.verify(
                    g.tail, g.buffers, launch_tag=_tag(g.name, "TAIL_VERIFY"), real_kv=g.real_kv
                )

    def _pre(self, eager: bool, valid_lens: torch.Tensor) -> _EventPair | None:
        if self.graphs is None or eager:
            self._launch_pre(valid_lens)
            return None
        return _timed_replay(self.graphs[0])

    def _post(self, eager: bool, tokens: dict[str, dict[str, torch.Tensor]]) -> _EventPair | None:
        if self.graphs is None or eager:
            self._launch_post(tokens)
            return None
        return _timed_replay(self.graphs[1])

    def _graph_key(self) -> tuple[object, ...]:
        parts: list[object] = [self.num_slots]
        for g in self.groups:
            parts += [
                g.buffers.generation,
                g.head.generation,
                g.kv.data_ptr(),
                g.staging.capacity if g.staging else 0,
                g.tokens.capacity if g.tokens else 0,
            ]
        return tuple(parts)

    def _prepare_graphs(self) -> bool:
        """Whether this step runs eagerly (always without graphs; with graphs, on the
        first step of a generation, which then captures)."""
        if not self.config.graphs:
            return True
        return self.graph_key != self._graph_key()

    def _capture(
        self, valid_lens: torch.Tensor, tokens: dict[str, dict[str, torch.Tensor]]
    ) -> None:
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
        self._say(f"captured the pre and post graphs (capture {self.stats.captures})")

    # --- checks against the references ---------------------------------------------
    def _check_plans(self, valid_lens: torch.Tensor) -> None:
        for g in self.groups:
            kwargs = self._plan_kwargs(g, valid_lens)
            bs = kwargs["req_pool_indices"].shape[0]
            b = g.buffers
            # the step's verify entries, counted on the host from the scheduler's lists
            host = self._host_rows
            total = verify_entries_needed(
                host["prefix_lens"],
                req_pool_indices=host["req_pool_indices"],
                swa_window_size=g.window,
            )
            self._verify_totals[g.name] = total
            overflow = total > b.verify_capacity
            if overflow:
                self.stats.overflow_steps += 1
                self._say(
                    f"{g.name}: {total} verify entries > verify_capacity "
                    f"{b.verify_capacity}: this step verifies nothing (verify_enable=0)"
                )
            else:
                self.stats.verify_entries += total * (2 if g.tail is not None else 1)
            if not self.config.check_plans:
                continue
            offsets = b.write_offsets
            ok = int(offsets[0]) == 0 and bool((offsets[1 : bs + 1] >= offsets[:bs]).all())
            ok &= bool((offsets[bs + 1 :] == 0).all()) and int(b.write_num_valid_reqs) == bs
            ok &= int(b.verify_enable) == (0 if overflow else 1)
            ok &= int(b.verify_num_valid) == (b.verify_capacity if overflow else total)
            if not overflow and total:
                # within a row, positions ascend by one and each entry's predecessor is
                # the entry before it (each row's count: the same helper, row by row)
                counts = [
                    verify_entries_needed([p], req_pool_indices=[r], swa_window_size=g.window)
                    for r, p in zip(host["req_pool_indices"], host["prefix_lens"])
                ]
                # (rows of the scheduler's lists only: a captured plan's padding rows, past
                # them, have no entries)
                row = torch.repeat_interleave(
                    torch.arange(len(counts)), torch.tensor(counts, dtype=torch.int64)
                ).to(self.device)
                same_row = row[1:] == row[:-1]
                pos = b.verify_expected_positions[:total]
                prev = b.verify_prev_slot_indices[1:total]
                ok &= bool((pos[1:][same_row] == pos[:-1][same_row] + 1).all())
                ok &= bool((prev[same_row] == b.verify_slot_indices[: total - 1][same_row]).all())
            if self.config.graphs:  # the staging is linked to g.buffers: the oracle plans copies
                assert g.staging is not None
                staged = g.staging.plan_kwargs(with_valid_lens=True)
                kwargs = dict(kwargs, **{k: t.clone() for k, t in staged.items()})
            plan_reference(g.oracle, **kwargs)
            ok &= plans_equal(b, g.oracle, bs)
            if not ok:
                self.stats.plan_mismatches += 1
                self._say(f"{g.name}: the plan differs from plan_reference")

    def _shadow_pre(self) -> None:
        for g in self.groups:
            if g.shadow_head is not None:
                verify_reference(
                    g.shadow_head,
                    g.oracle,
                    launch_tag=_tag(g.name, "HEAD_VERIFY"),
                    real_kv=g.real_kv,
                )

    def _shadow_post(self, group_tokens: dict[str, dict[str, torch.Tensor]]) -> None:
        for g in self.groups:
            if g.shadow_head is None:
                continue
            tokens = group_tokens[g.name]
            plain = {k: tokens[k] for k in ("input_ids", "positions", "out_cache_loc")}
            write_reference(
                g.shadow_head,
                g.oracle,
                launch_tag=_tag(g.name, "HEAD_WRITE"),
                real_kv=g.real_kv,
                **tokens,
            )
            if g.shadow_tail is not None:
                write_reference(
                    g.shadow_tail,
                    g.oracle,
                    launch_tag=_tag(g.name, "TAIL_WRITE"),
                    real_kv=g.real_kv,
                    **plain,
                )
                verify_reference(
                    g.shadow_tail,
                    g.oracle,
                    launch_tag=_tag(g.name, "TAIL_VERIFY"),
                    real_kv=g.real_kv,
                )

    # --- reading back ------------------------------------------------------------
    def _read_back(self) -> None:
        flagged: dict[int, Seen] = {}
        for g in self.groups:
            self.stats.plan_flags |= g.buffers.take_status()
            for name, store, shadow in g.stores():
                flags = store.take_status()
                self.stats.canary_flags |= flags
                if flags:
                    self._say(f"{name} {g.name} store status: {flags!r}")
                report = store.take_violations()
                if shadow is not None:
                    ref = shadow.take_violations()
                    same = (
                        _rows_sorted(report.violations) == _rows_sorted(ref.violations)
                        and (report.appended, report.kernel_runs, report.slots_processed)
                        == (ref.appended, ref.kernel_runs, ref.slots_processed)
                        and torch.equal(store.records, shadow.records)
                    )
                    if not same:
                        self.stats.store_mismatches += 1
                        self._say(f"{name} {g.name} store differs from its reference store")
                for v in report.violations:
                    full = v.slot if g.name == "full" else int(self.inv_lut[v.slot])
                    seen = Seen(self.step_index, g.name, name, v, full)
                    self.seen.append(seen)
                    flagged.setdefault(full, seen)
                    self._match(seen)
        for inj in self.injections:
            if inj.caught and inj.caught_step == self.step_index:
                self._say(f"caught {inj.kind.value} ({inj.caught_by}): {inj.first}")
        if flagged:
            self._abort(flagged)

    def _match(self, seen: Seen) -> None:
        v = seen.violation
        for inj in self.injections:
            if (
                not inj.caught
                and seen.full_slot in inj.slots
                and (v.fail_bits & inj.kind.expected_bits) == inj.kind.expected_bits
            ):
                inj.first = v
                inj.caught_step = self.step_index
                inj.caught_by = f"{seen.store} store, {seen.group} group" + (
                    "" if seen.group == "full" else f" (slot {v.slot} = LUT[{seen.full_slot}])"
                )

    def explained(self, seen: Seen) -> bool:
        """Whether a violation concerns a request some injection damaged."""
        if any(seen.full_slot in inj.slots for inj in self.injections):
            return True
        return bool(self._holders_then.get((seen.step, seen.full_slot), set()) & self.tainted)

    def _abort(self, flagged: dict[int, Seen]) -> None:
        """Abort every running request that holds a flagged slot."""
        for slot in flagged:
            self._holders_then[(self.step_index, slot)] = set(self.holders.get(slot, ()))
        victims = {rid for slot in flagged for rid in self.holders.get(slot, ())}
        for req in [r for r in self.running if r.id in victims]:
            slots = sorted(s for s in flagged if req.id in self.holders.get(s, ()))
            self._release(req)
            self.stats.aborted += 1
            self._say(
                f"aborted request {req.id} (row {req.row}): "
                f"{len(slots)} of its slots flagged ({_short(slots)})"
            )


# --- small helpers --------------------------------------------------------------------
def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _i64(values: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).to(device)


def _real_kv(kv: torch.Tensor) -> RealKV:
    """The PARTIAL real-KV hash over a fake KV layer ``[num_slots, KV_ELEMS]``, viewed as
    pages of ``PAGE_SIZE`` slots (a view, never a copy)."""
    pages = kv.view(kv.shape[0] // PAGE_SIZE, PAGE_SIZE * KV_ELEMS)
    return RealKV(
        mode=RealKVMode.PARTIAL,
        sources=(pages,),
        page_size=PAGE_SIZE,
        bytes_per_token=KV_ELEMS * kv.element_size(),
    )


def _rows_sorted(violations: Sequence[Violation]) -> list[tuple[object, ...]]:
    return sorted(attrs.astuple(v, recurse=False) for v in violations)


def _short(values: Sequence[int], limit: int = 6) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (f", ... {len(values) - limit} more" if len(values) > limit else "")


def _timed_replay(graph: torch.cuda.CUDAGraph) -> _EventPair:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    return start, end

"""The engine-neutral canary runtime: one object per engine that owns every canary buffer
and runs the canary's step around each forward pass.

API summary
-----------
::

    from kv_canary_engines import (CanaryConfig, CanaryRuntime, KVGroup, Row, StepBatch,
                                   SweepBatch, BlockTable, TokenSlots, Policy)

    runtime = CanaryRuntime(
        CanaryConfig(verify_every=1, sweep_every=0, poll_every=1, policy="log",
                     real_kv=RealKVMode.PARTIAL, tail=True, stages="auto"),
        groups=[KVGroup(name="full", num_slots=N, page_size=16,
                        real_kv_sources=(k0_pages, v0_pages), real_kv_bytes_per_token=256)],
        device=device,
        sweep_source=None,               # or a callable returning a SweepBatch (or None)
    )
    # every engine step, around the forward (eager; see "CUDA graphs" below):
    runtime.begin_step(StepBatch(
        rows=[Row(request_id="a", prefix_len=P, extend_len=E, tokens=all_tokens_of_a,
                  draft_len=0), ...],             # draft_len: speculative drafts among E
        tables={"full": TokenSlots(slots=...)} or {"full": BlockTable(table=...)},
        out_cache_loc={"full": write_slots},   # [>= n] canary slots, -1 = not written
        input_ids=ids, positions=pos,          # [>= n], what the forward consumes
    ))                                         # grow, plan, (split) chains, HEAD verify
    model.forward(...)
    report = runtime.end_step()                # HEAD + TAIL writes (split: stamps), TAIL
                                               # verify, sweep,
                                               # and every poll_every steps: the poll
    runtime.release("a")                       # the engine dropped request "a"

- :class:`CanaryConfig`: the verify stride (``verify_every``: writes run every step,
  verifies every N), the sweep period (``sweep_every``, 0 = off), the poll period
  (``poll_every``: each poll syncs), the policy (``"log"``, ``"raise"`` or a callable
  ``(request_ids, report) -> None`` that aborts them), the real-KV mode, the TAIL store,
  the stages (``"auto"``, ``"kernels"``, ``"reference"``), the ring's capacity, and the
  split write (``split_write``: by default ``None``, the split on CUDA with the kernels,
  each store's chain in ``begin_step`` on a side stream beside the forward, its stamp in
  ``end_step``, on steps where a row writes at least :data:`SPLIT_FROM_TOKENS` tokens, and
  one write elsewhere; ``overlap_begin``: ``begin_step``'s launches from ``end_step``
  beside the forward; ``CanaryRuntime(..., side_stream=...)`` takes the engine's stream).
- :class:`KVGroup`: one KV pool as the canary sees it (slots, page size, window and LUT,
  the KV tensors the real-KV hash reads).
- :class:`Row`, :class:`StepBatch`, :class:`SweepBatch`: a step's batch in engine terms
  (request ids, lengths, the scheduler's tokens, slot tables, per-token tensors).
- :meth:`CanaryRuntime.begin_step` / :meth:`end_step` / :meth:`poll` /
  :meth:`release` / :meth:`discard_step`, :attr:`CanaryRuntime.health`,
  :attr:`CanaryRuntime.stats` (host counts) and, with ``CanaryConfig(timing=True)``,
  :attr:`CanaryRuntime.timing` (host and CUDA time of the canary beside the forward).
- A poll returns a :class:`~kv_canary_engines.reports.CanaryReport`: each violation row
  (:class:`~kv_canary_engines.reports.EngineViolation`) with its step, group, endpoint,
  the victim's and the culprit's request ids, and its SGLang-format log line.

Rules the runtime enforces (docs/engines/runtime.md): the writes run every step on every
store (a skipped write is a false violation later); the expected-token pool holds, per
request row and position, the token the scheduler put there; runtime rows start at 1
(row 0 is the plan's padding row, so engine row 0 is never swallowed) and slot 0 is the
padding slot (an engine must not put a real token there, or the group loses one slot's
checks); every buffer grows from host numbers before the plan (no sync).

CUDA graphs: the runtime launches eagerly and refuses to run while the current stream is
being captured (``kv-canary: ... capture``); engine adapters refuse capture modes at
install. docs/engines/runtime.md says how a graph mode would stage its inputs.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import attrs
import numpy as np
import torch

from kv_canary_buffers import (
    CanaryStatus,
    CanaryStore,
    PlanBuffers,
    PlanStatus,
    RealKV,
    RealKVMode,
    Violation,
    WriteWorkspace,
    load_token_slots_reference,
    plan_reference,
    verify_entries_needed,
    verify_reference,
    write_chain_reference,
    write_pair_reference,
    write_reference,
    write_stamp_reference,
)

from .host import Staging, to_device
from .reports import (
    MAX_GROUPS,
    CanaryReport,
    CanaryViolationError,
    Endpoint,
    EngineViolation,
    Health,
    RequestId,
    decode_tag,
    engine_suffix,
    launch_tag,
)
from .rows import RowTable
from .tables import BlockTable, SlotTable, TokenSlots
from .timing import StepTiming

logger = logging.getLogger("kv_canary")

AbortCallback: TypeAlias = Callable[[frozenset[RequestId], CanaryReport], None]
"""The callback policy: receives the request ids a poll's violations name and the report;
it aborts them in the engine."""

_Stage = Callable[..., None]


class Policy:
    """The built-in policies (a callable :data:`AbortCallback` is the third)."""

    LOG = "log"
    """Log one line per violation row (logger ``kv_canary``, warning level)."""
    RAISE = "raise"
    """Log, then raise :class:`CanaryViolationError` naming the requests."""


def _check_policy(_instance: object, _attribute: object, value: object) -> None:
    if value in (Policy.LOG, Policy.RAISE) or callable(value):
        return
    raise ValueError(
        f"kv-canary: policy must be 'log', 'raise' or a callable (request_ids, report), "
        f"got {value!r}"
    )


def _bool_or_none(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(
            f"kv-canary: {attribute.name} must be True, False or None, "
            f"got {type(value).__name__} {value!r}"
        )


def _at_least(minimum: int) -> Callable[[object, attrs.Attribute[int], int], None]:
    def check(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(
                f"kv-canary: {attribute.name} must be an integer >= {minimum}, "
                f"got {type(value).__name__} {value!r}"
            )
        if value < minimum:
            raise ValueError(
                f"kv-canary: {attribute.name} must be an integer >= {minimum}, got {value!r}"
            )

    return check


@attrs.frozen(kw_only=True)
class CanaryConfig:
    """How the runtime runs the canary.

    Attributes:
        verify_every: HEAD and TAIL verifies run on steps ``0, N, 2N, ...``; writes run
            every step on every store regardless (a skipped write is a false violation
            at the next verify of that slot).
        sweep_every: every M steps, after the step, re-verify every running request's
            whole prefix against the HEAD store (``check_expected_tokens=False``), from
            the runtime's ``sweep_source``; 0 turns it off.
        poll_every: read every store back every K steps (a sync) and apply the policy.
        policy: ``"log"``, ``"raise"`` or a callable ``(request_ids, report) -> None``.
        real_kv: the real-KV hash of each group's sources (``RealKVMode``).
        tail: keep a TAIL store per group (written and verified after the forward: it
            catches what a forward did in the step that did it).
        stages: ``"kernels"`` (Triton), ``"reference"`` (the torch references, same
            arguments), or ``"auto"``: the kernels on CUDA or under ``TRITON_INTERPRET=1``.
        check_tokens: the verifies compare each record's token with the expected-token
            pool.
        chain_position_check: turn the stores' write-time position check on.
        violation_capacity: ring rows per store between two polls.
        timing: measure the canary's host time and (CUDA) GPU time per step beside the
            forward's (``runtime.timing``, :class:`~kv_canary_engines.timing.StepTiming`).
        split_write: run each store's write as the split write (docs/contract-canary.md,
            "Write, split"): its chain in ``begin_step``, on a side stream beside the
            forward, and its stamp in ``end_step``; ``None`` (default): split on CUDA
            with the kernels stage (the side stream overlaps the forward) the steps where
            some row writes at least :data:`SPLIT_FROM_TOKENS` tokens, one write on the
            others and elsewhere (the same records either way); ``False``:
            one ``launch_write`` per store in ``end_step``; ``True``: every step split
            (off CUDA, the chain in ``begin_step`` on the one stream there is: the tests'
            way to cover it).
        overlap_begin: launch what ``begin_step`` launches (the step's staging, tables
            and pool, the plans, the HEAD verify, the chains) from ``end_step`` instead,
            on the side stream, which first waits for an event ``begin_step`` recorded
            before the forward: the GPU order is the same (nothing the forward does
            touches a canary buffer), while the host work runs after the forward has been
            queued, beside its GPU time, instead of before it, where a host-synchronous
            engine's GPU waits for it (the HEAD verify's real-KV hash then reads prefix
            slots while the forward writes new ones: docs/engines/runtime.md, "The begin
            beside the forward"). The batch's errors are then raised by ``end_step``.
            ``None`` (default): on CUDA with the kernels stage, the steps where some row
            writes at least :data:`SPLIT_FROM_TOKENS` tokens (prefill: a decode step's
            forward is too short on the GPU to hide the host work); ``False``: the begin
            before the forward; ``True``: every step (off CUDA, in order in ``end_step``:
            the tests' way to cover it).
    """

    verify_every: int = attrs.field(default=1, validator=_at_least(1))
    sweep_every: int = attrs.field(default=0, validator=_at_least(0))
    poll_every: int = attrs.field(default=1, validator=_at_least(1))
    policy: str | AbortCallback = attrs.field(default=Policy.LOG, validator=_check_policy)
    real_kv: RealKVMode = attrs.field(default=RealKVMode.PARTIAL, converter=RealKVMode)
    tail: bool = True
    stages: str = attrs.field(
        default="auto", validator=attrs.validators.in_(("auto", "kernels", "reference"))
    )
    check_tokens: bool = True
    chain_position_check: bool = True
    violation_capacity: int = attrs.field(default=4096, validator=_at_least(1))
    timing: bool = False
    split_write: bool | None = attrs.field(default=None, validator=_bool_or_none)
    overlap_begin: bool | None = attrs.field(default=None, validator=_bool_or_none)


def _sources(value: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class KVGroup:
    """One KV pool (buffer group) as the canary sees it.

    Attributes:
        name: the group's name in reports (``"full"``, ``"swa"``, ...).
        num_slots: canary slots, padding slot 0 included: every slot a table or an
            ``out_cache_loc`` of this group can hold is below it.
        page_size: slots per block of a :class:`BlockTable`.
        window: the sliding window (0: full attention); needs ``lut``.
        lut: int64 ``[lut_len]`` translating the tables' slots into this group's
            (``full_to_swa_index_mapping``); ``out_cache_loc`` is given translated.
        real_kv_sources: the engine's own KV tensors (views, never copies) the real-KV
            hash reads: 2-D, one row per ``real_kv_page_size`` slots.
        real_kv_page_size: slots per source row (default ``page_size``).
        real_kv_bytes_per_token: bytes of one slot within a source row.
        slot0_real: the engine itself puts real tokens at slot 0 (transformers 5.17,
            whose block 0 is a real block): the stores' ``PADDING_SLOT_WRITTEN`` bit is
            then that engine's normal and is cleared at poll instead of logged; the
            adapter counts the steps whose slot 0 went unchecked.
    """

    name: str
    num_slots: int = attrs.field(validator=_at_least(1))
    page_size: int = attrs.field(default=1, validator=_at_least(1))
    window: int = attrs.field(default=0, validator=_at_least(0))
    lut: torch.Tensor | None = None
    real_kv_sources: tuple[torch.Tensor, ...] = attrs.field(default=(), converter=_sources)
    real_kv_page_size: int | None = None
    real_kv_bytes_per_token: int = 0
    slot0_real: bool = False


@attrs.frozen(kw_only=True)
class Row:
    """One request of a step's batch.

    Attributes:
        request_id: the engine's id (any hashable).
        prefix_len: ``P``, tokens already in the cache that this step attends to.
        extend_len: ``E``, tokens this step writes (positions ``P .. P + E - 1``).
        tokens: the scheduler's token at each position, at least ``[0, P + E)`` (any
            sequence of token ids, int32 with ``check_tokens``; only the positions the pool
            lacks are read: this step's, and a prefix the runtime has not seen, such as a
            prefix-cache hit; an id out of range refuses the batch before anything is
            written).
        draft_len: the last ``draft_len`` of the ``E`` tokens are speculative drafts:
            the pool holds them for this step only, and the next step refills their
            positions from ``tokens`` (by then the accepted ones), so a rejected draft
            whose KV was not rolled back fails ``VERIFY_TOKEN``.
    """

    request_id: RequestId
    prefix_len: int = attrs.field(validator=_at_least(0))
    extend_len: int = attrs.field(validator=_at_least(0))
    tokens: Sequence[int]
    draft_len: int = attrs.field(default=0, validator=_at_least(0))

    def __attrs_post_init__(self) -> None:
        if self.draft_len > self.extend_len:
            raise ValueError(
                f"kv-canary: Row.draft_len = {self.draft_len} must be <= extend_len = "
                f"{self.extend_len}"
            )


@attrs.frozen(kw_only=True)
class StepBatch:
    """One step's batch, as the forward will run it (``n = sum(extend_len)`` tokens).

    Attributes:
        rows: the batch's requests, in the order of the flat per-token tensors.
        tables: per group name, the slots of positions ``0 .. P + E - 1`` of every row.
        out_cache_loc: per group name, the slot each of the ``n`` tokens is written to
            (canary numbering, the group's translated slots for a windowed group); -1
            skips a token. Longer tensors are fine (padding past ``n`` is not read).
        input_ids: the token ids the forward consumes, ``[>= n]``.
        positions: their positions, ``[>= n]``.
    """

    rows: Sequence[Row]
    tables: Mapping[str, SlotTable]
    out_cache_loc: Mapping[str, torch.Tensor]
    input_ids: torch.Tensor
    positions: torch.Tensor


@attrs.frozen(kw_only=True)
class SweepBatch:
    """The running requests a sweep re-verifies: ``(request_id, length)`` pairs and, per
    group, the slots of their positions ``0 .. length - 1`` (the engine's current tables).
    Positions past what the runtime stamped for a request are not verified."""

    requests: Sequence[tuple[RequestId, int]]
    tables: Mapping[str, SlotTable]


@attrs.define
class RuntimeStats:
    """Host-side counts of what the runtime saw (no device read)."""

    steps: int = 0
    verify_steps: int = 0
    rows: int = 0
    tokens: int = 0
    prefix_hits: int = 0
    """Rows first seen with a cached prefix (``P > 0``): a prefix-cache hit."""
    chunked_rows: int = 0
    """Rows continuing a chunked prefill (``P > 0`` and ``E > 1``)."""
    sweeps: int = 0
    polls: int = 0


@attrs.define(eq=False)
class _Group:
    spec: KVGroup
    index: int
    plan: PlanBuffers
    head: CanaryStore
    tail: CanaryStore | None
    real_kv: RealKV | None
    req_to_token: torch.Tensor
    """int32 ``[rows, positions]``: the slots of :class:`TokenSlots` steps."""
    block_table: torch.Tensor
    """int32 ``[rows, blocks]``: the blocks of :class:`BlockTable` steps, planned from
    directly (``launch_plan(block_table=..., page_size=...)``: no per-token expansion)."""
    by_blocks: dict[int, bool] = attrs.Factory(dict)
    """Per row, whether its last step (or sweep) filled ``block_table`` (else
    ``req_to_token``): which table the fallback attribution reads."""
    sweep_plan: PlanBuffers | None = None
    head_ws: WriteWorkspace | None = None
    """The split write's workspace of the HEAD store (None: one write a store)."""
    tail_ws: WriteWorkspace | None = None
    """The TAIL store's."""
    plan_rows: int = 0
    plan_entries: int = 0
    """``plan``'s capacities, kept as ints: a step that fits them makes no
    ``ensure_capacity`` call (each checks the buffers' arena, which the launch checks
    again anyway)."""
    ws_tokens: int = 0
    """The tokens both workspaces hold (0 without the split write: never grown)."""

    def __attrs_post_init__(self) -> None:
        self.plan_rows, self.plan_entries = self.plan.write_req_capacity, self.plan.verify_capacity
        self.ws_tokens = _ws_tokens(self)

    def stores(self) -> list[tuple[str, CanaryStore]]:
        out = [("HEAD", self.head)]
        if self.tail is not None:
            out.append(("TAIL", self.tail))
        return out

    def grow_workspaces(self, n: int) -> None:
        """Both workspaces hold ``n`` tokens (host numbers; a no-op when they do)."""
        if self.head_ws is not None:
            self.head_ws = self.head_ws.ensure_capacity(tokens=n, slots=self.head.num_slots)
        if self.tail_ws is not None and self.tail is not None:
            self.tail_ws = self.tail_ws.ensure_capacity(tokens=n, slots=self.tail.num_slots)
        self.ws_tokens = _ws_tokens(self)


def _ws_tokens(g: _Group) -> int:
    """The tokens every workspace of ``g`` holds (a huge number without any: never grown)."""
    caps = [ws.token_capacity for ws in (g.head_ws, g.tail_ws) if ws is not None]
    return min(caps) if caps else _NO_LIMIT


@attrs.define(eq=False)
class _Pending:
    """What begin_step prepared for end_step."""

    step: int
    verify: bool
    n: int
    rows: list[int]
    ends: list[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    expected_ids: torch.Tensor
    expected_positions: torch.Tensor
    out_cache_loc: dict[str, torch.Tensor]
    staged: list[torch.Tensor]
    """The step's staged host arrays on the device: the split write's side stream reads
    some, so the step keeps them (and every tensor above) until ``end_step`` has made the
    current stream wait for the chains; only then may the allocator reuse them."""
    chained: bool = False
    """The chains ran in ``begin_step`` (the split write): ``end_step`` stamps."""


class CanaryRuntime:
    """Owns, per KV group, the plan buffers, the HEAD and TAIL stores, the real-KV
    sources and the ``req_to_token`` table, plus the expected-token pool and the row map,
    and runs the step (module docstring).

    ``device``: where every canary buffer lives (the engine's KV device).
    ``sweep_source``: called every ``sweep_every`` steps after the step; returns the
    running requests to re-verify, or None to skip.
    ``expected_requests``: how many requests the engine runs at once (its batch limit;
    0: unknown), the first size of the row tables and of the plans' rows. Every buffer
    grows past its first size when a step needs it, but a growth allocates on the device
    within a step: the plans' verify entries start at one per slot of the group (32
    bytes a slot, at most 2**20 slots' worth), enough for every step that shares no
    prefix, so that a normal run grows nothing after its first steps.
    """

    def __init__(
        self,
        config: CanaryConfig,
        groups: Sequence[KVGroup],
        *,
        device: torch.device | str,
        sweep_source: Callable[[], SweepBatch | None] | None = None,
        expected_requests: int = 0,
        expected_tokens: int = 0,
        side_stream: torch.cuda.Stream | None = None,
    ) -> None:
        if not isinstance(config, CanaryConfig):
            raise TypeError(
                f"kv-canary: config must be a CanaryConfig, got {type(config).__name__}"
            )
        names = [g.name for g in groups]
        if not groups or len(set(names)) != len(names) or len(groups) > MAX_GROUPS:
            raise ValueError(
                f"kv-canary: groups must be 1 to {MAX_GROUPS} KVGroups with distinct names, "
                f"got {names}"
            )
        self.config = config
        self.device = torch.device(device)
        self._index: int | None = None
        """The CUDA device's index, resolved once (None off CUDA): ``torch.cuda.
        current_stream`` and ``Event.record`` given None, or a device without an index,
        look the current device up through ``torch.cuda.is_available()`` (an environment
        read) on every call, tens of microseconds a step on the H200's host."""
        self._tensor_device = self.device
        """``device`` as its tensors report it (``cuda:0`` for ``cuda``): what a given
        tensor's device is compared with."""
        if self.device.type == "cuda":
            index = self.device.index
            self._index = torch.cuda.current_device() if index is None else index
            self._tensor_device = torch.device("cuda", self._index)
        self.sweep_source = sweep_source
        self.stages = _stages(config.stages, self.device)
        if type(expected_requests) is not int or expected_requests < 0:
            raise ValueError(
                f"kv-canary: expected_requests must be an integer >= 0, got {expected_requests!r}"
            )
        if type(expected_tokens) is not int or expected_tokens < 0:
            raise ValueError(
                f"kv-canary: expected_tokens must be an integer >= 0, got {expected_tokens!r}"
            )
        self._expected_rows = expected_requests
        self._expected_tokens = expected_tokens
        split = config.split_write
        if split is None:
            split = self.device.type == "cuda" and self.stages.name == "kernels"
        self.split_write: bool = split
        """Whether the writes run split (``CanaryConfig.split_write`` resolved)."""
        from_tokens = _split_from_tokens(self.stages.name)
        self.split_from_tokens: int = from_tokens if config.split_write is None else 0
        """With the split write, a step splits when some row writes at least this many
        tokens (``split_write=True``: 0, every step; ``None``: the active
        ``LaunchConfig.write_chain_tokens + 1`` with the kernels, :data:`SPLIT_FROM_TOKENS`
        by default); its writes are one ``launch_write`` a store otherwise."""
        overlap = config.overlap_begin
        if overlap is None:
            overlap = self.device.type == "cuda" and self.stages.name == "kernels"
        self.overlap_begin: bool = overlap
        """Whether ``begin_step``'s launches run from ``end_step`` on the side stream
        (``CanaryConfig.overlap_begin`` resolved)."""
        self.overlap_from_tokens: int = from_tokens if config.overlap_begin is None else 0
        """With ``overlap_begin``, a step overlaps when some row writes at least this many
        tokens (``overlap_begin=True``: 0, every step; ``None``: as ``split_from_tokens``,
        the prefill steps, where the forward's GPU time can hide the canary's host time;
        on the H200 a decode step's forward could not, and the overlap's stream switches
        and events cost about 100 us more host time there)."""
        self.load_tables_on_device: bool = (
            self.device.type == "cuda" and self.stages.name == "kernels"
        )
        """Whether a :class:`TokenSlots` table is loaded by ``launch_load_token_slots`` (on
        CUDA with the kernels: one launch from the rows' starts) rather than staged per
        token and scattered by torch (the same table; a test sets it under the
        interpreter)."""
        self.side_stream = self._side_stream(side_stream)
        """The stream the chains (and with ``overlap_begin`` all of ``begin_step``'s
        launches) run on: None off CUDA, or with neither the split write nor the overlap."""
        if self.side_stream is not None:
            self._planned = torch.cuda.Event()
            self._chains_done = torch.cuda.Event()
            self._begun = torch.cuda.Event()
            self._prepared = torch.cuda.Event()
        self._held: tuple[StepBatch, int] | None = None
        """With ``overlap_begin``: the batch ``begin_step`` took and its step number,
        prepared in ``end_step``."""
        self.split_steps = 0
        """Steps whose writes ran split (chains, then stamps): which mode ran, apart from
        ``stats`` (what the runtime saw, the same in every mode)."""
        self.overlapped_steps = 0
        """Steps whose batch ``begin_step`` kept for ``end_step`` to prepare."""
        self._held_releases: list[RequestId] = []
        """Releases while a batch is held: applied once it is prepared (a request new in
        that batch gets its row there, so an earlier release would miss it)."""
        self.rows = RowTable()
        self._staging = Staging(self.device)
        """The steps' staging (a sweep stages on its own: it runs between steps)."""
        self._wide: torch.Tensor | None = None
        self._wide_views: tuple[int, dict[str, torch.Tensor]] = (0, {})
        """The widened ``input_ids`` and ``positions`` of a step whose table load widens
        them (:meth:`_wide_inputs`)."""
        shape = (max(2, expected_requests + 1), 16)  # + row 0, the padding row
        self.pool = torch.full(shape, -1, dtype=torch.int32, device=self.device)
        self._groups = [self._make_group(spec, i) for i, spec in enumerate(groups)]
        self._step = 0
        self._pending: _Pending | None = None
        self._launches: dict[tuple[int, str], int] = {}
        self._runs_at_poll: dict[tuple[int, str], int] = {}
        self._health = Health()
        self.stats = RuntimeStats()
        self.timing: StepTiming | None = StepTiming() if config.timing else None

    # --- construction ---------------------------------------------------------
    def _side_stream(self, given: torch.cuda.Stream | None) -> torch.cuda.Stream | None:
        if given is not None:
            if not isinstance(given, torch.cuda.Stream):
                raise TypeError(
                    f"kv-canary: side_stream must be a torch.cuda.Stream, got "
                    f"{type(given).__name__}"
                )
            if not (self.split_write or self.overlap_begin) or self.device.type != "cuda":
                raise ValueError(
                    "kv-canary: side_stream is the split write's and overlap_begin's, on "
                    f"CUDA: got one with split_write={self.split_write}, overlap_begin="
                    f"{self.overlap_begin} on device {self.device}"
                )
            if given.device.index != self._index:
                raise ValueError(
                    f"kv-canary: side_stream must be on the canary's device {self.device}, "
                    f"got a stream of {given.device}"
                )
            return given
        if (self.split_write or self.overlap_begin) and self.device.type == "cuda":
            return torch.cuda.Stream(device=self.device)
        return None

    def _make_group(self, spec: KVGroup, index: int) -> _Group:
        if spec.window and spec.lut is None:
            raise ValueError(f"kv-canary: group {spec.name!r} has a window and no lut")
        plan = PlanBuffers.allocate(
            write_req_capacity=max(8, self._expected_rows),
            verify_capacity=max(64, min(spec.num_slots, _FIRST_VERIFY_CAPACITY)),
            device=self.device,
        )
        head = self._store(spec)
        tail = self._store(spec) if self.config.tail else None
        head_ws = tail_ws = None
        if self.split_write:
            tokens = max(64, self._expected_tokens)
            head_ws = WriteWorkspace.for_store(head, token_capacity=tokens)
            if tail is not None:
                tail_ws = WriteWorkspace.for_store(tail, token_capacity=tokens)
        return _Group(
            spec=spec,
            index=index,
            plan=plan,
            head=head,
            tail=tail,
            head_ws=head_ws,
            tail_ws=tail_ws,
            real_kv=self._real_kv(spec),
            req_to_token=torch.zeros(self.pool.shape, dtype=torch.int32, device=self.device),
            block_table=torch.zeros(
                _blocks_shape(self.pool.shape, spec.page_size),
                dtype=torch.int32,
                device=self.device,
            ),
        )

    def _store(self, spec: KVGroup) -> CanaryStore:
        store = CanaryStore.allocate(
            num_slots=spec.num_slots,
            violation_capacity=self.config.violation_capacity,
            device=self.device,
        )
        if self.config.chain_position_check:
            store.enable_chain_position_check()
        return store

    def _real_kv(self, spec: KVGroup) -> RealKV | None:
        if self.config.real_kv == RealKVMode.NONE or not spec.real_kv_sources:
            return None
        return RealKV(
            mode=self.config.real_kv,
            sources=spec.real_kv_sources,
            page_size=spec.real_kv_page_size or spec.page_size,
            bytes_per_token=spec.real_kv_bytes_per_token,
        )

    # --- public state ----------------------------------------------------------
    @property
    def step(self) -> int:
        """Steps begun so far (the next step's number)."""
        return self._step

    @property
    def health(self) -> Health:
        """The last poll's execution check."""
        return self._health

    @property
    def groups(self) -> tuple[KVGroup, ...]:
        return tuple(g.spec for g in self._groups)

    def stores(self, group: str) -> tuple[CanaryStore, CanaryStore | None]:
        """The HEAD and TAIL stores of ``group`` (current generation)."""
        g = self._group(group)
        return g.head, g.tail

    def _group(self, name: str) -> _Group:
        for g in self._groups:
            if g.spec.name == name:
                return g
        raise KeyError(f"kv-canary: no KV group named {name!r}")

    def release(self, request_id: RequestId) -> None:
        """The engine dropped ``request_id`` (finished, aborted, preempted to recompute):
        its row is freed at the next poll (until then its map still attributes rows).
        With ``overlap_begin``, a release between ``begin_step`` and ``end_step`` takes
        effect once ``end_step`` has assigned the step's rows."""
        if self._held is not None:
            self._held_releases.append(request_id)
            return
        self.rows.release(request_id, self._step)

    def live_requests(self) -> frozenset[RequestId]:
        """Requests holding a row."""
        return self.rows.live()

    # --- the step ----------------------------------------------------------------
    def begin_step(self, batch: StepBatch) -> None:
        """Before the forward: assign rows, grow every buffer from host numbers, load the
        slot tables, fill the expected-token pool, plan, and (on a verify step) run the
        HEAD verify. Nothing syncs: the step's host arrays reach the device in one
        ``non_blocking`` copy (:mod:`kv_canary_engines.host`).

        With ``overlap_begin``, only records an event on the current stream (where the
        step starts on the GPU) and keeps ``batch``: ``end_step`` does the rest, on the
        side stream after that event, and raises the batch's errors."""
        _refuse_capture(self.device, "begin_step")
        if self._pending is not None or self._held is not None:
            raise RuntimeError("kv-canary: begin_step called twice without end_step")
        if not isinstance(batch, StepBatch):
            raise TypeError(f"kv-canary: batch must be a StepBatch, got {type(batch).__name__}")
        # the current stream looked up once, where it is needed (a Python object per lookup)
        stream = None
        if self._index is not None and (self.timing is not None or self.overlap_begin):
            stream = torch.cuda.current_stream(self._index)
        if self.timing is not None:
            self.timing.mark(stream, 0)
        if self.overlap_begin and (
            not self.overlap_from_tokens
            or max((r.extend_len for r in batch.rows), default=0) >= self.overlap_from_tokens
        ):
            if self.side_stream is not None and stream is not None:
                self._begun.record(stream)
            self._held = (batch, self._step)
            self.overlapped_steps += 1
        else:
            self._pending = self._prepare(batch, self._step)
        self._step += 1  # (runtime.step during the forward is as without the overlap)
        if self.timing is not None:
            self.timing.mark(stream, 1)

    def _prepare_held(self) -> None:
        """``overlap_begin``'s half of ``end_step``: :meth:`_prepare` of the held batch,
        on CUDA on the side stream after the event ``begin_step`` recorded, then the
        current stream waits for it (on an error too: what it launched outlives the
        frame); off CUDA in order. Then the releases that came while it was held."""
        assert self._held is not None
        (batch, step), self._held = self._held, None
        side = self.side_stream
        current = None if side is None else torch.cuda.current_stream(self._index)
        try:
            with _on_stream(side, self._index):
                if side is not None:
                    side.wait_event(self._begun)
                self._pending = self._prepare(batch, step)
        finally:
            if side is not None and current is not None:
                self._prepared.record(side)
                current.wait_event(self._prepared)
            self._apply_held_releases()

    def _apply_held_releases(self) -> None:
        releases, self._held_releases = self._held_releases, []
        for request_id in releases:
            self.rows.release(request_id, self._step)

    def _prepare(self, batch: StepBatch, step: int) -> _Pending:
        """Step ``step``'s preparation (``begin_step``'s docstring) on the current stream:
        returns what ``end_step`` needs."""
        verify = step % self.config.verify_every == 0
        st = self.stats
        table_rows = self.rows
        # the rows' host numbers, a list comprehension each (a decode step's cost is
        # per-row Python: comprehensions run fewer bytecodes than one loop's appends), then
        # this step's tokens in batch order (the pool's updates at the step's positions and
        # the HEAD write's expected inputs)
        batch_rows = batch.rows
        ids: list[RequestId] = [r.request_id for r in batch_rows]
        prefix: list[int] = [r.prefix_len for r in batch_rows]
        extend: list[int] = [r.extend_len for r in batch_rows]
        get_row = table_rows.by_request.get
        rows: list[int] = [get_row(rid, 0) for rid in ids]  # (0: new here, assigned below)
        bs = len(rows)
        new = rows.count(0)
        hits = sum(1 for row, p in zip(rows, prefix) if not row and p > 0) if new else 0
        widest = max(extend, default=0)
        chunked = sum(1 for p, e in zip(prefix, extend) if p > 0 and e > 1) if widest > 1 else 0
        tokens = _step_tokens(batch_rows, prefix, extend, widest)
        if len(set(ids)) != bs:
            raise ValueError("kv-canary: a request appears twice in one batch")
        ends = [p + e for p, e in zip(prefix, extend)]
        n = len(tokens)
        for g in self._groups:
            name = g.spec.name
            if name not in batch.tables or name not in batch.out_cache_loc:
                raise ValueError(f"kv-canary: the batch has no table or out_cache_loc for {name!r}")
        by_token = self._check_tables(batch.tables, self._groups, bs, ends)
        # the per-token inputs checked (and cast) before anything of the canary's is written;
        # where a table load runs, it widens them on its launch instead of a cast
        in_ids = _first("input_ids", batch.input_ids, n)
        in_pos = _first("positions", batch.positions, n)
        widen = (
            by_token and self.load_tables_on_device and _widens(in_ids, in_pos, self._tensor_device)
        )
        inputs = None if widen else _flat_inputs(in_ids, in_pos, n)
        out_cache_loc = {
            name: _flat(f"out_cache_loc[{name!r}]", t, n) for name, t in batch.out_cache_loc.items()
        }
        missing = table_rows.missing(rows, prefix)  # (a new request's row is 0 here)
        # a step of many tokens has them as numpy from here (its staging needs the array:
        # the range check then reads it instead of two passes over the list)
        tok_np = _int64_array(tokens) if widest > 1 else None
        gap_tokens = _check_token_ids(
            tokens, extend, batch.rows, missing, self.config.check_tokens, tok_np
        )
        if new:  # every check passed: the new requests take their rows
            assign = table_rows.assign
            rows = [row or assign(rid, step) for row, rid in zip(rows, ids)]
        gaps = self._pool_gaps(batch.rows, rows, prefix, missing, gap_tokens)
        st.prefix_hits += hits
        st.chunked_rows += chunked
        st.steps += 1
        st.verify_steps += verify
        st.rows += bs
        st.tokens += n

        # the step's host arrays (then one copy)
        self._grow_tables(rows, ends)
        width = self.pool.shape[1]
        arrays: list[np.ndarray | list[int]]
        if widest == 1 and n == bs and not gaps and (self.load_tables_on_device or not by_token):
            # a decode step (every row writes one token, no pool gap, no per-token table
            # index): its arrays are the rows' own lists (positions = prefix lengths), the
            # staging converts them as it copies (no numpy array built for each)
            needs = [
                _verify_entries_of(prefix, g.spec.window) if verify else 0 for g in self._groups
            ]
            arrays = [rows, prefix, extend, tokens, prefix]
            kinds = "qqqqq"
            if self.config.check_tokens:
                arrays += [[r * width + p for r, p in zip(rows, prefix)], tokens]
                kinds += "qi"
            if by_token:
                arrays.append(self._table_index_of(ends))
                kinds += "q"
        else:
            r_np, p_np, e_np = np.array([rows, prefix, extend], dtype=np.int64)
            tok = tok_np if tok_np is not None else np.array(tokens, dtype=np.int64)
            needs = [_verify_entries(p_np, g.spec.window) if verify else 0 for g in self._groups]
            decode = widest == 1 and n == bs  # (with pool gaps)
            pos = p_np if decode else _positions(p_np, e_np, n)
            arrays = [r_np, p_np, e_np, tok, pos]
            if self.config.check_tokens:
                pool_rows = r_np if decode else np.repeat(r_np, e_np)
                pool_index, pool_tok = pool_rows * width + pos, tok
                if gaps:
                    pool_index = np.concatenate([pool_index, gaps[0] * width + gaps[1]])
                    pool_tok = np.concatenate([pool_tok, gaps[2]])
                arrays += [pool_index, pool_tok.astype(np.int32)]
            if by_token:
                arrays.append(self._table_index(r_np, p_np + e_np))
            kinds = None
        for g, need in zip(self._groups, needs):  # grow before the plan, from host numbers
            if bs > g.plan_rows or need > g.plan_entries:  # (host numbers: no check() call)
                g.plan = g.plan.ensure_capacity(write_reqs=bs, verify_entries=need)
                g.plan_rows, g.plan_entries = g.plan.write_req_capacity, g.plan.verify_capacity
            if n > g.ws_tokens:
                g.grow_workspaces(n)
        staged = self._staging.stage(arrays, kinds)
        rows_t, prefix_t, extend_t, tok_t, pos_t = staged[:5]
        # the pool's updates and the inputs' widening ride on the first TokenSlots load
        # where one runs (one launch instead of three ops), else an index_put_ and the cast
        fused: dict[str, torch.Tensor] = {}
        scatter = self.config.check_tokens and staged[5].shape[0] > 0
        if by_token and self.load_tables_on_device and max(ends, default=0) > 0:
            if scatter:
                fused.update(pool=self.pool, pool_index=staged[5], pool_tokens=staged[6])
            if widen:
                wide, inputs = self._wide_inputs(n)
                fused.update(input_ids=in_ids, positions=in_pos, wide=wide)
        elif scatter:
            self.pool.view(-1).index_put_((staged[5],), staged[6])
        assert inputs is not None
        token_index = staged[-1] if by_token else None
        tables = []
        for g in self._groups:
            given = batch.tables[g.spec.name]
            with_parts = fused if isinstance(given, TokenSlots) else {}
            tables.append(self._load_table(g, given, rows, rows_t, ends, token_index, with_parts))
            if with_parts:
                fused = {}
        assert not fused, "a TokenSlots step has a TokenSlots table"
        pending = _Pending(
            step=step,
            verify=verify,
            n=n,
            rows=rows,
            ends=ends,
            **inputs,
            expected_ids=tok_t,
            expected_positions=pos_t,
            out_cache_loc=out_cache_loc,
            staged=staged,
        )
        for g, table in zip(self._groups, tables):
            kwargs = self._plan_kwargs(g, table, rows_t, prefix_t, extend_t)
            self.stages.plan(g.plan, verify=verify, **kwargs)
        if self.split_write and widest >= self.split_from_tokens:
            self._chains(pending)
        try:
            if verify:
                for g in self._groups:
                    self._verify(g, "HEAD", g.head, g.plan, Endpoint.HEAD_VERIFY, step, True)
        except BaseException:
            self._join(pending)  # the chains' inputs are freed with this frame
            raise
        return pending

    def end_step(self) -> CanaryReport | None:
        """After the forward: the HEAD write (with the scheduler's tokens and positions as
        the expected ones) and the TAIL write, every step; the TAIL verify on a verify
        step; the sweep every ``sweep_every`` steps; and every ``poll_every`` steps the
        poll, whose report it returns (None on other steps)."""
        _refuse_capture(self.device, "end_step")
        begun = self._pending is not None or self._held is not None
        timing = self.timing if begun else None
        stream = None
        if timing is not None and self._index is not None:  # looked up once for both marks
            stream = torch.cuda.current_stream(self._index)
        if timing is not None:
            timing.mark(stream, 2)
        if self._held is not None:
            self._prepare_held()
        p = self._pending
        if p is None:
            raise RuntimeError("kv-canary: end_step called without begin_step")
        self._pending = None
        if p.chained:
            self._join(p)
            for g in self._groups:
                assert g.head_ws is not None
                self._stamp(g, "HEAD", g.head, g.head_ws)
                if g.tail is not None:
                    assert g.tail_ws is not None
                    self._stamp(g, "TAIL", g.tail, g.tail_ws)
                    if p.verify:
                        self._verify(g, "TAIL", g.tail, g.plan, Endpoint.TAIL_VERIFY, p.step, True)
        for g in () if p.chained else self._groups:
            plain = dict(
                input_ids=p.input_ids,
                positions=p.positions,
                out_cache_loc=p.out_cache_loc[g.spec.name],
            )
            expected = dict(
                expected_input_ids=p.expected_ids, expected_positions=p.expected_positions
            )
            if g.tail is None:
                self._write(g, "HEAD", g.head, Endpoint.HEAD_WRITE, p.step, **expected, **plain)
                continue
            self._write_pair(g, p.step, **expected, **plain)
            if p.verify:
                self._verify(g, "TAIL", g.tail, g.plan, Endpoint.TAIL_VERIFY, p.step, True)
        if timing is not None:
            timing.mark(stream, 3)
        self.rows.stamped(p.rows, p.ends)
        every = self.config.sweep_every
        if every and self._step % every == 0 and self.sweep_source is not None:
            sweep = self.sweep_source()
            if sweep is not None:
                self.sweep(sweep)
        if self._step % self.config.poll_every == 0:
            return self.poll()
        return None

    def discard_step(self) -> None:
        """Drop the step ``begin_step`` prepared when its forward failed (no KV was
        written, so no record is): the next ``begin_step`` may follow. A no-op between
        steps. With the split write the step's chains stand unstamped (their violation
        rows stay; the next chain on each workspace replaces them), and the current
        stream waits for them before the step's tensors are let go."""
        if self._pending is not None and self._pending.chained:
            self._join(self._pending)
        self._pending = None
        self._held = None  # (overlap_begin: nothing was launched for it)
        self._apply_held_releases()

    def sweep(self, batch: SweepBatch) -> None:
        """Re-verify the whole stamped prefix of each running request in ``batch`` against
        the HEAD store (no token check: docs/contract-canary.md, "Sweep"). Between steps,
        outside graphs; its rows carry the SWEEP endpoint and the last step's number."""
        _refuse_capture(self.device, "sweep")
        if self._pending is not None or self._held is not None:
            raise RuntimeError("kv-canary: sweep called between begin_step and end_step")
        known = [(rid, length) for rid, length in batch.requests if self.rows.row_of(rid)]
        if not known:
            return
        self.stats.sweeps += 1
        rows = [self.rows.row_of(rid) for rid, _ in known]
        given = [length for _, length in known]
        verified = [min(length, self.rows.length(row)) for row, length in zip(rows, given)]
        groups = [g for g in self._groups if g.spec.name in batch.tables]
        by_token = self._check_tables(batch.tables, groups, len(rows), given)
        self._grow_tables(rows, given)
        r_np = np.array(rows, dtype=np.int64)
        arrays = [r_np, np.array(verified, dtype=np.int64), np.zeros(len(rows), dtype=np.int64)]
        if by_token:
            arrays.append(self._table_index(r_np, np.array(given, dtype=np.int64)))
        staged = to_device(arrays, self.device)
        token_index = staged[3] if by_token else None
        step = self._step - 1
        for g in groups:
            table = self._load_table(
                g, batch.tables[g.spec.name], rows, staged[0], given, token_index
            )
            need = verify_entries_needed(verified, swa_window_size=g.spec.window)
            if g.sweep_plan is None:
                g.sweep_plan = PlanBuffers.allocate(
                    write_req_capacity=max(8, len(rows)),
                    verify_capacity=max(64, need),
                    device=self.device,
                )
            g.sweep_plan = g.sweep_plan.ensure_capacity(write_reqs=len(rows), verify_entries=need)
            kwargs = self._plan_kwargs(g, table, staged[0], staged[1], staged[2], pool=False)
            self.stages.plan(g.sweep_plan, **kwargs)
            self._verify(g, "HEAD", g.head, g.sweep_plan, Endpoint.SWEEP, step, False)

    # --- launches -------------------------------------------------------------------
    def _plan_kwargs(
        self,
        g: _Group,
        table: dict[str, object],
        rows: torch.Tensor,
        prefix: torch.Tensor,
        extend: torch.Tensor,
        *,
        pool: bool = True,
    ) -> dict[str, object]:
        kwargs: dict[str, object] = dict(
            req_pool_indices=rows,
            prefix_lens=prefix,
            extend_seq_lens=extend,
            **table,
        )
        if g.spec.window:
            kwargs.update(swa_window_size=g.spec.window, full_to_swa_index_mapping=g.spec.lut)
        if pool and self.config.check_tokens:
            kwargs.update(
                req_to_verify_expected_tokens=self.pool,
                req_to_verify_expected_tokens_valid_lens=prefix,
            )
        return kwargs

    def _verify(
        self,
        g: _Group,
        store_name: str,
        store: CanaryStore,
        plan: PlanBuffers,
        endpoint: Endpoint,
        step: int,
        tokens: bool,
    ) -> None:
        self.stages.verify(
            store,
            plan,
            launch_tag=launch_tag(step, g.index, endpoint),
            check_expected_tokens=tokens and self.config.check_tokens,
            real_kv=g.real_kv,
        )
        self._count(g, store_name)

    def _chains(self, p: _Pending) -> None:
        """The split write's first stage for every store, after the plans: on CUDA on the
        side stream, which waits for an event recorded on the current stream after the
        plans and the step's staging (so the chains see this step's plan, inputs and
        tables, and the seed records of the previous step's stamps), then records the
        event ``end_step`` makes the current stream wait for. Off CUDA, in order."""
        side = self.side_stream
        if side is not None:
            self._planned.record(torch.cuda.current_stream(self._index))
            side.wait_event(self._planned)
        p.chained = True
        self.split_steps += 1
        timing = self.timing if side is not None else None
        if timing is not None and side is not None:
            timing.mark_side(side, 0)
        try:
            self._chain_launches(p, side)
        except BaseException:
            if side is not None:
                self._chains_done.record(side)
            self._join(p)  # what a chain launched before the error reads outlives it
            raise
        if side is not None:
            if timing is not None:
                timing.mark_side(side, 1)
            self._chains_done.record(side)

    def _chain_launches(self, p: _Pending, side: torch.cuda.Stream | None) -> None:
        """Every store's chain, on ``side`` when given (the current stream otherwise)."""
        with _on_stream(side, self._index):
            for g in self._groups:
                plain = dict(
                    input_ids=p.input_ids,
                    positions=p.positions,
                    out_cache_loc=p.out_cache_loc[g.spec.name],
                )
                assert g.head_ws is not None
                self.stages.chain(
                    g.head,
                    g.plan,
                    g.head_ws,
                    launch_tag=launch_tag(p.step, g.index, Endpoint.HEAD_WRITE),
                    expected_input_ids=p.expected_ids,
                    expected_positions=p.expected_positions,
                    **plain,
                )
                if g.tail is not None:
                    assert g.tail_ws is not None
                    self.stages.chain(
                        g.tail,
                        g.plan,
                        g.tail_ws,
                        launch_tag=launch_tag(p.step, g.index, Endpoint.TAIL_WRITE),
                        **plain,
                    )

    def _join(self, p: _Pending) -> None:
        """The current stream waits for the step's chains (no host sync): every later use
        or reuse of what they read or wrote is ordered after them."""
        if p.chained and self.side_stream is not None:
            torch.cuda.current_stream(self._index).wait_event(self._chains_done)

    def _stamp(self, g: _Group, store_name: str, store: CanaryStore, ws: WriteWorkspace) -> None:
        self.stages.stamp(store, g.plan, ws, real_kv=g.real_kv)
        self._count(g, store_name)  # the chain and its stamp count one kernel run

    def _write(
        self,
        g: _Group,
        store_name: str,
        store: CanaryStore,
        endpoint: Endpoint,
        step: int,
        **tokens: torch.Tensor,
    ) -> None:
        self.stages.write(
            store,
            g.plan,
            launch_tag=launch_tag(step, g.index, endpoint),
            real_kv=g.real_kv,
            **tokens,
        )
        self._count(g, store_name)

    def _write_pair(self, g: _Group, step: int, **tokens: torch.Tensor) -> None:
        """The group's HEAD and TAIL writes in one call (one launch with the kernels: one
        launch's host time less a step), the expected inputs the HEAD's."""
        assert g.tail is not None
        self.stages.write_pair(
            g.head,
            g.tail,
            g.plan,
            launch_tag=launch_tag(step, g.index, Endpoint.HEAD_WRITE),
            tail_launch_tag=launch_tag(step, g.index, Endpoint.TAIL_WRITE),
            real_kv=g.real_kv,
            **tokens,
        )
        self._count(g, "HEAD")
        self._count(g, "TAIL")

    def _count(self, g: _Group, store_name: str) -> None:
        key = (g.index, store_name)
        self._launches[key] = self._launches.get(key, 0) + 1

    # --- growth and the pool -------------------------------------------------------
    def _grow_tables(self, rows: Sequence[int], ends: Sequence[int]) -> None:
        """Grow the pool and the token and block tables for ``rows`` reaching positions
        ``ends``, from host numbers only (a new tensor copies the old one on the stream:
        no sync)."""
        need_rows = max(rows, default=0) + 1
        need_len = max(ends, default=0)
        cur_rows, cur_len = self.pool.shape
        if need_rows > cur_rows or need_len > cur_len:
            shape = (_doubled(cur_rows, need_rows), _doubled(cur_len, need_len))
            self.pool = _grown(self.pool, shape, -1)
            for g in self._groups:
                g.req_to_token = _grown(g.req_to_token, shape, 0)
                g.block_table = _grown(g.block_table, _blocks_shape(shape, g.spec.page_size), 0)

    def _pool_gaps(
        self,
        batch: Sequence[Row],
        rows: Sequence[int],
        prefix: Sequence[int],
        missing: list[tuple[int, int, int]],
        gap_tokens: list[list[int]],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(rows, positions, tokens)`` (int64 arrays) of the positions a row's pool lacks
        below its prefix (``missing``, with their tokens ``gap_tokens``: a prefix-cache
        hit, a row first seen mid-sequence),
        which the scheduler's tokens fill (None: none); every row's pool is then filled to
        its step's end, its drafts left out (the next step refills them, by then accepted
        or replaced)."""
        self.rows.fill_to(rows, [p + r.extend_len - r.draft_len for r, p in zip(batch, prefix)])
        if not missing:
            return None
        gap_rows: list[int] = []
        gap_pos: list[int] = []
        gap_tok: list[int] = []
        for (i, lo, hi), values in zip(missing, gap_tokens):
            gap_rows += [rows[i]] * (hi - lo)
            gap_pos += range(lo, hi)
            gap_tok += values
        return (
            np.array(gap_rows, dtype=np.int64),
            np.array(gap_pos, dtype=np.int64),
            np.array(gap_tok, dtype=np.int64),
        )

    # --- the slot tables ---------------------------------------------------------------
    def _check_tables(
        self,
        tables: Mapping[str, SlotTable],
        groups: Sequence[_Group],
        bs: int,
        ends: Sequence[int],
    ) -> bool:
        """Check each group's table against the batch (before the pool, the tables or any
        store is written); whether any is a :class:`TokenSlots` (the step then stages its
        rows' starts on CUDA, its per-token scatter index elsewhere)."""
        by_token = False
        width = max(ends, default=0)
        for g in groups:
            table = tables[g.spec.name]
            given = getattr(table, "slots", getattr(table, "table", None))
            if isinstance(given, torch.Tensor) and given.device != g.req_to_token.device:
                raise ValueError(
                    f"kv-canary: tables[{g.spec.name!r}] must be on the canary's device "
                    f"{g.req_to_token.device}, got a tensor on {given.device}"
                )
            if isinstance(table, TokenSlots):
                by_token = True
                total = sum(ends)
                if table.slots.shape[0] < total:
                    raise ValueError(
                        f"kv-canary: TokenSlots.slots has {table.slots.shape[0]} slots, the "
                        f"rows' lengths need {total}"
                    )
            elif isinstance(table, BlockTable):
                blocks = table.table
                if blocks.shape[0] < bs:
                    raise ValueError(
                        f"kv-canary: the block table has {blocks.shape[0]} rows for a batch of {bs}"
                    )
                need = -(-width // g.spec.page_size)
                if blocks.shape[1] < need:
                    raise ValueError(
                        f"kv-canary: the block table has {blocks.shape[1]} blocks a row, a row "
                        f"of {width} positions needs {need} (page_size {g.spec.page_size})"
                    )
            else:
                raise TypeError(
                    f"kv-canary: tables[{g.spec.name!r}] must be a BlockTable or TokenSlots, "
                    f"got {type(table).__name__}"
                )
        return by_token

    def _load_table(
        self,
        g: _Group,
        table: SlotTable,
        rows: Sequence[int],
        rows_t: torch.Tensor,
        ends: Sequence[int],
        token_index: torch.Tensor | None,
        parts: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, object]:
        """Write the batch's rows of ``table`` into the group's own table (rows indexed by
        the runtime's rows, positions ``0 .. ends[b] - 1``): a block table's rows with one
        ``index_copy_`` (the plan then reads blocks: ``launch_plan(block_table=...)``),
        per-token slots with ``launch_load_token_slots`` from the staged rows' starts
        (``load_tables_on_device``) or one ``index_put_`` at the staged per-token
        ``token_index``; the plan's table arguments. ``parts``: the step's pool scatter and
        inputs' widening for the TokenSlots load's launch (``launch_load_token_slots``'s
        keywords). One to three ops on the current stream, no sync."""
        if isinstance(table, BlockTable):
            ps = g.spec.page_size
            blocks = -(-max(ends, default=0) // ps)
            if blocks:
                src = _int32(table.table[: len(rows), :blocks])
                g.block_table[:, :blocks].index_copy_(0, rows_t, src)
            g.by_blocks.update(dict.fromkeys(rows, True))
            return {"block_table": g.block_table, "page_size": ps}
        assert token_index is not None  # staged for every TokenSlots step
        if self.load_tables_on_device:
            width = max(ends, default=0)
            if width:
                slots = table.slots  # (the kernel reads it flat: TokenSlots takes any strides)
                self.stages.load_slots(
                    g.req_to_token,
                    slots if slots.is_contiguous() else slots.contiguous(),
                    rows_t,
                    token_index,
                    max_len=width,
                    **(parts or {}),
                )
        else:
            total = token_index.shape[0]
            if total:
                g.req_to_token.view(-1).index_put_((token_index,), _int32(table.slots[:total]))
        g.by_blocks.update(dict.fromkeys(rows, False))
        return {"req_to_token": g.req_to_token}

    def _wide_inputs(self, n: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The runtime's int64 ``[2, >= n]`` buffer that the table load widens the step's
        ``input_ids`` and ``positions`` into (rows of an even length: the second starts
        16-byte aligned as the first, as the write's fast variant wants), grown by
        doubling, and its first ``n`` columns as the writes' inputs (kept while ``n``
        repeats, as a decode step's does: two slices fewer a step). Reused every step: the
        previous step's readers (its writes, its chains, which the current stream joins in
        ``end_step``) precede this step's load on the GPU."""
        wide = self._wide
        if wide is None or wide.shape[1] < n:
            width = _doubled(0 if wide is None else wide.shape[1], n + (n & 1))
            wide = self._wide = torch.empty(
                (2, width + (width & 1)), dtype=torch.int64, device=self.device
            )
            self._wide_views = (0, {})
        if self._wide_views[0] != n:
            self._wide_views = (n, {"input_ids": wide[0, :n], "positions": wide[1, :n]})
        return wide, self._wide_views[1]

    @staticmethod
    def _table_index_of(lengths: list[int]) -> list[int]:
        """:meth:`_table_index` of a decode step's lists (``load_tables_on_device``): the
        rows' starts."""
        return [0, *itertools.accumulate(lengths)]

    def _table_index(self, rows: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """What a :class:`TokenSlots` load stages: the rows' starts in the flat slot list
        (``bs + 1``) for ``launch_load_token_slots``, else the per-token scatter index."""
        if self.load_tables_on_device:
            return np.concatenate([_ZERO, np.cumsum(lengths)])
        return _token_index(rows, lengths, self.pool.shape[1])

    # --- polling ----------------------------------------------------------------------
    def poll(self) -> CanaryReport:
        """Read every store and status word back (a sync with the device), attribute each
        violation row, run the health check, apply the policy, and free the rows released
        since the previous poll. Between steps, never inside capture."""
        _refuse_capture(self.device, "poll")
        if self._pending is not None or self._held is not None:
            raise RuntimeError("kv-canary: poll called between begin_step and end_step")
        self.stats.polls += 1
        violations: list[EngineViolation] = []
        appended = dropped = 0
        plan_status: dict[str, PlanStatus] = {}
        canary_status: dict[str, CanaryStatus] = {}
        problems: list[str] = []
        holders = _SlotHolders(self)
        for g in self._groups:
            flags = g.plan.take_status()
            if g.sweep_plan is not None:
                flags |= g.sweep_plan.take_status()
            plan_status[g.spec.name] = flags
            for store_name, store in g.stores():
                key = (g.index, store_name)
                store_flags = store.take_status()
                if g.spec.slot0_real:
                    store_flags &= ~CanaryStatus.PADDING_SLOT_WRITTEN
                canary_status[f"{g.spec.name}/{store_name}"] = store_flags
                report = store.take_violations()
                appended += report.appended
                dropped += report.dropped
                expected = self._launches.get(key, 0)
                ran = report.kernel_runs - self._runs_at_poll.get(key, 0)
                if ran != expected:
                    problems.append(
                        f"{g.spec.name}/{store_name} store: {ran} kernel runs since the last "
                        f"poll, {expected} launched"
                    )
                self._runs_at_poll[key] = report.kernel_runs
                self._launches[key] = 0
                for v, line in zip(report.violations, report.log_lines()):
                    violations.append(self._attribute(g, v, holders, line))
        self._health = (
            Health(
                executing=False,
                message="kv-canary: the canary is not executing: " + "; ".join(problems),
            )
            if problems
            else Health()
        )
        # in the order the launches ran: step, endpoint (HEAD verify, writes, TAIL
        # verify, sweep), group; the ring's order within one launch is unspecified
        violations.sort(key=lambda v: (v.step, -1 if v.endpoint is None else v.endpoint))
        report_out = CanaryReport(
            step=self._step,
            violations=tuple(violations),
            appended=appended,
            dropped=dropped,
            plan_status=plan_status,
            canary_status=canary_status,
            health=self._health,
        )
        self.rows.recycle(self._step)
        self._apply_policy(report_out)
        return report_out

    def _attribute(
        self,
        g: _Group,
        v: Violation,
        holders: _SlotHolders,
        line: str,
    ) -> EngineViolation:
        step, _group, endpoint = decode_tag(v.launch_tag)
        plan_row = getattr(v, "req_pool_index", None)
        owner = getattr(v, "owner", None)
        victim = self.rows.holder(plan_row, step) if isinstance(plan_row, int) else None
        culprit = self.rows.last_holder(owner, step) if isinstance(owner, int) else None
        if culprit == victim:
            culprit = None
        held: tuple[RequestId, ...] = ()
        if victim is None:
            # Fallback until the library's rows name their plan row: every request whose
            # table held the slot in that step.
            held = holders.of(g, step, v.slot)
        suffix = engine_suffix(
            group=g.spec.name,
            endpoint=endpoint,
            step=step,
            request_id=victim,
            culprit_id=culprit,
            holders=held,
        )
        return EngineViolation(
            violation=v,
            group=g.spec.name,
            endpoint=endpoint,
            step=step,
            request_id=victim,
            culprit_id=culprit,
            holders=held,
            line=f"{line} {suffix}",
        )

    def _apply_policy(self, report: CanaryReport) -> None:
        if not self._health.executing:
            logger.error("%s", self._health.message)
        for name, flags in {**report.plan_status, **report.canary_status}.items():
            if flags:
                logger.error("kv-canary: %s status: %r", name, flags)
        for line in report.log_lines():
            logger.warning("%s", line)
        if not report:
            return
        if report.dropped:
            logger.warning("kv-canary: %d violation rows dropped (ring full)", report.dropped)
        policy = self.config.policy
        if policy == Policy.RAISE:
            raise CanaryViolationError(report)
        if callable(policy):
            policy(report.request_ids(), report)


class _SlotHolders:
    """The fallback attribution: which requests' table rows held a slot in a step (read
    once per group and poll: the poll syncs anyway). A row's slots come from the table
    its last step filled (``_Group.by_blocks``)."""

    def __init__(self, runtime: CanaryRuntime) -> None:
        self._runtime = runtime
        self._tables: dict[int, torch.Tensor] = {}

    def _table(self, g: _Group) -> torch.Tensor:
        """Per row and position, the group's slot, int64 on the host."""
        table = g.req_to_token.to("cpu", torch.int64)
        ps = g.spec.page_size
        pos = torch.arange(table.shape[1])
        blocks = g.block_table.to("cpu", torch.int64)[:, pos // ps] * ps + pos % ps
        by_blocks = torch.tensor([g.by_blocks.get(r, False) for r in range(table.shape[0])])
        table = torch.where(by_blocks[:, None], blocks, table)
        if g.spec.lut is not None:
            lut = g.spec.lut.to("cpu", torch.int64)
            inside = (table >= 0) & (table < lut.numel())
            table = torch.where(inside, lut[table.clamp(0, max(lut.numel() - 1, 0))], -1)
        return table

    def of(self, g: _Group, step: int, slot: int) -> tuple[RequestId, ...]:
        table = self._tables.get(g.index)
        if table is None:
            table = self._tables[g.index] = self._table(g)
        found = []
        for row, request_id in self._runtime.rows.held_at(step):
            length = self._runtime.rows.length(row)
            if length and bool((table[row, :length] == slot).any()):
                found.append(request_id)
        return tuple(found)


# --- helpers --------------------------------------------------------------------------
def _stages(name: str, device: torch.device) -> _StageSet:
    kernels = name == "kernels" or (
        name == "auto" and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")
    )
    if not kernels:
        return _StageSet(
            plan_reference,
            write_reference,
            verify_reference,
            "reference",
            write_chain_reference,
            write_stamp_reference,
            load_token_slots_reference,
            write_pair_reference,
        )
    from kv_canary_kernels import (
        launch_load_token_slots,
        launch_plan,
        launch_verify,
        launch_write,
        launch_write_chain,
        launch_write_pair,
        launch_write_stamp,
    )

    return _StageSet(
        launch_plan,
        launch_write,
        launch_verify,
        "kernels",
        launch_write_chain,
        launch_write_stamp,
        launch_load_token_slots,
        launch_write_pair,
    )


@attrs.frozen
class _StageSet:
    plan: _Stage
    write: _Stage
    verify: _Stage
    name: str
    chain: _Stage
    """The split write's chain (before the forward)."""
    stamp: _Stage
    """The split write's stamp (after the forward)."""
    load_slots: _Stage
    """A :class:`TokenSlots` table's load from the rows' starts
    (``CanaryRuntime.load_tables_on_device``)."""
    write_pair: _Stage
    """A group's HEAD and TAIL writes in one call (one launch with the kernels)."""


_NO_STREAM = contextlib.nullcontext()

SPLIT_FROM_TOKENS = 17
"""With ``split_write=None``, a step's writes split only when some row writes at least this
many tokens: the default ``LaunchConfig.write_chain_tokens`` (16) + 1 (a test holds them
equal; a runtime with the kernels reads the active config's instead,
:func:`_split_from_tokens`). Rows of up to ``write_chain_tokens`` are walked with their
records by the write's side programs, so there the stamp is hardly cheaper than the write
(H200, decode 4096 x 1: the stamp 2.48 us, ``launch_write`` 2.55, in one run) and the chain
adds a launch before the forward, whose host time the GPU waits for in a host-synchronous
engine."""


def _split_from_tokens(stages: str) -> int:
    """The fewest tokens of a row that make a step split (and, with ``overlap_begin=None``,
    overlap): ``write_chain_tokens + 1`` of the kernels' active ``LaunchConfig`` where the
    kernels run (imported then anyway), :data:`SPLIT_FROM_TOKENS` with the references."""
    if stages != "kernels":
        return SPLIT_FROM_TOKENS
    from kv_canary_kernels.config import active_launch_config

    return active_launch_config().write_chain_tokens + 1


@contextlib.contextmanager
def _switched(stream: torch.cuda.Stream, previous: torch.cuda.Stream) -> Iterator[None]:
    torch.cuda.set_stream(stream)
    try:
        yield
    finally:
        torch.cuda.set_stream(previous)


def _on_stream(
    stream: torch.cuda.Stream | None, index: int | None
) -> contextlib.AbstractContextManager[None]:
    """``torch.cuda.stream(stream)`` (nothing for None), where ``stream`` is on device
    ``index``: when that is the current device, without the two lookups of the current
    device ``torch.cuda.stream`` makes (an environment read each, see
    ``CanaryRuntime._index``); otherwise ``torch.cuda.stream`` itself, which also switches
    the current device and back."""
    if stream is None:
        return _NO_STREAM
    if index is None or torch.cuda.current_device() != index:
        return torch.cuda.stream(stream)
    return _switched(stream, torch.cuda.current_stream(index))


def _refuse_capture(device: torch.device, what: str) -> None:
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"kv-canary: CanaryRuntime.{what} was called while the current CUDA stream is "
            "being captured; the runtime launches eagerly (its host work does not replay): "
            "run the engine without CUDA graphs (docs/engines/runtime.md)"
        )


def _check_token_ids(
    tokens: list[int],
    extend: list[int],
    batch: Sequence[Row],
    missing: list[tuple[int, int, int]],
    pool: bool,
    array: np.ndarray | None = None,
) -> list[list[int]]:
    """The step's tokens and the pool gaps' are token ids the staging holds: int32 with
    the expected-token pool (``pool``: a larger id would wrap there onto another token),
    int64 without. Checked before the runtime writes anything; returns each gap's tokens
    as a list (read once). Two passes over the step's tokens (over ``array``, the same
    tokens as int64, where given), one over a gap's."""
    low, high = (_INT32_MIN, _INT32_MAX) if pool else (-(2**63), 2**63 - 1)
    gaps = [list(batch[i].tokens[lo:hi]) for i, lo, hi in missing]
    spans = [(tokens, None)] + [(g, batch[i].request_id) for g, (i, _, _) in zip(gaps, missing)]
    for values, owner in spans:
        if owner is None and array is not None and len(array):
            bad = int(array.min()) < low or int(array.max()) > high
        else:
            bad = bool(len(values)) and (min(values) < low or max(values) > high)
        if bad:
            j = next(k for k, v in enumerate(values) if not low <= v <= high)
            if owner is None:  # a step token: its row by the rows' extends
                owner = batch[bisect.bisect_right(list(itertools.accumulate(extend)), j)].request_id
            raise ValueError(
                f"kv-canary: request {owner!r}: Row.tokens must be "
                f"{'int32' if pool else 'int64'} token ids "
                f"({'the expected-token pool holds int32' if pool else 'staged as int64'}), "
                f"got {values[j]}"
            )
    return gaps


def _step_tokens(
    batch: Sequence[Row], prefix: list[int], extend: list[int], widest: int
) -> list[int]:
    """The scheduler's tokens at the step's positions, rows in batch order: a decode
    step's (every row one token) indexed one a row, else sliced; a row whose ``tokens``
    stop short of its step's end refuses the batch."""
    if widest == 1 and min(extend) == 1:
        try:
            return [r.tokens[p] for r, p in zip(batch, prefix)]
        except IndexError:
            pass  # (the loop below names the row)
    tokens: list[int] = []
    for r, p, e in zip(batch, prefix, extend):
        step_tokens = r.tokens[p : p + e]
        if len(step_tokens) != e:
            raise ValueError(
                f"kv-canary: request {r.request_id!r}: tokens holds {len(r.tokens)} "
                f"positions, the step needs [0, {p + e})"
            )
        tokens.extend(step_tokens)
    return tokens


def _int64_array(tokens: list[int]) -> np.ndarray | None:
    """``tokens`` as an int64 array, or None where one is outside int64 (the range check
    of the list then names it)."""
    try:
        return np.array(tokens, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        return None


def _first(name: str, t: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` values of a per-token tensor, flat (a view; no op)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kv-canary: {name} must be a torch.Tensor, got {type(t).__name__}")
    flat = t if t.dim() == 1 else t.reshape(-1)
    if flat.shape[0] < n:
        raise ValueError(f"kv-canary: {name} has {flat.shape[0]} values, the batch writes {n}")
    return flat if flat.shape[0] == n else flat[:n]


def _flat(name: str, t: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` values of a per-token tensor as contiguous int64 (the tensor itself
    or a view when it already is: no op then, as for an engine's own int64 buffers)."""
    return _int64(_first(name, t, n))


def _int64(flat: torch.Tensor) -> torch.Tensor:
    if flat.dtype != torch.int64:
        flat = flat.to(torch.int64)
    return flat if flat.is_contiguous() else flat.contiguous()


def _widens(ids: torch.Tensor, pos: torch.Tensor, device: torch.device) -> bool:
    """Whether the table load can widen the step's ``input_ids`` and ``positions`` (their
    first ``n`` values, flat) instead of a cast: some token, int32 or int64 (not both
    int64, which needs nothing), contiguous, on the canary's device."""
    return (
        ids.shape[0] > 0
        and not ids.dtype == pos.dtype == torch.int64
        and ids.dtype in _WIDENED
        and pos.dtype in _WIDENED
        and ids.device == device
        and pos.device == device
        and ids.is_contiguous()
        and pos.is_contiguous()
    )


_WIDENED = (torch.int32, torch.int64)


def _flat_inputs(input_ids: torch.Tensor, positions: torch.Tensor, n: int) -> dict[str, Any]:
    """``input_ids`` and ``positions`` as :func:`_flat` makes them, in one cast where both
    need one and lie, contiguous and apart, in one storage (transformers keeps them as rows
    of one int32 tensor): the two as rows of one strided view, cast together. A cast is a
    kernel launch and an allocation, about 12 us of host time on the H200 alone."""
    ids, pos = _first("input_ids", input_ids, n), _first("positions", positions, n)
    if ids.dtype == pos.dtype == torch.int64:
        return {"input_ids": _int64(ids), "positions": _int64(pos)}
    if (
        n
        and ids.dtype == pos.dtype
        and ids.device == pos.device
        and ids.is_contiguous()
        and pos.is_contiguous()
        and ids.untyped_storage().data_ptr() == pos.untyped_storage().data_ptr()
    ):
        gap = int(pos.storage_offset()) - int(ids.storage_offset())
        if abs(gap) >= n:  # apart: one [2, n] view over both (as_strided checks the bounds)
            first = ids if gap > 0 else pos
            # rows of an even length: the second starts 16-byte aligned as the first (the
            # write's fast variant wants aligned per-token inputs); one copy casts both
            wide = torch.empty((2, n + (n & 1)), dtype=torch.int64, device=ids.device)
            wide[:, :n].copy_(first.as_strided((2, n), (abs(gap), 1)))
            a, b = wide[0, :n], wide[1, :n]
            return {"input_ids": a, "positions": b} if gap > 0 else {"input_ids": b, "positions": a}
    return {"input_ids": _int64(ids), "positions": _int64(pos)}


def _verify_entries_of(prefix: list[int], window: int) -> int:
    """:func:`_verify_entries` of a Python list (a decode step's prefix lengths)."""
    if window:
        return sum(p if p < window else window for p in prefix)
    return sum(prefix)


def _verify_entries(prefix: np.ndarray, window: int) -> int:
    """``verify_entries_needed(prefix, swa_window_size=window)`` for the runtime's rows
    (never padding, ``P >= 0``: ``Row`` checks it), on the array the step already holds:
    ``sum(min(P, W))`` under a window, ``sum(P)`` otherwise."""
    if window:
        prefix = np.minimum(prefix, window)
    return int(prefix.sum())


def _positions(prefix: np.ndarray, extend: np.ndarray, n: int) -> np.ndarray:
    """Each of the step's ``n`` tokens' position: ``P + 0 .. P + E - 1`` of each row."""
    starts: np.ndarray = np.repeat(prefix - (np.cumsum(extend) - extend), extend)
    return starts + np.arange(n, dtype=np.int64)


def _token_index(rows: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """Flat indices into a ``[*, width]`` table of positions ``0 .. lengths[b] - 1`` of
    each row ``rows[b]``, rows concatenated (the order of :class:`TokenSlots`)."""
    starts = np.cumsum(lengths) - lengths
    total = int(lengths.sum())
    return np.repeat(rows * width - starts, lengths) + np.arange(total, dtype=np.int64)


def _blocks_shape(shape: Sequence[int], page_size: int) -> tuple[int, int]:
    """The block table covering a ``[rows, positions]`` token table."""
    return shape[0], -(-shape[1] // page_size)


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_NO_LIMIT = 2**63 - 1
_ZERO = np.zeros(1, dtype=np.int64)

_FIRST_VERIFY_CAPACITY = 1 << 20
"""The most verify entries a group's plan starts with (32 MiB of plan buffers)."""


def _int32(t: torch.Tensor) -> torch.Tensor:
    """An engine's int32 or int64 slots or blocks as the int32 the tables hold: int64
    values outside int32 saturate (out of range for every store, so the kernels flag
    them) instead of wrapping onto a real slot."""
    if t.dtype == torch.int32:
        return t
    return t.clamp(_INT32_MIN, _INT32_MAX).to(torch.int32)


def _doubled(current: int, need: int) -> int:
    return current if need <= current else max(need, 2 * current)


def _grown(t: torch.Tensor, shape: tuple[int, int], fill: int) -> torch.Tensor:
    out = torch.full(shape, fill, dtype=t.dtype, device=t.device)
    out[: t.shape[0], : t.shape[1]] = t
    return out

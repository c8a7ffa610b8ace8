"""Faults that make a running engine misbehave (not the canary's inputs), and how to tell
whether the canary caught them.

Engine-neutral: :class:`FaultKind` (what goes wrong, and the ``FailBits`` a catch must
carry), :class:`Injection` (where a fault went: the step, the harmed requests, the
culprits) and :func:`first_catch` (the first violation at or after that step naming a
harmed request with one of the kind's bits). Per engine: the hooks that break it.
:class:`TransformersFaults` breaks transformers 5.19's continuous batching from forward
hooks and wrapped instance methods of its allocator (never its source); the vLLM adapter
adds vLLM's.

transformers' continuous batching does not speculate, so
``FaultKind.SPECULATIVE_NOT_ROLLED_BACK`` has no transformers hook (refused).
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from kv_canary_buffers import FailBits

from .reports import CanaryReport, EngineViolation, RequestId

logger = logging.getLogger("kv_canary")


class FaultKind(enum.Enum):
    """The engine bugs the faults reproduce."""

    FREED_PAGE_REUSED = "a page freed while still referenced"
    DOUBLE_ALLOCATION = "a page handed to two live requests"
    SLOT_OFF_BY_ONE = "an off-by-one in the slot mapping"
    KV_OVERWRITTEN = "KV bytes overwritten in a hashed layer"
    STALE_PREFIX_HIT = "a stale prefix-cache hit"
    SPECULATIVE_NOT_ROLLED_BACK = "rejected speculative tokens not rolled back"
    PADDING_WRITE = "a padding write landing on a live slot"

    @property
    def bits(self) -> FailBits:
        """A catch carries at least one of these bits."""
        return _BITS[self]


_BITS = {
    FaultKind.FREED_PAGE_REUSED: FailBits.CHAIN | FailBits.POSITION,
    FaultKind.DOUBLE_ALLOCATION: FailBits.CHAIN | FailBits.POSITION,
    FaultKind.SLOT_OFF_BY_ONE: FailBits.CHAIN | FailBits.POSITION,
    FaultKind.KV_OVERWRITTEN: FailBits.REAL_KV,
    FaultKind.STALE_PREFIX_HIT: FailBits.CHAIN | FailBits.POSITION | FailBits.VERIFY_TOKEN,
    FaultKind.SPECULATIVE_NOT_ROLLED_BACK: FailBits.VERIFY_TOKEN | FailBits.CHAIN,
    FaultKind.PADDING_WRITE: FailBits.REAL_KV,
}


@attrs.define(eq=False)
class Injection:
    """Where a fault went.

    Attributes:
        kind: the fault.
        step: the runtime step whose schedule or forward misbehaved first.
        victims: requests whose KV the fault damaged (a stale prefix hit adds its
            victims when they hit the stale block).
        culprits: requests whose writes did the damage (empty when none did: a stray
            kernel, padding).
        detail: what happened, in words.
    """

    kind: FaultKind
    step: int
    victims: set[RequestId]
    culprits: set[RequestId]
    detail: str


def first_catch(injection: Injection, reports: Iterable[CanaryReport]) -> EngineViolation | None:
    """The first violation (by step, then endpoint: HEAD verify, writes, TAIL verify,
    sweep) at or after the injection's step that names a victim (as the victim or among
    the slot's holders) and carries one of the kind's bits."""
    found = [
        v
        for report in reports
        for v in report.violations
        if v.step >= injection.step
        and {v.request_id, *v.holders} & injection.victims
        and v.violation.fail_bits & injection.kind.bits
    ]
    return min(found, key=_order, default=None)


def _order(v: EngineViolation) -> tuple[int, int]:
    return v.step, -1 if v.endpoint is None else int(v.endpoint)


def explained(injections: Iterable[Injection], v: EngineViolation) -> bool:
    """Whether a violation names a request some injection harmed or used (a request
    that later reads a damaged block, a prefix hit on it, is named with its holders)."""
    involved: set[RequestId] = set()
    for inj in injections:
        involved |= inj.victims | inj.culprits
    return bool(v.request_ids() & involved)


# --- transformers ------------------------------------------------------------------------
class TransformersFaults:
    """Breaks a transformers 5.19 continuous-batching run once, at the first step at or
    after ``at_step`` where the kind finds a request to harm; ``injection`` then says
    where it went. Install it after the canary (its forward hook runs after the
    canary's, between the canary's step and the engine's next schedule).

    The kinds' mechanics (``docs/engines/transformers.md``, "Faults"):

    - ``FREED_PAGE_REUSED``: the next allocation of another request gets a full block a
      live request still holds (its pool entry freed too early).
    - ``DOUBLE_ALLOCATION``: two requests allocating in the same schedule get the same
      fresh block.
    - ``SLOT_OFF_BY_ONE``: one decode token's write index is one slot past its position.
    - ``KV_OVERWRITTEN``: during a forward, after layer 0 (hashed) wrote its KV, the
      first 16 bytes of a live prefix slot's K are changed.
    - ``STALE_PREFIX_HIT``: at the start of a schedule, a cached complete block that a
      waiting request's prompt matches is reallocated while its hash stays in the prefix
      index; that request then gets the reused block.
    - ``PADDING_WRITE``: the batch is padded (as with CUDA graphs) and the padding's
      write index is a live slot instead of the write trash.
    """

    def __init__(self, canary: Any, kind: FaultKind, *, at_step: int) -> None:
        if kind is FaultKind.SPECULATIVE_NOT_ROLLED_BACK:
            raise ValueError(
                "kv-canary: transformers' continuous batching does not speculate: "
                "SPECULATIVE_NOT_ROLLED_BACK has no transformers fault"
            )
        self.canary = canary
        self.kind = kind
        self.at_step = at_step
        self.injection: Injection | None = None
        self._undo: list[Callable[[], None]] = []
        self._stale: tuple[int, RequestId] | None = None  # (block, culprit)
        model = canary.model
        self._handles = [model.register_forward_hook(self._between_steps)]
        if kind is FaultKind.KV_OVERWRITTEN:
            layer = model.model.layers[0].self_attn
            self._handles.append(layer.register_forward_hook(self._after_layer0))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        for undo in self._undo:
            undo()
        self._undo.clear()

    # --- engine access ---------------------------------------------------------------
    @property
    def _bp(self) -> Any:
        return self.canary.manager.batch_processor

    @property
    def _allocator(self) -> Any:
        return self._bp.cache.cache_allocators["full_attention"]

    @property
    def _step(self) -> int:
        runtime = self.canary.runtime
        return 0 if runtime is None else int(runtime.step)

    def _record(
        self, victims: set[RequestId], culprits: set[RequestId], detail: str, *, step: int
    ) -> None:
        self.injection = Injection(self.kind, step, victims, culprits, detail)
        logger.info("kv-canary fault at step %d: %s: %s", step, self.kind.value, detail)

    def _decoding(self, min_left: int = 6) -> list[Any]:
        """Active decoding requests with at least ``min_left`` tokens still to generate."""
        from transformers.generation.continuous_batching.requests import RequestStatus

        out = []
        for state in self._bp.scheduler.active_requests.values():
            left = state._new_tokens_limit - len(state.generated_tokens)
            if state.status == RequestStatus.DECODING and left >= min_left:
                out.append(state)
        return out

    def _lives(self, request_id: RequestId, min_left: int = 6) -> bool:
        """Whether the request has at least ``min_left`` tokens still to generate (a
        fault on a request about to finish harms nothing it reads again)."""
        sched = self._bp.scheduler
        state = sched.active_requests.get(request_id) or sched.waiting_requests.get(request_id)
        if state is None:
            return False
        return bool(state._new_tokens_limit - len(state.generated_tokens) >= min_left)

    def _physical(self, request_id: RequestId, position: int) -> int:
        a = self._allocator
        block = a.block_table[request_id][position // a.tokens_per_page]
        return int(block) * int(a.block_physical_stride) + position % int(a.tokens_per_page)

    def _shared(self, block: int) -> bool:
        a = self._allocator
        holders = sum(block in blocks for blocks in a.block_table.values())
        return holders > 1 or block in a.ledger.shared_ref_counts

    # --- hooks ----------------------------------------------------------------------------
    def _between_steps(self, _module: Any, _args: Any, _output: Any) -> None:
        """After the canary's end_step: arm the kinds that act on the next schedule."""
        if self._bp is None:
            return
        if self.kind is FaultKind.STALE_PREFIX_HIT and self._stale is not None:
            self._track_stale_victims()
        if self.kind is FaultKind.PADDING_WRITE and self.injection is not None:
            if self._step > self.injection.step:
                self._disarm()  # one padded step wrote the live slot: restore the trash
            return
        if self.injection is not None or self._undo or self._step < self.at_step:
            return
        arm = {
            FaultKind.FREED_PAGE_REUSED: self._arm_freed_page,
            FaultKind.DOUBLE_ALLOCATION: self._arm_double_allocation,
            FaultKind.SLOT_OFF_BY_ONE: self._arm_off_by_one,
            FaultKind.STALE_PREFIX_HIT: self._arm_stale_at_schedule,
            FaultKind.PADDING_WRITE: self._arm_padding,
        }.get(self.kind)
        if arm is not None:
            arm()

    def _wrap(self, obj: Any, name: str, make: Callable[[Callable[..., Any]], Any]) -> None:
        """Replace ``obj.name`` by ``make(original)`` on the instance until undone."""
        original = getattr(obj, name)
        setattr(obj, name, make(original))

        def undo() -> None:
            if name in vars(obj):
                delattr(obj, name)

        self._undo.append(undo)

    def _disarm(self) -> None:
        for undo in self._undo:
            undo()
        self._undo.clear()

    def _give_block(
        self,
        block: int,
        *,
        exclude: set[RequestId],
        then: Callable[[str], None],
        held: bool = True,
    ) -> None:
        """The next allocation of a request outside ``exclude`` takes ``block`` instead
        of its first fresh block (which goes back to the pool). ``held``: another table
        still holds the block (its reference count becomes 2, so that the pool is not
        given it twice when both finish)."""
        a = self._allocator

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def allocate(request_id: str, past_length: int, query_length: int) -> Any:
                before = len(a.block_table.get(request_id, []))
                result = original(request_id, past_length, query_length)
                table = a.block_table.get(request_id, [])
                if request_id in exclude or len(table) <= before:
                    return result
                fresh = table[before]
                table[before] = block
                a.pool.free_blocks(a.index, [fresh])
                if held:
                    counts = a.ledger.shared_ref_counts
                    counts[block] = counts.get(block, 1) + 1
                self._disarm()
                then(request_id)
                return result

            return allocate

        self._wrap(a, "allocate_cache_to_request", make)

    def _arm_freed_page(self) -> None:
        a = self._allocator
        for state in self._decoding():
            blocks = a.block_table.get(state.request_id, [])
            if len(blocks) >= 2 and not self._shared(blocks[0]):
                victim, block = state.request_id, int(blocks[0])
                then = functools.partial(self._record_freed, victim, block)
                self._give_block(block, exclude={victim}, then=then)
                return

    def _record_freed(self, victim: RequestId, block: int, culprit: RequestId) -> None:
        self._record(
            {victim},
            {culprit},
            f"block {block} of request {victim} (still referenced) went to {culprit}",
            step=self._step,
        )

    def _arm_double_allocation(self) -> None:
        a = self._allocator
        first: dict[str, Any] = {}

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def allocate(request_id: str, past_length: int, query_length: int) -> Any:
                before = len(a.block_table.get(request_id, []))
                result = original(request_id, past_length, query_length)
                table = a.block_table.get(request_id, [])
                if len(table) <= before or not self._lives(request_id):
                    return result
                if not first or first["request"] == request_id:
                    first.update(request=request_id, block=int(table[before]))
                    return result
                fresh, block = table[before], first["block"]
                table[before] = block
                a.pool.free_blocks(a.index, [fresh])
                a.ledger.shared_ref_counts[block] = 2
                self._disarm()
                self._record(
                    {first["request"], request_id},
                    {first["request"], request_id},
                    f"block {block} given to {first['request']} and {request_id}",
                    step=self._step,
                )
                return result

            return allocate

        self._wrap(a, "allocate_cache_to_request", make)
        # a schedule with a single allocation re-arms the search at the next one
        bp = self._bp

        def make_prepare(original: Callable[..., Any]) -> Callable[..., Any]:
            def prepare() -> Any:
                first.clear()
                return original()

            return prepare

        self._wrap(bp, "prepare_next_batch", make_prepare)

    def _arm_off_by_one(self) -> None:
        a = self._allocator
        page = int(a.tokens_per_page)
        for state in self._decoding():
            pos = int(state.position_offset)  # the next token's position
            if 1 <= pos % page <= page - 2:
                shift = functools.partial(self._shifted_writes, state.request_id, pos)
                self._wrap(a, "get_write_indices", shift)
                return

    def _shifted_writes(
        self, victim: RequestId, pos: int, original: Callable[..., Any]
    ) -> Callable[..., Any]:
        """``get_write_indices`` writing ``victim``'s position ``pos`` one slot further."""

        def indices(request_id: str, past_length: int, query_length: int) -> Any:
            out = original(request_id, past_length, query_length)
            if request_id != victim or past_length != pos:
                return out
            self._disarm()
            self._record(
                {victim},
                set(),
                f"request {victim}'s position {pos} written one slot further",
                step=self._step,
            )
            return [i + 1 for i in out]

        return indices

    def _after_layer0(self, _module: Any, _args: Any, _output: Any) -> None:
        if self.injection is not None or self._step < self.at_step or self._bp is None:
            return
        runtime = self.canary.runtime
        if runtime is None:
            return
        a = self._allocator
        for fs in self._bp.inputs_and_outputs.requests_in_batch:
            state = fs.state
            prefix = int(state.position_offset) - int(fs.query_length)
            if prefix >= 2 and not self._shared(int(a.block_table[state.request_id][0])):
                w = self._physical(state.request_id, 1)
                k_view = a._kv_token_views[a.layer_indices[0]][0]
                k_view[w].view(-1)[:4] += 1.0  # the first 16 bytes (fp32) or 8 values (bf16)
                self._record(
                    {state.request_id},
                    set(),
                    f"layer 0 K of request {state.request_id}'s position 1 overwritten",
                    step=runtime.step - 1,
                )
                return

    def _arm_stale_at_schedule(self) -> None:
        """A prefix hit is taken when the scheduler first considers a waiting request, so
        the stale block is set up at the start of a schedule (the scheduler outlives a
        session of a reused manager: a later session's first schedule counts)."""

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def schedule(*args: Any, **kwargs: Any) -> Any:
                if self._stale is None and len(self._undo) == 1:
                    self._arm_stale_prefix()
                return original(*args, **kwargs)

            return schedule

        self._wrap(self._bp.scheduler, "schedule_batch", make)

    def _arm_stale_prefix(self) -> None:
        a = self._allocator
        ledger = a.ledger
        # a cached block that a waiting request's prompt will match (match_prefix_blocks
        # only reads the prefix index)
        wanted: dict[int, set[RequestId]] = {}
        for rid, state in self._bp.scheduler.waiting_requests.items():
            for b in a.match_prefix_blocks(state.remaining_prefill_tokens):
                wanted.setdefault(int(b), set()).add(rid)
        for block in [b for b in ledger.cached_blocks if b in wanted]:
            # the bug: the block leaves the cached set to be reallocated, its hash stays
            # in the prefix index
            ledger.cached_blocks.pop(block)

            def then(culprit: str, block: int = block) -> None:
                self._stale = (block, culprit)
                self._record(
                    set(),
                    {culprit},
                    f"cached block {block} reused by {culprit} while its hash stayed indexed",
                    step=self._step,
                )

            # it is handed out next, to the first other request that allocates
            self._give_block(block, exclude=wanted[block], then=then, held=False)
            return

    def _track_stale_victims(self) -> None:
        assert self._stale is not None and self.injection is not None
        block, culprit = self._stale
        for rid, blocks in self._allocator.block_table.items():
            if rid != culprit and block in blocks:
                self.injection.victims.add(rid)

    def _arm_padding(self) -> None:
        bp = self._bp
        if not bp.model_runner.pad_inputs:
            bp.model_runner.pad_inputs = True  # pad every batch, as CUDA graphs do
            return
        a = self._allocator
        for state in self._decoding():
            if int(state.position_offset) >= 3 and not self._shared(
                int(a.block_table[state.request_id][0])
            ):
                victim = state.request_id
                live = self._physical(victim, 1)
                trash = a.write_trash_index
                a.write_trash_index = live
                self._undo.append(functools.partial(setattr, a, "write_trash_index", trash))
                self._record(
                    {victim},
                    set(),
                    f"the padding's write index is request {victim}'s position 1",
                    step=self._step,
                )
                return

"""The seven corruption kinds the engine can be made to suffer, where each is put in (the
step order says when), and the bookkeeping that says what caught it: :class:`Corruption`,
:class:`Injection`, :class:`Seen` and the :class:`Injector`."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence

import attrs
import torch

from kv_canary_buffers import FailBits, Violation

from .scheduler import VOCAB, Request, Scheduler, draw
from .step import Group


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


class Injector:
    """Queued kinds (:attr:`pending`), the injections made (:attr:`injections`) and the
    damaged requests (:attr:`tainted`). Each hook puts in the kinds that belong to its
    point of the step, into a random request that can take them."""

    def __init__(self, scheduler: Scheduler, say: Callable[[str], None]):
        self.scheduler = scheduler
        self.gen = scheduler.gen
        self.say = say
        self.pending: list[Corruption] = []
        self.injections: list[Injection] = []
        self.tainted: set[int] = set()
        self.holders_then: dict[tuple[int, int], set[int]] = {}
        """``(step, slot)`` -> the requests that held a flagged slot when it was flagged."""

    def _rand(self, low: int, high: int) -> int:
        return draw(self.gen, low, high)

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
        sched = self.scheduler
        pool = [
            r
            for r in sched.running
            if r.prefix >= min_prefix
            and r.id not in self.tainted
            and r not in exclude
            and sched.steps_left(r, r.prefix + extends.get(r.id, 0)) >= 4
        ]
        return pool[self._rand(0, len(pool))] if pool else None

    def _record(
        self,
        step: int,
        kind: Corruption,
        where: str,
        slots: Iterable[int],
        victims: Iterable[Request],
    ) -> None:
        ids = {r.id for r in victims}
        self.tainted |= ids
        self.injections.append(
            Injection(kind=kind, step=step, where=where, slots=frozenset(slots), victims=ids)
        )
        self.say(f"injected {kind.value}: {where}")

    # --- the hooks, in step order ----------------------------------------------------
    def before_schedule(self, step: int, extends: dict[int, int]) -> None:
        """Between steps: a page freed while referenced, a paged-index off-by-one, a stale
        expected token."""
        sched = self.scheduler
        kind = Corruption.FREED_PAGE_REUSED
        if kind in self.pending:
            req = self._victim(min_prefix=4, extends=extends)
            if req is not None:
                self._take(kind)
                # not the last position: that slot seeds the request's write this step,
                # and a seed written by another row of the same call is unspecified
                p = self._rand(1, req.prefix - 2)
                freed = req.slots[p : min(p + 4, req.prefix - 1)]
                free = sched.pool
                for s in freed:  # on top of the free list: the next allocations take them
                    if s in free.in_free:
                        free.free.remove(s)
                    free.free.append(s)
                    free.in_free.add(s)
                self._record(
                    step,
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
                sched.req_to_token[req.row, p : p + 2] = torch.tensor([b, a], dtype=torch.int32)
                self._record(
                    step,
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
                sched.token_pool[req.row, p] = stale
                self._record(
                    step,
                    kind,
                    f"token pool of request {req.id} (row {req.row}) holds "
                    f"{stale} at position {p} (slot {req.slots[p]}), "
                    f"{req.tokens[p]} was written",
                    [req.slots[p]],
                    [req],
                )

    def double_allocation(
        self, step: int, batch: list[Request], new_slots: dict[int, list[int]]
    ) -> None:
        """At allocation: a request's new slot is a live slot of another request."""
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
        self.scheduler.pool.add_free([new_slots[taker.id][0]])  # the slot it should have had
        new_slots[taker.id][0] = s
        self._record(
            step,
            kind,
            f"request {taker.id} (row {taker.row}) got slot {s} for position "
            f"{taker_pos}, live at position {p} of request {owner.id} "
            f"(row {owner.row})",
            [s],
            [owner, taker],
        )

    def in_forward(
        self,
        step: int,
        batch: list[Request],
        tokens: dict[str, torch.Tensor],
        offsets: dict[int, int],
        extends: dict[int, int],
        kv: torch.Tensor,
    ) -> None:
        """During the forward: a wrong token consumed, a live slot's KV bytes (in the full
        group's layer ``kv``) overwritten."""
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
                    step,
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
                bits = kv.view(torch.int16)[s, :8]
                bits ^= 0x1111  # a stray kernel scribbles over a live slot's first 16 bytes
                self._record(
                    step,
                    kind,
                    f"the forward overwrote the KV bytes of slot {s} "
                    f"(position {p} of request {victim.id}, row {victim.row})",
                    [s],
                    [victim],
                )

    def after_step(self, step: int, g: Group) -> None:
        """After the step: a stray write into the HEAD store's memory of group ``g``."""
        kind = Corruption.RECORD_OVERWRITTEN
        if kind not in self.pending:
            return
        req = self._victim(min_prefix=1)
        if req is None:
            return
        self._take(kind)
        p = self._rand(0, req.prefix)
        s = req.slots[p]
        mask = torch.tensor(
            [0x5A5A, 7, 0x1234_5678_9ABC, 0x0F0F_0F0F], dtype=torch.int64, device=g.kv.device
        )
        for store in (g.head, g.shadow_head):
            if store is not None:
                store.records[s] ^= mask  # a stray write into the HEAD store's memory
        self._record(
            step,
            kind,
            f"HEAD store record of slot {s} (position {p} of request "
            f"{req.id}, row {req.row}) overwritten",
            [s],
            [req],
        )

    # --- what caught it --------------------------------------------------------------
    def match(self, seen: Seen) -> None:
        """Mark the first injection that ``seen`` catches (at one of its slots, with its
        kind's bits)."""
        v = seen.violation
        for inj in self.injections:
            if (
                not inj.caught
                and seen.full_slot in inj.slots
                and (v.fail_bits & inj.kind.expected_bits) == inj.kind.expected_bits
            ):
                inj.first = v
                inj.caught_step = seen.step
                inj.caught_by = f"{seen.store} store, {seen.group} group" + (
                    "" if seen.group == "full" else f" (slot {v.slot} = LUT[{seen.full_slot}])"
                )

    def explained(self, seen: Seen) -> bool:
        """Whether a violation concerns a request some injection damaged."""
        if any(seen.full_slot in inj.slots for inj in self.injections):
            return True
        return bool(self.holders_then.get((seen.step, seen.full_slot), set()) & self.tainted)

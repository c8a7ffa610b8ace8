"""The runtime's request rows: which engine request holds which ``req_pool_indices`` row,
and who held it at each step.

Rows start at 1: row 0 is the plan's padding row (``req_pool_indices == 0`` plans
nothing), so no engine request, engine row 0 included, is ever swallowed by it. A row a
request released is not reused before the next poll, so every violation row read at a
poll maps to the request that held its plan row in the step that launched it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from .reports import RequestId

_HISTORY = 4
"""Tenures kept per row: the current one and the last few (culprit lookups)."""


@attrs.define(eq=False)
class _Tenure:
    request_id: RequestId
    start: int
    end: int | None = None
    """The step at which the request released the row (None while it holds it)."""


@attrs.define(eq=False)
class RowTable:
    """Engine request ids to runtime rows, with each row's stamped length (positions the
    canary wrote for it) and the pool positions filled with the scheduler's tokens."""

    _by_request: dict[RequestId, int] = attrs.Factory(dict)
    _free: list[int] = attrs.Factory(list)
    _released: list[int] = attrs.Factory(list)
    _next: int = 1
    _history: dict[int, list[_Tenure]] = attrs.Factory(dict)
    _length: dict[int, int] = attrs.Factory(dict)
    _filled: dict[int, int] = attrs.Factory(dict)

    def assign(self, request_id: RequestId, step: int) -> int:
        """The row of ``request_id``, taking a free one (never 0) for a new request."""
        row = self._by_request.get(request_id)
        if row is not None:
            return row
        if self._free:
            row = self._free.pop()
        else:
            row, self._next = self._next, self._next + 1
        self._by_request[request_id] = row
        tenures = self._history.setdefault(row, [])
        tenures.append(_Tenure(request_id, step))
        del tenures[:-_HISTORY]
        self._length[row] = 0
        self._filled[row] = 0
        return row

    def release(self, request_id: RequestId, step: int) -> None:
        """Free the row of ``request_id`` at the next :meth:`recycle` (no-op if unknown)."""
        row = self._by_request.pop(request_id, None)
        if row is None:
            return
        self._history[row][-1].end = step
        self._released.append(row)

    def recycle(self, step: int) -> None:
        """At a poll: the rows released since the previous poll become free."""
        self._free.extend(self._released)
        self._released.clear()

    @property
    def by_request(self) -> Mapping[RequestId, int]:
        """Live request ids to their rows (read-only use: the runtime's row pass looks
        each request up here once, before :meth:`assign` for a new one)."""
        return self._by_request

    def row_of(self, request_id: RequestId) -> int:
        """The row of a live request, 0 when it holds none."""
        return self._by_request.get(request_id, 0)

    def live(self) -> frozenset[RequestId]:
        return frozenset(self._by_request)

    def holder(self, row: int, step: int) -> RequestId | None:
        """The request that held ``row`` at ``step`` (None when none did)."""
        for t in reversed(self._history.get(row, ())):
            if t.start <= step and (t.end is None or step < t.end):
                return t.request_id
        return None

    def last_holder(self, row: int, step: int) -> RequestId | None:
        """The request holding ``row`` at ``step``, else the last one before it."""
        held = self.holder(row, step)
        if held is not None:
            return held
        for t in reversed(self._history.get(row, ())):
            if t.start <= step:
                return t.request_id
        return None

    def held_at(self, step: int) -> list[tuple[int, RequestId]]:
        """``(row, request_id)`` of every row held at ``step``."""
        out = []
        for row in self._history:
            rid = self.holder(row, step)
            if rid is not None:
                out.append((row, rid))
        return out

    def stamped(self, rows: Sequence[int], lengths: Sequence[int]) -> None:
        """Positions ``0 .. lengths[i] - 1`` of each of ``rows`` are now stamped."""
        self._length.update(zip(rows, lengths))

    def length(self, row: int) -> int:
        """Positions ``0 .. length - 1`` of the row were stamped by the canary."""
        return self._length.get(row, 0)

    def fill(self, row: int, end: int) -> None:
        self._filled[row] = end

    def refill(
        self, rows: Sequence[int], prefix: Sequence[int], ends: Sequence[int]
    ) -> list[tuple[int, int, int]]:
        """A step's pool bookkeeping: :meth:`missing`, then every row filled to
        ``ends[i]`` (:meth:`fill_to`)."""
        gaps = self.missing(rows, prefix)
        self.fill_to(rows, ends)
        return gaps

    def missing(self, rows: Sequence[int], prefix: Sequence[int]) -> list[tuple[int, int, int]]:
        """``(i, lo, hi)`` for each batch row ``i`` whose pool lacks positions ``lo .. hi -
        1`` below its prefix (``hi = prefix[i]``); a row 0 (a request not yet given a row)
        lacks them all. Changes nothing."""
        filled = self._filled
        gaps = []
        for i, (row, p) in enumerate(zip(rows, prefix)):
            lo = filled.get(row, 0) if row else 0
            if lo < p:
                gaps.append((i, lo, p))
        return gaps

    def fill_to(self, rows: Sequence[int], ends: Sequence[int]) -> None:
        """Pool positions ``0 .. ends[i] - 1`` of each of ``rows`` now hold the scheduler's
        tokens."""
        self._filled.update(zip(rows, ends))

    def filled(self, row: int) -> int:
        """Pool positions ``0 .. filled - 1`` of the row hold the scheduler's tokens."""
        return self._filled.get(row, 0)

"""What the canary costs per step, measured where it runs: host seconds of ``begin_step``
and ``end_step`` and, on CUDA, the GPU time between events recorded at their start and
end (the canary's launches, and any gap the GPU waits for them), beside the forward's
(from the end of ``begin_step`` to the start of ``end_step``), and with the split write the
GPU time of its chains on the side stream, beside the forward. Turned on with
``CanaryConfig(timing=True)``; a read syncs (:meth:`StepTiming.gpu_ms`).

The instrument keeps its own cost small, since it runs inside what it measures: its CUDA
events are made ahead, between steps, and recorded again; a span's closing event is
recorded first thing and its opening one last, each with the driver's ``cuEventRecord``
on the raw handles (about a microsecond against several for ``torch.cuda.Event.record``);
and every :data:`HARVEST` steps, once the newest of a batch of recorded steps has
completed (one ``Event.query``, never a sync), that batch's elapsed times become floats
and its events return to the pool."""

from __future__ import annotations

import ctypes
import itertools
import statistics
import time
from collections import deque
from collections.abc import Callable

import attrs
import torch

_KEPT = 10_000
"""Steps kept (the last ones)."""

HARVEST = 32
"""Steps whose events are read back together, once the newest of them has completed."""


def _driver_event_record() -> Callable[[int, int], int] | None:
    """The CUDA driver's ``cuEventRecord(event, stream)`` (raw handles), or None where the
    driver library does not load. A mark records its event with it: a call of about a
    microsecond, where ``torch.cuda.Event.record`` (its Python frame, the stream object's
    unpacking, a device guard and the GIL's release) costs several, and a mark's call lies
    inside the span it measures."""
    try:
        record = ctypes.CDLL("libcuda.so.1").cuEventRecord
    except (OSError, AttributeError):
        return None
    record.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
    record.restype = ctypes.c_int
    return record


_cu_event_record = _driver_event_record()

_MADE = 64
"""Events made at a time when the pool runs low (before a step's first mark)."""

_SLOTS = 6
"""A step's events: begin_step's start and end, end_step's start and end, the chains'
start and end on the side stream."""


@attrs.define(eq=False)
class StepTiming:
    """Per step: host seconds before and after the forward, and CUDA events."""

    host_pre_s: deque[float] = attrs.Factory(lambda: deque(maxlen=_KEPT))
    host_post_s: deque[float] = attrs.Factory(lambda: deque(maxlen=_KEPT))
    _events: deque[list[torch.cuda.Event | None]] = attrs.Factory(deque)
    """Recorded steps not yet read back, each in :data:`_SLOTS` places: the four
    :meth:`mark` events, then the two :meth:`mark_side` ones (None where not recorded)."""
    _done: deque[tuple[float, float, float, float | None]] = attrs.Factory(
        lambda: deque(maxlen=_KEPT)
    )
    """Read back: ``(before, forward, after, chains or None)`` ms per complete step."""
    _free: list[torch.cuda.Event] = attrs.Factory(list)
    """Events read back, recorded again by later steps."""
    _handles: dict[int, int] = attrs.Factory(dict)
    """Each event's raw CUDA handle, by ``id`` (every event stays in this object)."""
    _start: float = 0.0
    driver_records: int = 0
    """Marks recorded through the driver's call (the rest through torch's, where the
    driver library did not load or its call failed)."""

    def mark(self, stream: torch.cuda.Stream | None, which: int) -> None:
        """``which``: 0 begin_step starts, 1 it ends, 2 end_step starts, 3 it ends;
        ``stream``: the current stream, which gets the event (None: no event, off CUDA)."""
        if which in (1, 3):
            now = time.perf_counter()
            # the end of a span: its event first (what follows is the instrument's own
            # bookkeeping, outside the span on both clocks)
            if stream is not None and self._events:
                self._record(self._events[-1], which, stream)
            (self.host_pre_s if which == 1 else self.host_post_s).append(now - self._start)
            return
        if stream is not None:
            if which == 0:
                if len(self._free) < _SLOTS:  # every event of the step made before it
                    self._make_events(stream)
                if len(self._events) >= 2 * HARVEST:
                    self._harvest(only_if_done=True)
                if len(self._events) >= _KEPT:  # as a deque of _KEPT would: the oldest go
                    self._free.extend(e for e in self._events.popleft() if e is not None)
                self._events.append([None] * _SLOTS)
            if self._events:
                self._record(self._events[-1], which, stream)
        # the start of a span: its event last, then the host clock (the bookkeeping
        # above is outside the span on both)
        self._start = time.perf_counter()

    def mark_side(self, stream: torch.cuda.Stream, which: int) -> None:
        """``which``: 0 the split write's chains start on ``stream``, 1 they end."""
        if self._events:
            self._record(self._events[-1], 4 + which, stream)

    def _record(
        self, step: list[torch.cuda.Event | None], at: int, stream: torch.cuda.Stream
    ) -> None:
        event = step[at]
        if event is None:
            if not self._free:  # (mark(0) made the step's events: not reached)
                self._make_events(stream)
            event = step[at] = self._free.pop()
        if _cu_event_record is not None and (
            _cu_event_record(self._handles[id(event)], stream.cuda_stream) == 0
        ):
            self.driver_records += 1
            return
        event.record(stream)

    def _make_events(self, stream: torch.cuda.Stream) -> None:
        """:data:`_MADE` more events for the pool, each recorded once on ``stream`` (where a
        step is about to start, outside any span): torch creates a CUDA event at its first
        record, and a mark's driver call needs its handle."""
        for _ in range(_MADE):
            event = torch.cuda.Event(enable_timing=True)
            event.record(stream)
            self._handles[id(event)] = event._as_parameter_.value
            self._free.append(event)

    def _harvest(self, *, only_if_done: bool) -> None:
        """Read the oldest :data:`HARVEST` recorded steps back once the newest of them
        that ended has completed (``only_if_done``; a query, no sync), or every step up
        to the last that ended after a sync on its last event. A step's chains on the
        side stream were joined to the current stream before its last event, and steps
        follow each other on that stream: when one step's last event has completed, so
        has every event before it. A step that did not end (an error in ``end_step``) is
        dropped."""
        steps = self._events
        if only_if_done:
            count = min(HARVEST, len(steps))
        else:  # up to the last step that ended: one still between its marks stays
            count = max((i + 1 for i, s in enumerate(steps) if s[3] is not None), default=0)
        ended = [s[3] for s in itertools.islice(steps, count) if s[3] is not None]
        if ended:
            if only_if_done:
                if not ended[-1].query():
                    return
            else:
                ended[-1].synchronize()
        for _ in range(count):
            step = steps.popleft()
            a, b, c, d, s0, s1 = step
            if a is not None and b is not None and c is not None and d is not None:
                chain = s0.elapsed_time(s1) if s0 is not None and s1 is not None else None
                self._done.append((a.elapsed_time(b), b.elapsed_time(c), c.elapsed_time(d), chain))
            self._free.extend(e for e in step if e is not None)

    def _all(self) -> deque[tuple[float, float, float, float | None]]:
        self._harvest(only_if_done=False)
        return self._done

    def chain_gpu_ms(self) -> list[float]:
        """GPU milliseconds of each step's chains on the side stream, beside the forward
        (the split write's steps on CUDA; empty otherwise; a sync)."""
        return [s[3] for s in self._all() if s[3] is not None]

    def chain_gpu_ms_by_step(self) -> list[float | None]:
        """:meth:`chain_gpu_ms` aligned with :meth:`gpu_ms`: None for a step that ran
        no chain (one write)."""
        return [s[3] for s in self._all()]

    def gpu_ms(self) -> list[tuple[float, float, float]]:
        """``(before the forward, the forward, after it)`` GPU milliseconds per complete
        CUDA step (a sync)."""
        return [(a, b, c) for a, b, c, _ in self._all()]

    def summary(self) -> dict[str, float]:
        """Medians over the kept steps: host microseconds before and after the forward,
        and on CUDA the GPU milliseconds and the canary's share of the step."""
        out: dict[str, float] = {}
        if self.host_pre_s and self.host_post_s:
            out["host_pre_us"] = 1e6 * statistics.median(self.host_pre_s)
            out["host_post_us"] = 1e6 * statistics.median(self.host_post_s)
        gpu = self.gpu_ms()
        if gpu:
            pre, fwd, post = (statistics.median(x) for x in zip(*gpu))
            out.update(gpu_pre_ms=pre, gpu_forward_ms=fwd, gpu_post_ms=post)
            shares = [(a + c) / (a + b + c) for a, b, c in gpu if a + b + c > 0]
            if shares:
                out["canary_share"] = statistics.median(shares)
        chains = self.chain_gpu_ms()
        if chains:
            out["gpu_chain_ms"] = statistics.median(chains)
        return out

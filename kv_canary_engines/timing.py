"""What the canary costs per step, measured where it runs: host seconds of ``begin_step``
and ``end_step`` and, on CUDA, the GPU time between events recorded at their start and
end (the canary's launches, and any gap the GPU waits for them), beside the forward's
(from the end of ``begin_step`` to the start of ``end_step``), and with the split write the
GPU time of its chains on the side stream, beside the forward. Turned on with
``CanaryConfig(timing=True)``; a read syncs (:meth:`StepTiming.gpu_ms`)."""

from __future__ import annotations

import statistics
import time
from collections import deque

import attrs
import torch

_KEPT = 10_000
"""Steps kept (the last ones)."""


@attrs.define(eq=False)
class StepTiming:
    """Per step: host seconds before and after the forward, and CUDA events."""

    host_pre_s: deque[float] = attrs.Factory(lambda: deque(maxlen=_KEPT))
    host_post_s: deque[float] = attrs.Factory(lambda: deque(maxlen=_KEPT))
    _events: deque[list[torch.cuda.Event]] = attrs.Factory(lambda: deque(maxlen=_KEPT))
    _side: deque[list[torch.cuda.Event]] = attrs.Factory(lambda: deque(maxlen=_KEPT))
    """Per step with the split write on CUDA: events on the side stream around its
    chains (off the forward's stream: not in :meth:`gpu_ms`)."""
    _start: float = 0.0

    def mark(self, index: int | None, which: int) -> None:
        """``which``: 0 begin_step starts, 1 it ends, 2 end_step starts, 3 it ends;
        ``index``: the CUDA device whose current stream gets the event (None: no event,
        off CUDA). An int, not a device: see ``CanaryRuntime._index``."""
        now = time.perf_counter()
        if which in (1, 3):
            (self.host_pre_s if which == 1 else self.host_post_s).append(now - self._start)
        else:
            self._start = now
        if index is not None:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(index))
            if which == 0:
                self._events.append([])
            if self._events:
                self._events[-1].append(event)

    def mark_side(self, stream: torch.cuda.Stream, which: int) -> None:
        """``which``: 0 the split write's chains start on ``stream``, 1 they end."""
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        if which == 0:
            self._side.append([])
        if self._side:
            self._side[-1].append(event)

    def chain_gpu_ms(self) -> list[float]:
        """GPU milliseconds of each step's chains on the side stream, beside the forward
        (the split write on CUDA; empty otherwise; a sync)."""
        done = [e for e in self._side if len(e) == 2]
        if done:
            done[-1][1].synchronize()
        return [a.elapsed_time(b) for a, b in done]

    def gpu_ms(self) -> list[tuple[float, float, float]]:
        """``(before the forward, the forward, after it)`` GPU milliseconds per complete
        CUDA step (a sync)."""
        done = [e for e in self._events if len(e) == 4]
        if done:
            done[-1][3].synchronize()
        return [(a.elapsed_time(b), b.elapsed_time(c), c.elapsed_time(d)) for a, b, c, d in done]

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

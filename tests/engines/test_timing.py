"""StepTiming's CUDA bookkeeping with stand-in events (the CPU has none): the events are
reused, read back in batches once the newest has completed, never synced before a read,
and a step that did not end is dropped."""

from __future__ import annotations

import pytest

from kv_canary_engines import timing as timing_module
from kv_canary_engines.timing import HARVEST, StepTiming

_BY_HANDLE: dict[int, object] = {}
"""The stand-ins by their raw handles, for the stand-in driver call."""


class _Handle:
    def __init__(self, value: int) -> None:
        self.value = value


class FakeEvent:
    """Records the clock of the stream it is recorded on; completes when the test says."""

    made = 0
    completed_up_to = -1.0  # events recorded at or before this clock have completed
    synced = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        FakeEvent.made += 1
        self.at: float | None = None

    def record(self, stream: FakeStream) -> None:
        stream.clock += 1.0
        self.at = stream.clock

    @property
    def _as_parameter_(self) -> _Handle:  # (torch's: the raw CUDA event, for ctypes)
        _BY_HANDLE[id(self)] = self
        return _Handle(id(self))

    def query(self) -> bool:
        assert self.at is not None
        return self.at <= FakeEvent.completed_up_to

    def synchronize(self) -> None:
        FakeEvent.synced += 1
        FakeEvent.completed_up_to = max(FakeEvent.completed_up_to, self.at or 0.0)

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None
        assert self.query() and end.query(), "read back before it completed"
        return end.at - self.at


class FakeStream:
    def __init__(self) -> None:
        self.clock = 0.0
        self.cuda_stream = id(self)
        _BY_HANDLE[id(self)] = self


class FakeDriver:
    """``cuEventRecord`` on the stand-ins' handles; ``rc`` is what it returns (not 0: the
    call failed and recorded nothing)."""

    def __init__(self) -> None:
        self.calls = 0
        self.rc = 0

    def __call__(self, event: int, stream: int) -> int:
        self.calls += 1
        if self.rc == 0:
            _BY_HANDLE[event].record(_BY_HANDLE[stream])  # type: ignore[attr-defined]
        return self.rc


@pytest.fixture
def fake_events(monkeypatch):
    monkeypatch.setattr(timing_module.torch.cuda, "Event", FakeEvent)
    driver = FakeDriver()
    monkeypatch.setattr(timing_module, "_cu_event_record", driver)
    FakeEvent.made, FakeEvent.completed_up_to, FakeEvent.synced = 0, -1.0, 0
    return driver


def _step(t: StepTiming, main: FakeStream, side: FakeStream | None, end: bool = True) -> None:
    t.mark(main, 0)
    if side is not None:  # the chains, between begin_step's marks
        side.clock = main.clock
        t.mark_side(side, 0)
        side.clock += 5.0
        t.mark_side(side, 1)
    t.mark(main, 1)
    main.clock += 100.0  # the forward
    t.mark(main, 2)
    if side is not None:
        main.clock = max(main.clock, side.clock)  # the current stream joins the chains
    main.clock += 2.0
    if end:
        t.mark(main, 3)


def test_events_are_reused_and_read_back_once_completed(fake_events):
    t = StepTiming()
    main, side = FakeStream(), FakeStream()
    steps = 10 * HARVEST
    for i in range(steps):
        _step(t, main, side if i % 3 == 0 else None, end=i != 7)  # step 7: end_step raised
        FakeEvent.completed_up_to = main.clock - 500.0  # the GPU a few steps behind
    assert FakeEvent.synced == 0  # marks never sync
    # pending steps stay below 3 * HARVEST: the events in flight, not one set per step
    # (made _MADE at a time, before a step's first mark)
    assert FakeEvent.made <= 6 * 3 * HARVEST + timing_module._MADE
    # every mark through the driver's call: each event was made (recorded once by
    # torch) before its step began
    marks = 4 * steps - 1 + 2 * len(range(0, steps, 3))
    assert fake_events.calls == t.driver_records == marks
    gpu = t.gpu_ms()  # a read syncs on the newest event
    assert FakeEvent.synced == 1
    assert len(gpu) == steps - 1  # step 7 dropped
    assert all(fwd == 101.0 and pre == 1.0 and post == 3.0 for pre, fwd, post in gpu)
    chains = t.chain_gpu_ms_by_step()
    kept = [i for i in range(steps) if i != 7]
    assert [c is not None for c in chains] == [i % 3 == 0 for i in kept]
    assert set(t.chain_gpu_ms()) == {6.0}  # the side stream: its record, 5, its record
    assert len(t.host_pre_s) == steps and len(t.host_post_s) == steps - 1


def test_nothing_is_read_back_before_it_completed(fake_events):
    t = StepTiming()
    main = FakeStream()
    for _ in range(5 * HARVEST):  # the GPU never catches up: no query succeeds
        _step(t, main, None)
    assert FakeEvent.synced == 0 and not t._done  # (FakeEvent.elapsed_time asserts it)
    assert len(t.gpu_ms()) == 5 * HARVEST


def test_off_cuda_no_event_is_made(fake_events):
    t = StepTiming()
    for which in range(4):
        t.mark(None, which)
    assert FakeEvent.made == 0 and t.gpu_ms() == [] and t.chain_gpu_ms() == []
    assert fake_events.calls == 0
    assert len(t.host_pre_s) == len(t.host_post_s) == 1


def test_a_read_between_the_marks_keeps_the_step_in_flight(fake_events):
    t = StepTiming()
    main = FakeStream()
    _step(t, main, None)
    t.mark(main, 0)
    t.mark(main, 1)  # a read during the forward: the first step is read back, not this one
    assert len(t.gpu_ms()) == 1
    main.clock += 50.0
    t.mark(main, 2)
    t.mark(main, 3)
    assert [fwd for _, fwd, _ in t.gpu_ms()] == [101.0, 51.0]


def test_a_failed_driver_call_falls_back_to_torchs_record(fake_events):
    # the driver's call refused (another context current, say): torch records the event,
    # and the spans read the same
    t = StepTiming()
    main = FakeStream()
    fake_events.rc = 1
    for _ in range(3):
        _step(t, main, None)
    assert fake_events.calls == 12 and t.driver_records == 0
    assert [fwd for _, fwd, _ in t.gpu_ms()] == [101.0] * 3

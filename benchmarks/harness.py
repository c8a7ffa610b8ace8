"""What every stage of the benchmark shares: the run's device, the CSV recorder, the timers,
the allocation counter, the sync detector and the tables.

GPU time per call (:func:`gpu_time`): a CUDA graph of ``calls_per_graph`` back-to-back
calls, each replay timed with CUDA events, divided by ``calls_per_graph``; the median over
replays. Host time per call (:func:`host_time_stats_us`): ``time.perf_counter`` around
batches of eager calls without a sync (the variants interleaved, a sync between batches),
the median over batches, with the fastest batch and the 90th percentile beside it (the
CSV's ``value_min`` and ``value_p90``: the host of a lent machine is noisy).

Output (:data:`OUT`, :func:`logged`): every run writes into ``benchmarks/out/`` unless told
otherwise, a folder git ignores; ``benchmarks/reference/`` holds the committed reference runs.

In smoke mode (``python -m benchmarks --smoke``, on the CPU under ``TRITON_INTERPRET=1``)
the same code runs with no CUDA graph and no CUDA event: every "GPU time" is the wall time
of eager calls, meaningless as a figure but running every implementation and check.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import torch

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "benchmarks" / "out"
"""Where the benchmark and every probe write by default (ignored by git): never into the
tree's tracked folders. ``docs/`` gets plots only when asked (``--plots-into-docs``)."""


def utc_stamp() -> str:
    """The time now, as the output files are named: ``20261201T120311Z``."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


class _Tee:
    """A text stream that writes to two (stdout and a file)."""

    def __init__(self, first, second) -> None:
        self._first, self._second = first, second

    def write(self, text: str) -> int:
        self._second.write(text)
        return self._first.write(text)

    def flush(self) -> None:
        self._first.flush()
        self._second.flush()

    def __getattr__(self, name: str):
        return getattr(self._first, name)


@contextlib.contextmanager
def logged(name: str, folder: Path | None = None) -> Iterator[Path]:
    """Everything printed to stdout inside the block, also kept in
    ``folder/<name>-<UTC time>.txt`` (default :data:`OUT`): a probe's answer is kept
    without a shell redirect, outside the tracked tree."""
    folder = folder or OUT
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{utc_stamp()}.txt"
    stdout = sys.stdout
    with path.open("w") as f:
        sys.stdout = _Tee(stdout, f)
        try:
            yield path
        finally:
            sys.stdout = stdout
            print(f"output kept in {path}", file=sys.stderr)


class Env:
    """The run's device and mode: one object, updated in place by :func:`configure`, so
    that ``from benchmarks.harness import ENV`` sees the run's values wherever it was imported."""

    def __init__(self) -> None:
        self.device = "cpu"
        """"cuda", or "cpu" (the plan's CPU case, or smoke mode under the interpreter)."""
        self.smoke = False
        """CPU smoke mode: eager wall time instead of graphs and events."""


ENV = Env()


def configure(device: str, smoke: bool) -> Env:
    """Set the run's device and mode (``bench.main`` calls it once)."""
    ENV.device, ENV.smoke = device, smoke
    return ENV


def sync() -> None:
    if ENV.device == "cuda":
        torch.cuda.synchronize()


def on_gpu() -> bool:
    """Whether timings are real GPU timings (CUDA and not smoke)."""
    return ENV.device == "cuda" and not ENV.smoke


# --- the recorder ------------------------------------------------------------------
CASE_FIELDS = (
    "case",
    "bs",
    "swa",
    "pool",
    "entries",
    "real_kv",
    "tokens",
    "replays",
    "calls_per_graph",
    "note",
)
META_FIELDS = ("device", "host_cpu", "torch", "triton", "python", "kv_canary", "commit", "date")
SPREAD_FIELDS = ("value_min", "value_p90")
"""The spread of a median ``value`` over its timed batches (host times; empty otherwise):
the fastest batch and the 90th percentile."""
FIELDS = ("stage", "section", "impl", "metric", "value") + SPREAD_FIELDS + CASE_FIELDS + META_FIELDS
NUMERIC_CASE_FIELDS = ("bs", "swa", "pool", "entries", "tokens", "replays", "calls_per_graph")


def host_cpu() -> str:
    """The host CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere):
    host times per call depend on it as much as on the GPU."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "absent"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Recorder:
    """Rows of the run, written to ``path`` as they come (a crash keeps what was measured)
    and kept in memory for the tables and plots. Every row carries the device, the
    versions and the date."""

    def __init__(self, device_name: str, path: Path | None):
        from kv_canary_buffers import __version__

        self.rows: list[dict] = []
        self.errors: list[str] = []
        self.stage = ""
        self.meta = {
            "device": device_name,
            "host_cpu": host_cpu(),
            "torch": torch.__version__,
            "triton": _triton_version(),
            "python": platform.python_version(),
            "kv_canary": __version__,
            "commit": _commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        self.path = path
        self._file = None
        self._writer = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w", newline="")
            self._writer = csv.DictWriter(self._file, fieldnames=list(FIELDS))
            self._writer.writeheader()
            self._file.flush()

    def add(
        self,
        section: str,
        impl: str,
        metric: str,
        value: float,
        *,
        stage: str | None = None,
        spread: HostTime | None = None,
        **case,
    ) -> dict:
        """One row. ``spread``: the :class:`HostTime` whose median ``value`` is; its
        fastest batch and 90th percentile go into ``value_min`` and ``value_p90``."""
        unknown = set(case) - set(CASE_FIELDS)
        if unknown:
            raise TypeError(f"unknown case fields {sorted(unknown)}")
        row = {
            "stage": stage or self.stage,
            "section": section,
            "impl": impl,
            "metric": metric,
            "value": round(float(value), 4),
            "value_min": "" if spread is None else round(spread.min, 4),
            "value_p90": "" if spread is None else round(spread.p90, 4),
        }
        row.update({k: case.get(k, "") for k in CASE_FIELDS})
        row.update(self.meta)
        self.rows.append(row)
        if self._writer is not None:
            self._writer.writerow(row)
            self._file.flush()
        shown = " ".join(f"{k}={v}" for k, v in case.items() if k != "note" and v != "")
        print(
            f"{row['stage']:6s} {section:9s} {impl:22s} {metric:18s} {value:12.3f}  {shown}",
            flush=True,
        )
        return row

    def error(self, what: str, err: BaseException) -> None:
        """Record a failed measurement or check and go on (device time is scarce)."""
        message = f"{what}: {type(err).__name__}: {err}"
        self.errors.append(message)
        self.add("error", what, "error", 1, note=message[:500])
        print(f"ERROR {message}", flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            print(f"wrote {self.path}")


def load_rows(path: Path) -> list[dict]:
    """The rows of a CSV the recorder wrote, as :attr:`Recorder.rows` holds them (numbers
    as numbers), to plot a run again without a GPU (``python -m benchmarks --plot-from``).
    Columns a CSV lacks read as empty; a CSV from before the ``stage`` column (the plan's
    runs of 2026-11-29, in the tag ``benchmark-results-2026-12-01``) is the plan stage."""
    with Path(path).open(newline="") as f:
        reader = csv.DictReader(f)
        has_stage = "stage" in (reader.fieldnames or ())
        rows = []
        for raw in reader:
            row: dict = {k: raw.get(k) or "" for k in FIELDS}
            if not has_stage:
                row["stage"] = "plan"
            row["value"] = float(row["value"])
            for k in SPREAD_FIELDS:
                row[k] = float(row[k]) if row[k] != "" else ""
            for k in NUMERIC_CASE_FIELDS:
                row[k] = int(row[k]) if row[k] != "" else ""
            rows.append(row)
    return rows


def guarded(rec: Recorder, what: str, fn: Callable[[], None]) -> bool:
    """Run ``fn``; on an exception record it and return False. A CUDA error that leaves
    the context unusable (an illegal address) is re-raised: nothing after it would run."""
    try:
        fn()
        return True
    except Exception as err:  # a benchmark goes on past one failure
        rec.error(what, err)
        text = str(err)
        if "illegal memory access" in text or "unspecified launch failure" in text:
            raise
        if ENV.device == "cuda":
            torch.cuda.synchronize()
        return False


# --- timers --------------------------------------------------------------------------
class Timing(NamedTuple):
    us: float
    """Median time per call (microseconds)."""
    replays: int
    calls_per_graph: int


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus written."""
    if not on_gpu():
        nbytes = 1 << 22
    src = torch.empty(nbytes, dtype=torch.uint8, device=ENV.device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(25 if on_gpu() else 5):
        if on_gpu():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    return 2 * nbytes / statistics.median(times[len(times) // 5 :])


SLOW_CALL_US = 2000.0
"""Above this eager time per call, a graph holds 2 calls and is replayed at most 50 times
(a torch-only baseline of thousands of kernels would otherwise cost seconds of device time
and a graph of tens of thousands of nodes)."""


def gpu_time(fn: Callable[[], None], replays: int, calls_per_graph: int = 10) -> Timing:
    """GPU time of one call of ``fn``: a CUDA graph of ``calls_per_graph`` back-to-back
    calls, each replay timed with CUDA events, divided by ``calls_per_graph``; the median
    over ``replays`` replays (fewer calls and replays for a slow call, see
    :data:`SLOW_CALL_US`).
    ``fn`` must be capturable (no sync, no host read of device data).

    Smoke mode: one eager warm-up call, then the median wall time of ``replays`` calls."""
    if not on_gpu():
        fn()
        times = []
        for _ in range(replays):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return Timing(statistics.median(times), replays, 1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compiles and warms up outside the capture
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        fn()
        end.record(stream)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    eager_us = start.elapsed_time(end) * 1e3
    if eager_us > SLOW_CALL_US:
        calls_per_graph, replays = min(calls_per_graph, 2), min(replays, 50)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls_per_graph)
    del graph
    return Timing(statistics.median(times), replays, calls_per_graph)


def graph_time_us(fn: Callable[[], None], replays: int, plans_per_graph: int = 10) -> float:
    """:func:`gpu_time` in microseconds (the plan stage's historical name)."""
    return gpu_time(fn, replays, plans_per_graph).us


def queued_gpu_time(fn: Callable[[], None], calls: int = 20, rounds: int = 15) -> Timing:
    """GPU time of one eager call of ``fn``, for launches that must not be replayed from a
    graph (``launch_plan``'s one-launch path numbers every launch): ``calls`` eager calls
    queued behind a sleeping kernel, so the GPU runs them back to back with no wait for
    the host, timed with CUDA events around them, divided by ``calls``; the median over
    ``rounds``. Smoke mode: the wall time, as :func:`gpu_time`."""
    if not on_gpu():
        return gpu_time(fn, rounds)
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        # About 10 ms at the H200's clock: far longer than the host takes to queue the calls.
        torch.cuda._sleep(20_000_000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return Timing(statistics.median(times), rounds, calls)


def eager_wall_us(fn: Callable[[], None], repeats: int, budget_s: float = 2.0) -> Timing:
    """Wall time of one eager call with a sync after it (for implementations that sync
    anyway, such as the torch write reference): the median of up to ``repeats`` calls
    after a warm-up call, as many as fit in ``budget_s`` (at least one); a warm-up call
    longer than ``budget_s`` is the result itself (``replays`` 1)."""
    t0 = time.perf_counter()
    fn()
    sync()
    warm = time.perf_counter() - t0
    if warm > budget_s:
        return Timing(warm * 1e6, 1, 1)
    times: list[float] = []
    spent = 0.0
    while len(times) < repeats and (not times or spent < budget_s):
        t0 = time.perf_counter()
        fn()
        sync()
        dt = time.perf_counter() - t0
        times.append(dt * 1e6)
        spent += dt
    return Timing(statistics.median(times), len(times), 1)


def host_calls_for(gpu_us: float | None, most: int) -> int:
    """Eager calls per timed batch: ``most``, fewer when the GPU takes longer per call
    than about 20 ms / ``most``, so that the launch queue never fills (a full queue blocks
    the host and the timing would measure the GPU)."""
    if gpu_us is None or gpu_us <= 0:
        return most
    return max(min(most, 10), min(most, int(20_000 / gpu_us)))


class HostTime(NamedTuple):
    """Host time per eager call of one variant over its timed batches (microseconds)."""

    median: float
    min: float
    """The fastest batch."""
    p90: float
    """The 90th percentile of the batches (inclusive method; the slowest of fewer than 2)."""

    @classmethod
    def of(cls, batches: Sequence[float]) -> HostTime:
        if len(batches) < 2:
            return cls(batches[0], batches[0], batches[0])
        p90 = statistics.quantiles(batches, n=10, method="inclusive")[-1]
        return cls(statistics.median(batches), min(batches), p90)


def host_time_stats_us(
    variants: dict[str, Callable[[], None]], calls: int, rounds: int = 7
) -> dict[str, HostTime]:
    """Host time per eager call of each variant: ``rounds`` batches of ``calls`` calls
    without a sync, the variants interleaved so that drift hits all alike, a sync after
    each batch (outside the timing); the median, fastest and 90th percentile over batches
    (2 batches in smoke mode)."""
    if ENV.smoke:
        rounds = min(rounds, 2)
    for fn in variants.values():
        fn()
    sync()
    results: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            results[name].append((time.perf_counter() - t0) / calls * 1e6)
            sync()
    return {k: HostTime.of(v) for k, v in results.items()}


def host_times_us(
    variants: dict[str, Callable[[], None]], calls: int, rounds: int = 7
) -> dict[str, float]:
    """The medians of :func:`host_time_stats_us`."""
    return {k: t.median for k, t in host_time_stats_us(variants, calls, rounds).items()}


def count_allocations(fn: Callable[[], None], calls: int = 100) -> int | None:
    """Device allocations (``allocation.all.allocated``) during ``calls`` eager calls after
    a warm-up; None off CUDA (the CPU allocator keeps no such count)."""
    fn()
    if ENV.device != "cuda":
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return torch.cuda.memory_stats()["allocation.all.allocated"] - before


# --- sync detection (smoke mode's stand-in for a capture) -----------------------------
SYNC_OPS = frozenset(
    {
        "aten::_local_scalar_dense",
        "aten::item",
        "aten::nonzero",
        "aten::nonzero_numpy",
        "aten::masked_select",
        "aten::is_nonzero",
        "aten::equal",
        "aten::allclose",
        "aten::unique",
        "aten::_unique",
        "aten::_unique2",
        "aten::unique_consecutive",
        "aten::unique_dim",
        "aten::repeat_interleave",
        "aten::tolist",
        "aten::_assert_async",
        "aten::bincount",
        "aten::histc",
    }
)
"""aten ops that read device data on the host (or size an output from it), so they sync
on a GPU and cannot be captured in a CUDA graph. ``repeat_interleave`` is listed whole
(only its ``output_size`` form avoids the sync)."""


class SyncDetector:
    """A ``TorchDispatchMode`` that records every aten op run under it and lists those that
    would sync on a GPU: :data:`SYNC_OPS`, and indexing with boolean masks (which runs
    ``nonzero``). On the CPU nothing syncs, so this is how smoke mode checks that a torch
    implementation meant for a CUDA graph is capturable."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                outer._see(func, args)
                return func(*args, **(kwargs or {}))

        self.ops: list[str] = []
        self.syncing: list[str] = []
        self._mode = _Mode()

    def _see(self, func, args) -> None:
        name = func._schema.name
        self.ops.append(name)
        if name in SYNC_OPS:
            self.syncing.append(name)
        elif name in (
            "aten::index",
            "aten::index_put",
            "aten::index_put_",
            "aten::_index_put_impl_",
        ):
            indices = args[1] if len(args) > 1 else ()
            if any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in indices or ()):
                self.syncing.append(name + " (boolean mask)")

    def __enter__(self) -> SyncDetector:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)


# --- tables -----------------------------------------------------------------------------
def fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) < 10 and digits < 2:
        return f"{value:.2f}" if abs(value) < 1 else f"{value:.1f}"
    return f"{value:.{digits}f}"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table (pastes straight into docs/performance.md), columns padded."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def value_of(rows: list[dict], **match) -> float | None:
    """The value of the last row matching every ``match`` field (as strings), or None."""
    found = None
    for r in rows:
        if all(str(r.get(k)) == str(v) for k, v in match.items()):
            found = r["value"]
    return found

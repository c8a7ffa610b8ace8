"""What does the host do in its slow stretches, and how far is ``launch_plan`` above the
floor of the checks it must make?

    python -m benchmarks.probes.host_slow_stretches [--seconds 150] [--rows 64] [--pin CPU]

Host time of ``launch_plan`` sampled over minutes beside two fixed reference workloads and
the machine's own counters (H200; needs CUDA).

Every ``--every`` seconds one sample times, interleaved, on the benchmark's plan case (64
rows, SWA on, the token pool given):

- ``launch_plan``, its bare dispatch (``dispatch_plan`` on validated arguments) and
  ``c_launch``, the cheapest Python call that launches the same compiled kernel (the
  launcher's cached C launch, replayed with recorded arguments): 5 batches of 20 eager
  calls each, a sync after each batch, outside its timing;
- ``validate_plan_args``, ``PlanBuffers.check`` and ``reads_floor`` (every attribute read
  those checks make, without a test or a branch), 200 calls each;
- ``python``: a fixed pure-Python loop of function calls (no torch), 20,000 calls;
- ``torch``: a fixed loop of 2,000 cheap torch attribute reads (``data_ptr``, ``dtype``,
  ``shape``: what the validation is made of);

and reads, over the sample, the machine's steal and busy time (``/proc/stat``), the time
the container's CPU quota throttled it (cgroup v2 ``cpu.stat``), the CPU
the process last ran on and its clock (``/sys/.../scaling_cur_freq`` where the machine has
it), and the load average. Each sample is a CSV row on stdout; a summary at the end
splits the samples at the median ``python`` time and compares the halves, with the floor of
any launcher making the same checks: ``reads_floor`` plus ``c_launch``. A slowdown that
hits the reference loops as much as ``launch_plan`` is the host's, not the launcher's.
``--rows`` sets the batch (the eager one-launch path from ``SCAN_BLOCK`` rows, whose numbered
launches cannot be replayed: no ``c_launch`` there); ``--pin CPU`` pins the process to one
CPU first. It runs on either layout of the library (before and since the layout by stage),
so the same probe times another revision, its packages first on ``sys.path``:

    git archive REV kv_canary_buffers kv_canary_kernels | tar -x -C DIR
    cd DIR && PYTHONPATH=ROOT python -m benchmarks.probes.host_slow_stretches --seconds 35

(``ROOT``: this checkout; ``python -m`` puts ``DIR`` first.)

Last answer (H200, 2026-12-01, 2530084: the fields as aliases): the host flips
between two speeds every fraction of a second (the Python loop 0.9 to 1.1 ms against 1.6
to 1.9 ms), outside the process (no steal, no throttling; pinning changes nothing); at 64
rows ``launch_plan`` takes 19.6 us in the fast half of the samples and 28.1 in the slow
half, against a floor (reads + C launch) of 9.7 and 14.1; at 4096 rows 20.1 and 29.8. On
c6e2ce1 (before the aliases) 25.3 and 38.5 us at 64 rows.
Raw, in the tag ``benchmark-results-2026-12-01``:
``benchmarks/results/h200-host-floor-fieldalias-new_1-64rows-20261201.csv``
(and ``...-new4096_2-...``, ``h200-host-floor-c6e2ce1-20261201.csv``).
"""

from __future__ import annotations

import argparse
import math
import operator
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import logged
from benchmarks.plan_cases import make_batch, verify_entries
from kv_canary_buffers import PlanBuffers, validate_plan_args
from kv_canary_buffers.buffers import STAGING_LINK_ATTR
from kv_canary_buffers.layout import PLAN_FIELDS, SCAN_BLOCK
from kv_canary_kernels import launch_plan
from kv_canary_kernels.plan import dispatch_plan

try:  # the plan's launchers: since the layout by stage in plan/dispatch.py, before in plan.py
    import kv_canary_kernels.plan.dispatch as plan_module
except ModuleNotFoundError:
    import kv_canary_kernels.plan as plan_module  # type: ignore[no-redef]


def cpu_times() -> tuple[int, int, int]:
    """(total, busy, steal) jiffies of the whole machine, from /proc/stat's ``cpu`` line."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (parts + [0] * 8)[:8]
    total = sum(parts[:8])
    return total, user + nice + system + irq + softirq, steal


def throttled_us() -> int:
    """Microseconds this container's cgroup was throttled by its CPU quota (cgroup v2
    ``cpu.stat``), or -1 where the machine does not expose it."""
    try:
        with open("/sys/fs/cgroup/cpu.stat") as f:
            for line in f:
                key, value = line.split()
                if key == "throttled_usec":
                    return int(value)
    except OSError:
        pass
    return -1


def last_cpu() -> int:
    """The CPU this process last ran on (field 39 of /proc/self/stat)."""
    with open("/proc/self/stat") as f:
        text = f.read()
    return int(text.rsplit(")", 1)[1].split()[36])


def cpu_mhz(cpu: int) -> float:
    """The clock of ``cpu`` in MHz, or NaN where the machine does not expose it."""
    path = f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq"
    try:
        with open(path) as f:
            return int(f.read()) / 1000
    except OSError:
        return float("nan")


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def python_loop() -> None:
    def f(x: int) -> int:
        return x + 1

    n = 0
    for _ in range(20_000):
        n = f(n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--every", type=float, default=0.5)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--pin", type=int, default=None)
    opts = parser.parse_args()
    if not torch.cuda.is_available():
        print("host_slow_stretches: needs CUDA")
        return 1
    if opts.pin is not None:
        os.sched_setaffinity(0, {opts.pin})
    rows = opts.rows
    kw = make_batch(rows, window=128, pool=True, device="cuda", seed=rows)
    bufs = PlanBuffers.allocate(
        write_req_capacity=rows, verify_capacity=verify_entries(kw), device="cuda"
    )
    args = validate_plan_args(bufs, **kw)
    t = bufs.verify_slot_indices

    def torch_reads() -> None:
        for _ in range(2_000):
            t.data_ptr()
            t.dtype  # noqa: B018
            t.shape  # noqa: B018

    replayable = rows < SCAN_BLOCK
    floor = reads_floor(bufs, kw)
    batched = {
        "launch_plan_us": lambda: launch_plan(bufs, **kw),
        "dispatch_us": lambda: dispatch_plan(bufs, args),
    }
    if replayable:
        batched["c_launch_us"] = launch_plan_replay(bufs, kw)
    unbatched = {
        "validate_us": lambda: validate_plan_args(bufs, **kw),
        "check_us": bufs.check,
        "reads_floor_us": floor,
    }

    def sample() -> dict[str, float]:
        out = {}
        for name, fn in batched.items():
            times = []
            for _ in range(5):
                times.append(per_call_us(fn, 20))
                torch.cuda.synchronize()
            out[name] = statistics.median(times)
        for name, fn in unbatched.items():
            out[name] = per_call_us(fn, 200)
        out["python_ms"] = per_call_us(python_loop, 1) / 1e3
        out["torch_ms"] = per_call_us(torch_reads, 1) / 1e3
        return out

    for _ in range(3):
        sample()
    print(
        f"# cpus {sorted(os.sched_getaffinity(0))} of {os.cpu_count()}; "
        f"torch {torch.__version__}; pin {opts.pin}",
        flush=True,
    )
    names = [*batched, *unbatched, "python_ms", "torch_ms"]
    machine = ["steal_pct", "busy_pct", "throttled_ms", "cpu", "mhz", "load1"]
    print(",".join(["t_s", *names, *machine]))
    rows = []
    start = time.perf_counter()
    while time.perf_counter() - start < opts.seconds:
        tick = time.perf_counter()
        total0, busy0, steal0 = cpu_times()
        throttled0 = throttled_us()
        row = sample()
        total1, busy1, steal1 = cpu_times()
        span = max(total1 - total0, 1)
        cpu = last_cpu()
        row.update(
            steal_pct=100 * (steal1 - steal0) / span,
            busy_pct=100 * (busy1 - busy0) / span,
            throttled_ms=(throttled_us() - throttled0) / 1e3 if throttled0 >= 0 else math.nan,
            cpu=cpu,
            mhz=cpu_mhz(cpu),
            load1=os.getloadavg()[0],
        )
        rows.append(row)
        cells = [f"{tick - start:.1f}", *(f"{row[n]:.3f}" for n in names)]
        cells += [f"{row[n]:.2f}" for n in machine]
        print(",".join(cells), flush=True)
        time.sleep(max(0.0, opts.every - (time.perf_counter() - tick)))
    median_py = statistics.median(r["python_ms"] for r in rows)
    halves = {
        "fast": [r for r in rows if r["python_ms"] <= median_py],
        "slow": [r for r in rows if r["python_ms"] > median_py],
    }
    summary = [*names, "steal_pct", "throttled_ms"]
    print("# half, samples, " + ", ".join(summary) + ", floor_us (reads floor + C launch)")
    for label, half in halves.items():
        medians = {n: statistics.median(r[n] for r in half) for n in summary}
        floor_us = medians["reads_floor_us"] + medians.get("c_launch_us", math.nan)
        cells = ", ".join(f"{n} {medians[n]:.2f}" for n in summary)
        print(f"# {label}, {len(half)}, {cells}, floor_us {floor_us:.2f}")
    ratios = [r["launch_plan_us"] / r["python_ms"] for r in rows]
    print(
        f"# launch_plan_us / python_ms: median {statistics.median(ratios):.2f}, "
        f"min {min(ratios):.2f}, max {max(ratios):.2f}; cpus seen "
        f"{sorted({r['cpu'] for r in rows})}"
    )
    return 0


def launch_plan_replay(bufs: PlanBuffers, kw: dict[str, Any]) -> Callable[[], None]:
    """The cheapest Python call that launches the same compiled plan kernel with the same
    arguments: the one-launch path's cached C launcher (``Launcher.launch_fixed``), called
    with the arguments ``launch_plan`` passed it, recorded once."""
    fixed = plan_module._SMALL.fixed
    launch_plan(bufs, **kw)  # compiles and caches the variant
    launch_plan(bufs, **kw)
    key, (index, go, addrs) = next(iter(fixed.items()))
    recorded: list[tuple[Any, ...]] = []

    def record(*a: Any) -> None:
        recorded.append(a)
        go(*a)

    fixed[key] = (index, record, addrs)
    launch_plan(bufs, **kw)
    fixed[key] = (index, go, addrs)
    torch.cuda.synchronize()
    call = recorded[0]
    return lambda: go(*call)


def reads_floor(bufs: PlanBuffers, kw: dict[str, Any]) -> Callable[[], None]:
    """Every attribute read of the checks ``launch_plan`` must make, with no test and no
    branch: a lower bound on any validation of the same facts in Python. The buffers' arena
    (type, storage address and size, owner) and the seven inputs; on a revision whose
    public fields are the buffers' own tensors (before ``FieldAlias``), also each field's
    address, dtype, shape and contiguity (issue 10's re-check at every launch)."""
    get_fields = operator.attrgetter(*(f.name for f in PLAN_FIELDS))
    fields = () if hasattr(bufs, "_write_offsets") else get_fields(bufs)
    inputs = [
        kw["req_pool_indices"],
        kw["prefix_lens"],
        kw["extend_seq_lens"],
        kw["req_to_token"],
        kw["full_to_swa_index_mapping"],
        kw["req_to_verify_expected_tokens"],
        kw["req_to_verify_expected_tokens_valid_lens"],
    ]
    rows = [*inputs[:3], inputs[6]]
    spans = inputs[3:6]

    def floor() -> None:
        arena = bufs.arena
        type(arena)
        storage = arena.storage
        storage.data_ptr()
        storage.nbytes()
        arena._owner[0]()
        for f in fields:
            f.data_ptr()
            f.dtype  # noqa: B018
            f.shape  # noqa: B018
            f.is_contiguous()
        for x in inputs:
            type(x)
            x.dtype  # noqa: B018
            x.shape  # noqa: B018
            x.is_cuda  # noqa: B018
            x.get_device()
            x.is_contiguous()
            x.data_ptr()
        for x in spans:
            x.nbytes  # noqa: B018
        for x in rows:
            getattr(x, STAGING_LINK_ATTR, None)

    return floor


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())

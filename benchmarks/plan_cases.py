"""The plan stage's cases (``python -m benchmarks --stage plan``).

CPU: time per ``plan_reference`` call against a plain-Python loop of the same plan
(median over repeats, ``time.perf_counter``).
CUDA: GPU time per plan (median over CUDA-graph replays timed with CUDA events) of
``launch_plan``, a torch-only plan and SGLang's design (and, where they load, SGLang's own
kernels: ``sglang_cuda``, up to their 4096 rows), next to the bandwidth floor, a kernel that
makes only the plan's per-entry memory accesses and a memset of the outputs' bytes (timed
the same way); host time per eager ``launch_plan`` against the bare dispatch
of the same kernels; device allocations during 100 launches. ``--tune`` sweeps the launch
constants; ``--profile-cases`` runs the cases alone for Nsight Compute.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.harness import (
    ENV,
    Recorder,
    count_allocations,
    graph_time_us,
    host_calls_for,
    host_time_stats_us,
    on_gpu,
    queued_gpu_time,
    value_of,
)
from kv_canary_buffers import (
    PlanBuffers,
    plan_reference,
    plans_equal,
    validate_plan_args,
    verify_entries_needed,
)

WINDOW = 128
MEAN_PREFIX = 512
GPU_BATCHES = (1, 64, 256, 4096, 65536)
HOST_TARGET_US = 30.0
"""Issue 9: host time per eager call of every launcher."""


def make_batch(
    bs: int, *, window: int, pool: bool, device: str, seed: int = 0, mean_prefix: int = MEAN_PREFIX
) -> dict:
    """All rows active, prefix uniform in [1, 2 * mean_prefix - 1], one new token each."""
    g = torch.Generator().manual_seed(seed)
    max_seq_len = 2 * mean_prefix + 8
    rows = bs + 1
    slots = torch.randperm(rows * max_seq_len, generator=g)[: rows * max_seq_len]
    table = slots.reshape(rows, max_seq_len).to(torch.int32)
    kwargs = dict(
        req_pool_indices=torch.randperm(bs, generator=g) + 1,
        prefix_lens=torch.randint(1, 2 * mean_prefix, (bs,), generator=g),
        extend_seq_lens=torch.ones(bs, dtype=torch.int64),
        req_to_token=table,
        swa_window_size=window,
    )
    if window > 0:
        kwargs["full_to_swa_index_mapping"] = torch.randperm(rows * max_seq_len, generator=g)
    if pool:
        kwargs["req_to_verify_expected_tokens"] = torch.randint(
            0, 150_000, (rows, max_seq_len), generator=g, dtype=torch.int32
        )
        kwargs["req_to_verify_expected_tokens_valid_lens"] = kwargs["prefix_lens"] + 1
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def verify_entries(kwargs: dict) -> int:
    """The case's verify entries: ``verify_entries_needed`` on host copies of its rows
    (the cases' rows live on the device; copying them here is setup, never timed)."""
    return verify_entries_needed(
        kwargs["prefix_lens"].cpu(),
        req_pool_indices=kwargs["req_pool_indices"].cpu(),
        swa_window_size=kwargs["swa_window_size"],
    )


def plan_bytes(kwargs: dict, entries: int) -> int:
    """Bytes the plan must move: per row, read rp/P/E (and the valid length), write an
    offset and a seed; per entry, read a slot (and a token, and a LUT value), write four
    int64 values."""
    bs = kwargs["req_pool_indices"].shape[0]
    has_lut = kwargs.get("full_to_swa_index_mapping") is not None
    has_pool = kwargs.get("req_to_verify_expected_tokens") is not None
    per_row = 3 * 8 + 8 + 8 + (8 if has_pool else 0)
    per_entry = 4 + 4 * 8 + (4 if has_pool else 0) + (8 if has_lut else 0)
    return bs * per_row + entries * per_entry


# --- CPU --------------------------------------------------------------------------
def bench_cpu(rec: Recorder, repeats: int) -> None:
    from benchmarks.baselines import python_loop_plan

    kwargs = make_batch(256, window=WINDOW, pool=True, device="cpu")
    entries = verify_entries(kwargs)
    case = dict(bs=256, swa=WINDOW, pool=1, entries=entries)
    buffers = PlanBuffers.allocate(write_req_capacity=256, verify_capacity=entries, device="cpu")
    for name, fn, reps in (
        ("plan_reference", plan_reference, repeats * 10),
        ("python_loop", python_loop_plan, repeats),
    ):
        fn(buffers, **kwargs)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(buffers, **kwargs)
            times.append(time.perf_counter() - t0)
        rec.add("cpu", name, "us_per_call", statistics.median(times) * 1e6, **case)


# --- GPU (or the interpreter in smoke mode) ------------------------------------------
SMOKE_BATCHES = (5, 1030)
"""Smoke mode's batches: both paths of launch_plan (1030 rows: the large path, one launch eager)."""
SMOKE_MEAN_PREFIX = 4


def memset_time_us(entries: int, replays: int) -> float:
    """``graph_time_us`` of a memset of as many bytes as the four outputs of ``entries``."""
    from benchmarks.baselines import memset_outputs

    outputs = torch.empty(4 * entries, dtype=torch.int64, device=ENV.device)
    return graph_time_us(functools.partial(memset_outputs, outputs), replays)


def bench_gpu(
    rec: Recorder, batches, replays: int, host_calls: int, bandwidth: float, sglang=None
) -> None:
    """GPU time per plan of every implementation at every batch (SWA off and on), host
    time per eager ``launch_plan`` against its bare dispatch and device allocations during
    100 launches at every batch (SWA on). ``bandwidth``: the run's copy bandwidth (B/s).
    ``sglang``: SGLang's ops (``benchmarks.sglang_cuda.SglangOps``) for the ``sglang_cuda``
    column, or None."""
    from benchmarks.baselines import (
        SGLANG_MAX_BS,
        sglang_design_plan,
        torch_plan,
        traffic_only_plan,
    )
    from benchmarks.harness import guarded
    from kv_canary_buffers.layout import SCAN_BLOCK
    from kv_canary_kernels import launch_plan
    from kv_canary_kernels.config import DEFAULT_LAUNCH_CONFIG
    from kv_canary_kernels.plan import dispatch_plan
    from tests.helpers.plan import poison

    device = ENV.device
    mean_prefix = MEAN_PREFIX if on_gpu() else SMOKE_MEAN_PREFIX

    # GPU time per plan, all implementations side by side.
    for window in (0, WINDOW):
        for bs in batches:
            kwargs = make_batch(
                bs, window=window, pool=True, device=device, seed=bs, mean_prefix=mean_prefix
            )
            entries = verify_entries(kwargs)
            case = dict(bs=bs, swa=window, pool=1, entries=entries)
            ref = PlanBuffers.allocate(
                write_req_capacity=bs, verify_capacity=entries, device=device
            )
            plan_reference(ref, **kwargs)
            impls = {"launch_plan": launch_plan, "torch_only": torch_plan}
            if bs <= SGLANG_MAX_BS:
                impls["sglang_design"] = sglang_design_plan
            for name, fn in impls.items():

                def measure(name=name, fn=fn) -> None:
                    buffers = PlanBuffers.allocate(
                        write_req_capacity=bs, verify_capacity=entries, device=device
                    )
                    poison(buffers)  # an output the implementation does not write shows
                    fn(buffers, **kwargs)
                    if not plans_equal(buffers, ref, bs):
                        raise AssertionError(f"{name} differs from plan_reference at bs={bs}")
                    us = graph_time_us(lambda: fn(buffers, **kwargs), replays)
                    rec.add("gpu_time", name, "us_per_plan", us, **case)

                guarded(rec, f"plan {name} bs={bs} swa={window}", measure)

            if sglang is not None:
                guarded(
                    rec,
                    f"plan sglang_cuda bs={bs} swa={window}",
                    lambda: sglang_plan_case(rec, sglang, ref, kwargs, case, replays),
                )

            if SCAN_BLOCK <= bs < DEFAULT_LAUNCH_CONFIG.one_launch_max_rows:
                # An eager launch_plan takes one launch here (a captured one, timed above,
                # three): timed eagerly, queued behind a sleeping kernel.
                def eager() -> None:
                    buffers = PlanBuffers.allocate(
                        write_req_capacity=bs, verify_capacity=entries, device=device
                    )
                    poison(buffers)
                    launch_plan(buffers, **kwargs)
                    if not plans_equal(buffers, ref, bs):
                        raise AssertionError(f"the one-launch plan differs at bs={bs}")
                    t = queued_gpu_time(lambda: launch_plan(buffers, **kwargs))
                    rec.add("gpu_time", "launch_plan_eager", "us_per_plan", t.us, **case)

                guarded(rec, f"plan launch_plan eager bs={bs} swa={window}", eager)

            # References: the plan's memory accesses alone, and a memset of its outputs.
            def references() -> None:
                buffers = PlanBuffers.allocate(
                    write_req_capacity=bs, verify_capacity=entries, device=device
                )
                us = graph_time_us(
                    functools.partial(traffic_only_plan, buffers, entries, **kwargs), replays
                )
                rec.add("gpu_time", "traffic_only", "us_per_plan", us, **case)
                rec.add(
                    "gpu_time",
                    "memset_outputs",
                    "us_per_plan",
                    memset_time_us(entries, replays),
                    **case,
                )

            guarded(rec, f"plan references bs={bs} swa={window}", references)
            floor = plan_bytes(kwargs, entries) / bandwidth * 1e6
            rec.add("gpu_time", "bandwidth_floor", "us_per_plan", floor, **case)
            ref = kwargs = None  # free before the next batch
            if device == "cuda":
                torch.cuda.empty_cache()

    # Host time per eager call: launch_plan against the bare dispatch of the same kernels,
    # and device allocations during 100 launches; every batch, SWA on.
    for bs in batches:

        def host() -> None:
            kwargs = make_batch(
                bs, window=WINDOW, pool=True, device=device, seed=bs, mean_prefix=mean_prefix
            )
            entries = verify_entries(kwargs)
            case = dict(bs=bs, swa=WINDOW, pool=1, entries=entries)
            buffers = PlanBuffers.allocate(
                write_req_capacity=bs, verify_capacity=entries, device=device
            )
            args = validate_plan_args(buffers, **kwargs)
            gpu_us = value_of(
                rec.rows, stage="plan", section="gpu_time", impl="launch_plan", bs=bs, swa=WINDOW
            )
            times = host_time_stats_us(
                {
                    "launch_plan": lambda: launch_plan(buffers, **kwargs),
                    "bare_dispatch": lambda: dispatch_plan(buffers, args),
                },
                host_calls_for(gpu_us, host_calls),
            )
            for name, t in times.items():
                rec.add("host", name, "us_per_call", t.median, spread=t, **case)
            rec.add(
                "host",
                "launch_over_bare",
                "ratio",
                times["launch_plan"].median / times["bare_dispatch"].median,
                **case,
            )
            rec.add("target", "launch_plan", "max_us", HOST_TARGET_US, note="host", **case)
            allocations = count_allocations(lambda: launch_plan(buffers, **kwargs))
            if allocations is not None:
                rec.add("alloc", "launch_plan", "allocations_per_100", allocations, **case)

        guarded(rec, f"plan host bs={bs}", host)


def sglang_plan_case(
    rec: Recorder, sglang, ref: PlanBuffers, kwargs: dict, case: dict, replays: int
) -> None:
    """SGLang's plan of the case (its outputs poisoned first), its fields checked equal to
    ``plan_reference``'s (``benchmarks.sglang_cuda.plan_differences``), then timed as the
    other implementations are; a batch beyond SGLang's row limit is an absent cell."""
    from benchmarks.sglang_cuda import SglangSide, plan_differences, plan_limit

    bs = case["bs"]
    limit = plan_limit(sglang, bs)
    if limit is not None:
        rec.add("absent", "sglang_cuda", "us_per_plan", 0, note=limit, **case)
        return
    theirs = SglangSide(sglang, bs=bs, verify_capacity=case["entries"], device=ENV.device)
    theirs.plan(kwargs)
    bad = plan_differences(ref, theirs, bs)
    if bad:
        raise AssertionError(f"sglang_cuda differs from plan_reference at bs={bs}: {bad}")
    us = graph_time_us(lambda: theirs.plan(kwargs), replays)
    rec.add("gpu_time", "sglang_cuda", "us_per_plan", us, **case)


TUNE_CONFIGS = [
    {},  # the defaults: kv_canary_kernels.config.DEFAULT_LAUNCH_CONFIG
    {"small_entry_block": 128},
    {"small_entry_block": 512},
    {"small_entry_warps": 4},
    {"small_programs_per_sm": 4},
    {"entry_block": 512},
    {"entry_warps": 4},
    {"lut_entry_block": 512},
    {"lut_entry_warps": 4},
    {"entry_programs_per_sm": 8},
    {"row_window": 16},
    {"row_window": 64},
    {"entries_options": (("maxnreg", 40),)},
    {"entries_options": (("num_stages", 1),)},
]
"""One field of the plan's ``LaunchConfig`` changed at a time from the defaults (a register
cap and the software-pipelining depth included)."""

TRAFFIC_CONFIGS = [(128, 4), (256, 4), (512, 4), (1024, 4), (1024, 8)]
"""(entries, warps) per program of the traffic-only reference kernel."""


def tune_gpu(rec: Recorder, replays: int) -> None:
    """Sweep the plan's launch constants, one at a time from the defaults
    (:data:`TUNE_CONFIGS`, each launched under ``launch_config(**changes)``), over batches
    of both paths, SWA off and on."""
    from kv_canary_kernels import launch_plan
    from kv_canary_kernels.config import DEFAULT_LAUNCH_CONFIG, launch_config

    cases = [(bs, w) for bs in (64, 256, 1000, 4096, 65536) for w in (0, WINDOW)]
    inputs = {c: make_batch(c[0], window=c[1], pool=True, device="cuda", seed=c[0]) for c in cases}
    for changes in TUNE_CONFIGS:
        impl = " ".join(f"{k}={v}" for k, v in changes.items()) or "defaults"
        with launch_config(DEFAULT_LAUNCH_CONFIG, **changes):
            for (bs, w), kwargs in inputs.items():
                entries = verify_entries(kwargs)
                bufs = PlanBuffers.allocate(
                    write_req_capacity=bs, verify_capacity=entries, device="cuda"
                )
                us = graph_time_us(functools.partial(launch_plan, bufs, **kwargs), replays)
                rec.add("tune", impl, "us_per_plan", us, bs=bs, swa=w, pool=1, entries=entries)

    # The shape of the stores decides the write rate: the traffic-only reference over
    # (block, warps), next to a memset of the same bytes.
    from benchmarks import baselines

    saved_traffic = baselines.TRAFFIC_BLOCK, baselines.TRAFFIC_WARPS
    try:
        for (bs, w), kwargs in inputs.items():
            entries = verify_entries(kwargs)
            case = dict(bs=bs, swa=w, pool=1, entries=entries)
            bufs = PlanBuffers.allocate(
                write_req_capacity=bs, verify_capacity=entries, device="cuda"
            )
            for block, warps in TRAFFIC_CONFIGS:
                baselines.TRAFFIC_BLOCK, baselines.TRAFFIC_WARPS = block, warps
                us = graph_time_us(
                    functools.partial(baselines.traffic_only_plan, bufs, entries, **kwargs), replays
                )
                rec.add("tune_traffic", f"block={block} warps={warps}", "us_per_plan", us, **case)
            rec.add(
                "tune_traffic",
                "memset_outputs",
                "us_per_plan",
                memset_time_us(entries, replays),
                **case,
            )
            del bufs
    finally:
        baselines.TRAFFIC_BLOCK, baselines.TRAFFIC_WARPS = saved_traffic


def profile_cases(case: str) -> None:
    """Two eager launch_plan calls per case and nothing else, for Nsight Compute.
    ``case`` is ``all`` or ``BS,WINDOW``."""
    from kv_canary_kernels import launch_plan

    cases = [(bs, w) for bs in (1, 256, 4096, 65536) for w in (0, WINDOW)]
    if case != "all":
        bs, window = (int(x) for x in case.split(","))
        cases = [(bs, window)]
    for bs, window in cases:
        kwargs = make_batch(bs, window=window, pool=True, device="cuda", seed=bs)
        buffers = PlanBuffers.allocate(
            write_req_capacity=bs, verify_capacity=verify_entries(kwargs), device="cuda"
        )
        print(f"case bs={bs} swa={window}", flush=True)
        for _ in range(2):
            launch_plan(buffers, **kwargs)
        torch.cuda.synchronize()


# --- plots ------------------------------------------------------------------------
PLOT_LABELS = {
    "launch_plan": "launch_plan (this library)",
    "launch_plan_eager": "launch_plan, eager (one launch from 1024 rows)",
    "sglang_cuda": "SGLang 0.5.23's CUDA kernels",
    "sglang_design": "SGLang's design (re-implemented here)",
    "torch_only": "torch-only plan",
    "traffic_only": "traffic-only reference",
    "memset_outputs": "memset of the outputs",
    "bandwidth_floor": "bandwidth floor",
    "bare_dispatch": "bare dispatch (same kernels, no checks)",
}
"""Legend labels. ``sglang_design`` is not SGLang's code: it is SGLang's plan design
re-implemented in ``benchmarks/baselines.py``; ``sglang_cuda`` is SGLang's own kernels
(``benchmarks/sglang_cuda.py``, where they load)."""

SGLANG_DESIGN_NOTE = (
    "SGLang's design (re-implemented here, not SGLang's code) has no point above {max_bs} "
    "rows: its offsets kernel scans every row in one Triton program\n(a {max_bs}-lane "
    "tl.cumsum), and SGLang's plan launcher refuses a larger batch."
)


def run_label(rows: list[dict]) -> str:
    """The machine and date of a run, from its rows: the GPU, the host CPU when the run
    recorded it, the day."""
    first = rows[0]
    parts = [str(first["device"])]
    if first.get("host_cpu"):
        parts.append(f"host CPU {first['host_cpu']}")
    if first.get("date"):
        parts.append(run_time(rows))
    return ", ".join(parts)


def run_time(rows: list[dict]) -> str:
    """When a run started, to the minute (UTC), from its rows."""
    return str(rows[0].get("date", ""))[:16].replace("T", " ") + " UTC"


def spread_bars(ax, xs, rows_at, label_rows: bool = True) -> bool:
    """Whiskers from the fastest batch to the 90th percentile over the median bars at
    ``xs``, for the rows (one per bar, None for a missing one) that recorded a spread.
    Returns whether any was drawn."""
    pts = [
        (x, r["value"], r["value"] - r["value_min"], r["value_p90"] - r["value"])
        for x, r in zip(xs, rows_at)
        if r is not None and r.get("value_min", "") != "" and r.get("value_p90", "") != ""
    ]
    if not pts:
        return False
    ax.errorbar(
        [p[0] for p in pts],
        [p[1] for p in pts],
        yerr=[[p[2] for p in pts], [p[3] for p in pts]],
        fmt="none",
        ecolor="black",
        elinewidth=1,
        capsize=3,
        label="fastest batch to 90th percentile" if label_rows else None,
    )
    return True


def plot(rows: list[dict], out_dir: Path, other_runs: Sequence[list[dict]] = ()) -> None:
    """plan_gpu_time.png and plan_host_overhead.png in ``out_dir`` (needs matplotlib).
    ``other_runs``: the rows of repeated runs of the same code, whose host-time medians
    are drawn as dots over this run's bars (the spread between runs)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots")
        return
    rows = [r for r in rows if r["stage"] == "plan"]
    if not rows:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = [r for r in rows if r["section"] == "gpu_time"]
    if gpu:
        fig, axes = plt.subplots(1, 2, figsize=(11, 5.6), sharey=True)
        stops: set[int] = set()
        for ax, swa in zip(axes, sorted({r["swa"] for r in gpu})):
            for impl in (
                "launch_plan",
                "launch_plan_eager",
                "sglang_cuda",
                "sglang_design",
                "torch_only",
                "traffic_only",
                "memset_outputs",
                "bandwidth_floor",
            ):
                pts = sorted(
                    (r["bs"], r["value"]) for r in gpu if r["swa"] == swa and r["impl"] == impl
                )
                if pts:
                    style = (
                        "-o"
                        if impl in ("launch_plan", "sglang_cuda", "sglang_design", "torch_only")
                        else "--"
                    )
                    ax.plot(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        style,
                        label=PLOT_LABELS.get(impl, impl),
                    )
                if impl == "sglang_design" and pts:
                    last = pts[-1][0]
                    if any(r["bs"] > last for r in gpu if r["swa"] == swa):
                        stops.add(last)
                        ax.annotate(
                            f"stops at {last} rows\n(see the note below)",
                            xy=pts[-1],
                            xytext=(0.55, 0.22),
                            textcoords="axes fraction",
                            fontsize=8,
                            color="C1",
                            arrowprops=dict(arrowstyle="->", color="C1"),
                        )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch size (rows), mean prefix 512, token pool on")
            ax.set_title("SWA off" if not swa else f"SWA on (W={swa}, LUT)")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel("GPU time per plan (us, median of graph replays)")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(
            handles, labels, loc="lower center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, 0.07)
        )
        fig.suptitle(f"kv-canary plan: GPU time per plan on {run_label(rows)}")
        if stops:
            fig.text(
                0.01, 0.01, SGLANG_DESIGN_NOTE.format(max_bs=max(stops)), fontsize=8, va="bottom"
            )
        fig.tight_layout(rect=(0, 0.17, 1, 1))
        fig.savefig(out_dir / "plan_gpu_time.png", dpi=110)
        plt.close(fig)
        print(f"wrote {out_dir / 'plan_gpu_time.png'}")
    host = [r for r in rows if r["section"] == "host" and r["metric"] == "us_per_call"]
    if host:
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        bss = sorted({r["bs"] for r in host})
        width = 0.38
        spread = others = False
        for i, impl in enumerate(("bare_dispatch", "launch_plan")):
            xs = [j + (i - 0.5) * width for j in range(len(bss))]
            at = [next((r for r in host if r["bs"] == b and r["impl"] == impl), None) for b in bss]
            ax.bar(
                xs,
                [r["value"] if r is not None else float("nan") for r in at],
                width,
                label=PLOT_LABELS.get(impl, impl) + ": median",
                color=f"C{i}",
            )
            spread |= spread_bars(ax, xs, at, label_rows=i == 0)
            for k, other in enumerate(other_runs):
                vals = [
                    next(
                        (
                            r["value"]
                            for r in other
                            if r["stage"] == "plan"
                            and r["section"] == "host"
                            and r["metric"] == "us_per_call"
                            and r["bs"] == b
                            and r["impl"] == impl
                        ),
                        None,
                    )
                    for b in bss
                ]
                pts = [(x, v) for x, v in zip(xs, vals) if v is not None]
                if pts:
                    others = True
                    ax.plot(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        "o",
                        color="black",
                        markersize=4,
                        label="median of another run" if i == 0 and k == 0 else None,
                    )
        swa = sorted({r["swa"] for r in host if r["swa"] != ""})
        window = f"SWA on (W={swa[0]}, LUT)" if swa and swa[0] else "SWA off"
        ax.set_xticks(range(len(bss)), [str(b) for b in bss])
        ax.set_xlabel(f"batch size (rows); {window}, token pool on")
        ax.set_ylabel("host time per eager call (us)")
        ax.set_ylim(bottom=0)
        ax.set_title(
            "Host (CPU) time per eager launch_plan call against its bare dispatch\n"
            f"machine: {run_label(rows)}",
            fontsize=10,
        )
        ax.legend(fontsize=8)
        how = ["bars: median over the timed batches of eager calls (a sync between batches)"]
        if spread:
            how.append("whiskers: fastest batch to 90th percentile")
        if others:
            when = ", ".join(run_time(o) for o in other_runs if o)
            how.append(f"dots: medians of {len(other_runs)} other run(s) of the same code ({when})")
        if not spread and not others:
            how.append("this run recorded no spread")
        fig.text(0.01, 0.01, "\n".join(how), fontsize=7, va="bottom")
        fig.tight_layout(rect=(0, 0.03 * len(how) + 0.01, 1, 1))
        fig.savefig(out_dir / "plan_host_overhead.png", dpi=110)
        plt.close(fig)
        print(f"wrote {out_dir / 'plan_host_overhead.png'}")

"""The benchmark's one entry point: every stage's cases of docs/performance.md, side by side
in one run.

Run from the repository's root:

    python -m benchmarks                          # every stage (CUDA), ~3 min on an H200
    python -m benchmarks --stage verify,write     # a subset: plan, verify, write, step, all
    python -m benchmarks --quick                  # fewer replays and calls
    PYTHONPATH=DIR:. python -m benchmarks --sglang require
                                                  # SGLang's CUDA kernels as a column
    python -m benchmarks --out DIR                # the CSV and plots into DIR
    python -m benchmarks --plots-into-docs        # the plots into docs/ (the CSV as usual)
    python -m benchmarks --device cpu             # the plan's CPU case only
    python -m benchmarks --stage plan --tune      # the plan's launch-constant sweep
    TRITON_INTERPRET=1 python -m benchmarks --smoke   # every GPU code path, tiny, on CPU
    python -m benchmarks --plot-from benchmarks/reference/h200.csv [OTHER_RUN.csv ...]
                                                  # plots again from CSVs, no GPU
    ncu --clock-control none --metrics gpu__time_duration.sum \\
        python -m benchmarks --profile-cases all  # the plan's per-kernel durations

Stages (benchmarks/plan_cases.py and benchmarks/canary_cases.py say what each times):
``plan`` (``launch_plan`` against a torch-only plan, SGLang's design, a traffic-only
kernel, a memset and the bandwidth floor; and the CPU case ``plan_reference`` against a
Python loop), ``verify`` and ``write`` (the library kernel, a torch-only implementation, a
traffic-only kernel and the bandwidth floor), ``step`` (plan + verify + write). GPU time per
call: a CUDA graph of 10 back-to-back calls, the median over replays timed with CUDA
events; host time per eager call of every launcher against its bare dispatch; device
allocations over 100 calls. Targets of the issues are printed next to the measured values.
Where SGLang 0.5.23's kv-canary ops load (its wheel installed into DIR, on ``PYTHONPATH``)
and the device is CUDA, the plan, verify and write tables get a ``sglang_cuda`` column:
SGLang's own CUDA kernels on the same cases, their outputs checked equal to this project's
first (``benchmarks/sglang_cuda.py``), timed the same way (``--sglang``, default ``auto``).

Writes ``<stages>-<device>-<date>.csv`` as it goes (device, versions and date in every row)
into ``--results`` (default ``benchmarks/out/``, which git ignores), prints the tables
(Markdown) and, when matplotlib is importable, PNG plots beside the CSV (into ``docs/``
only with ``--plots-into-docs``). Exits 1 when a measurement or a check failed (the rest
still ran). ``benchmarks/reference/`` holds each machine's reference run.
"""

from __future__ import annotations

import os
import sys

if "--smoke" in sys.argv:  # the interpreter must be chosen before Triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse
import platform
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.harness import Recorder, fmt, markdown_table, value_of

ROOT = Path(__file__).resolve().parents[1]

STAGES = ("plan", "verify", "write", "step")


def parse_stages(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if "all" in names:
        return list(STAGES)
    bad = [s for s in names if s not in STAGES]
    if bad or not names:
        raise SystemExit(
            f"--stage: expected a comma-separated subset of {STAGES} or all, got {text!r}"
        )
    return [s for s in STAGES if s in names]


# --- tables ----------------------------------------------------------------------------
def _key(r: dict) -> str:
    return r["case"] or f"bs={r['bs']} swa={r['swa']}"


def pivot(
    rows: list[dict], stage: str, section: str
) -> tuple[list[str], dict[str, dict[str, float]], dict[str, dict]]:
    order: list[str] = []
    table: dict[str, dict[str, float]] = {}
    first: dict[str, dict] = {}
    for r in rows:
        if r["stage"] != stage or r["section"] != section:
            continue
        k = _key(r)
        if k not in table:
            order.append(k)
            table[k] = {}
            first[k] = r
        table[k][r["impl"]] = r["value"]
    return order, table, first


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def find(
    rows: list[dict], stage: str, section: str, impl: str, key: str, note: str | None = None
) -> float | None:
    """The value of the last row of this stage, section, implementation and case key."""
    found = None
    for r in rows:
        if (
            r["stage"] == stage
            and r["section"] == section
            and r["impl"] == impl
            and _key(r) == key
            and (note is None or r["note"] == note)
        ):
            found = r["value"]
    return found


TARGET_WHAT = {
    "gpu_time": "GPU time (us)",
    "host": "host time per eager call (us)",
    "alloc": "device allocations over 100 eager calls",
}
"""What a target row's ``note`` (the section it reads) measures."""


def target_of(rows: list[dict], stage: str, key: str, impl: str, section: str) -> float | None:
    return find(rows, stage, "target", impl, key, note=section)


def met(value: float | None, limit: float | None) -> str:
    if limit is None:
        return ""
    if value is None:
        return "n/a"
    return "met" if value <= limit else "NOT met"


SGLANG = "sglang_cuda"


def _sglang_error(r: dict, stage: str, key: str | None = None) -> bool:
    """Whether ``r`` is the error row of SGLang's case ``key`` in ``stage`` (any case when
    None): ``guarded`` names it ``"<stage> sglang_cuda <case>"``."""
    what = r["impl"]
    return (
        r["section"] == "error"
        and r["stage"] == stage
        and what.startswith(f"{stage} {SGLANG} ")
        and (key is None or what == f"{stage} {SGLANG} {key}")
    )


def has_sglang(rows: list[dict], stage: str) -> bool:
    """Whether the run had SGLang's column in ``stage`` (a time, an absent cell, an error)."""
    return any(
        (r["stage"] == stage and r["impl"] == SGLANG) or _sglang_error(r, stage) for r in rows
    )


def sglang_cells(
    rows: list[dict], stage: str, key: str, table: dict[str, dict[str, float]], ours: str
) -> list[str]:
    """The ``sglang_cuda`` cell of a case and the ratio ``ours / sglang_cuda``: ``absent``
    where SGLang's kernel cannot run the case (the reason is listed under the table),
    ``error`` where its check or run failed (the errors are listed at the end)."""
    value = table[key].get(SGLANG)
    if value is None and find(rows, stage, "absent", SGLANG, key) is not None:
        return ["absent", "n/a"]
    if value is None and any(_sglang_error(r, stage, key) for r in rows):
        return ["error", "n/a"]
    return [fmt(value), ratio(table[key].get(ours), value)]


def absent_notes(rows: list[dict], stage: str) -> list[str]:
    return [
        f"\n{SGLANG} absent at {_key(r)}: {r['note']}"
        for r in rows
        if r["stage"] == stage and r["section"] == "absent"
    ]


def print_report(rec: Recorder, smoke: bool, sglang_note: str = "") -> None:
    rows = rec.rows
    out: list[str] = []
    if smoke:
        out.append("SMOKE MODE: interpreter on the CPU, tiny sizes; the figures are meaningless.")
    if sglang_note:
        out.append(sglang_note)
    bw = value_of(rows, impl="d2d_copy")
    empty = value_of(rows, impl="empty_launch")
    if bw is not None:
        out.append(
            f"device-to-device copy bandwidth {bw:.0f} GB/s (read + written); "
            f"empty launch {fmt(empty)} us"
        )

    order, table, first = pivot(rows, "plan", "gpu_time")
    if order:
        impls = [
            "launch_plan",
            "sglang_design",
            "torch_only",
            "traffic_only",
            "memset_outputs",
            "bandwidth_floor",
        ]
        sg = has_sglang(rows, "plan")
        out.append("\n## plan: GPU time per plan (us)\n")
        out.append(
            markdown_table(
                ["SWA", "bs", "verify entries"]
                + impls
                + ["launch_plan / floor"]
                + ([SGLANG, f"launch_plan / {SGLANG}"] if sg else []),
                [
                    [first[k]["swa"] or "off", first[k]["bs"], f"{first[k]['entries']:,}"]
                    + [fmt(table[k].get(i), 2 if i == "bandwidth_floor" else 1) for i in impls]
                    + [ratio(table[k].get("launch_plan"), table[k].get("bandwidth_floor"))]
                    + (sglang_cells(rows, "plan", k, table, "launch_plan") if sg else [])
                    for k in order
                ],
            )
        )
        out.extend(absent_notes(rows, "plan"))
    cpu = [r for r in rows if r["stage"] == "plan" and r["section"] == "cpu"]
    if cpu:
        out.append("\n## plan on the CPU (us per call)\n")
        out.append(
            markdown_table(
                ["impl", "case", "us"], [[r["impl"], _key(r), fmt(r["value"])] for r in cpu]
            )
        )

    order, table, first = pivot(rows, "verify", "gpu_time")
    if order:
        impls = [
            "launch_verify",
            "torch_only",
            "traffic_only",
            "traffic_device_count",
            "traffic_both_records",
            "bandwidth_floor",
        ]
        out.append(
            "\n## verify: GPU time per call (us); traffic_device_count first reads the "
            "plan's count on the device (as a verify that needs no sync must); "
            "traffic_both_records also reads the predecessor's record (as SGLang's verify "
            "does)\n"
        )
        sg = has_sglang(rows, "verify")
        out.append(
            markdown_table(
                ["case", "entries"]
                + impls
                + ["target", "", "launch / traffic", "launch / floor"]
                + ([SGLANG, f"launch / {SGLANG}"] if sg else []),
                [
                    [k, f"{first[k]['entries']:,}"]
                    + [fmt(table[k].get(i), 2 if i == "bandwidth_floor" else 1) for i in impls]
                    + [
                        fmt(target_of(rows, "verify", k, "launch_verify", "gpu_time")),
                        met(
                            table[k].get("launch_verify"),
                            target_of(rows, "verify", k, "launch_verify", "gpu_time"),
                        ),
                        ratio(table[k].get("launch_verify"), table[k].get("traffic_only")),
                        ratio(table[k].get("launch_verify"), table[k].get("bandwidth_floor")),
                    ]
                    + (sglang_cells(rows, "verify", k, table, "launch_verify") if sg else [])
                    for k in order
                ],
            )
        )
        out.extend(absent_notes(rows, "verify"))

    order, table, first = pivot(rows, "write", "gpu_time")
    if order:
        impls = ["launch_write", "write_reference_eager", "traffic_only", "bandwidth_floor"]
        out.append(
            "\n## write: GPU time per call (us); write_reference_eager is the torch "
            "reference's eager wall time with a sync (its chain is a Python loop)\n"
        )
        sg = has_sglang(rows, "write")
        out.append(
            markdown_table(
                ["case", "tokens"]
                + impls
                + ["target", ""]
                + ([SGLANG, f"launch_write / {SGLANG}"] if sg else []),
                [
                    [k, f"{first[k]['tokens']:,}"]
                    + [fmt(table[k].get(i), 2 if i == "bandwidth_floor" else 1) for i in impls]
                    + [
                        fmt(target_of(rows, "write", k, "launch_write", "gpu_time")),
                        met(
                            table[k].get("launch_write"),
                            target_of(rows, "write", k, "launch_write", "gpu_time"),
                        ),
                    ]
                    + (sglang_cells(rows, "write", k, table, "launch_write") if sg else [])
                    for k in order
                ],
            )
        )
        out.extend(absent_notes(rows, "write"))

    order, table, first = pivot(rows, "step", "gpu_time")
    if order:
        _, host, _ = pivot(rows, "step", "host")
        out.append("\n## step: plan + verify + write of a decode step\n")
        out.append(
            markdown_table(
                [
                    "case",
                    "verify entries",
                    "GPU time (us, graph)",
                    "host, eager (us)",
                    "host, bare dispatch (us)",
                ],
                [
                    [
                        k,
                        f"{first[k]['entries']:,}",
                        fmt(table[k].get("step")),
                        fmt(host.get(k, {}).get("step")),
                        fmt(host.get(k, {}).get("step:bare_dispatch")),
                    ]
                    for k in order
                ],
            )
        )

    host_rows = []
    for stage in STAGES:
        order, table, first = pivot(rows, stage, "host")
        for k in order:
            for launcher in ("launch_plan", "launch_verify", "launch_write"):
                v = table[k].get(launcher)
                if v is None:
                    continue
                bare = table[k].get(f"{launcher}:bare_dispatch")
                if stage == "plan":
                    bare = table[k].get("bare_dispatch")
                limit = target_of(rows, stage, k, launcher, "host")
                host_rows.append(
                    [
                        stage,
                        k,
                        launcher,
                        fmt(v),
                        fmt(bare),
                        ratio(v, bare),
                        fmt(limit),
                        met(v, limit),
                    ]
                )
    if host_rows:
        out.append("\n## host time per eager call (us): validated launcher vs bare dispatch\n")
        out.append(
            markdown_table(
                ["stage", "case", "launcher", "validated", "bare dispatch", "ratio", "target", ""],
                host_rows,
            )
        )

    alloc = [r for r in rows if r["section"] == "alloc"]
    if alloc:
        out.append("\n## device allocations over 100 eager calls after warm-up (target 0)\n")
        out.append(
            markdown_table(
                ["stage", "case", "calls", "allocations", ""],
                [
                    [
                        r["stage"],
                        _key(r),
                        r["impl"],
                        int(r["value"]),
                        "met" if r["value"] == 0 else "NOT met",
                    ]
                    for r in alloc
                ],
            )
        )

    targets = [r for r in rows if r["section"] == "target"]
    if targets:
        out.append("\n## targets (issues 9 and 28)\n")
        trows = []
        for t in targets:
            measured = find(rows, t["stage"], t["note"], t["impl"], _key(t))
            what = TARGET_WHAT.get(t["note"], t["note"])
            show = (lambda v: "n/a" if v is None else str(int(v))) if t["note"] == "alloc" else fmt
            trows.append(
                [
                    t["stage"],
                    _key(t),
                    f"{t['impl']} {what}",
                    f"<= {show(t['value'])}",
                    show(measured),
                    met(measured, t["value"]),
                ]
            )
        out.append(markdown_table(["stage", "case", "what", "target", "measured", ""], trows))
        missed = sum(1 for r in trows if r[-1] != "met")
        out.append(f"\n{len(trows) - missed} of {len(trows)} targets met")
    if rec.errors:
        out.append(f"\n## {len(rec.errors)} ERRORS (measurements or checks that failed)\n")
        out.extend(f"- {e}" for e in rec.errors)
    print("\n".join(out), flush=True)


# --- plots -------------------------------------------------------------------------------
CANARY_LABELS = {
    "sglang_cuda": "SGLang 0.5.23's CUDA kernel",
    "launch_verify": "launch_verify (this library)",
    "launch_write": "launch_write (this library)",
    "torch_only": "torch-only",
    "write_reference_eager": "write_reference (torch, eager)",
    "traffic_only": "traffic-only reference",
    "traffic_device_count": "traffic-only, count read on the device (no sync)",
    "traffic_both_records": "traffic-only, both records read (as SGLang's verify does)",
    "bandwidth_floor": "bandwidth floor",
}


def plot_canary(rows: list[dict], out_dir: Path, other_runs: Sequence[list[dict]] = ()) -> None:
    """canary_gpu_time.png (verify and write, every implementation, the targets) and
    canary_host_time.png (every launcher, validated and bare) in ``out_dir``.
    ``other_runs`` is accepted for symmetry with ``plan_cases.plot`` (the canary host plot
    has one bar pair per case and draws this run's spread only)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots")
        return
    from benchmarks.plan_cases import run_label, spread_bars

    out_dir.mkdir(parents=True, exist_ok=True)
    panels = [
        (
            "verify",
            "launch_verify",
            [
                "launch_verify",
                "torch_only",
                "traffic_only",
                "traffic_device_count",
                "traffic_both_records",
                "bandwidth_floor",
            ],
        ),
        (
            "write",
            "launch_write",
            ["launch_write", "write_reference_eager", "traffic_only", "bandwidth_floor"],
        ),
    ]
    panels = [
        (stage, main, impls + [SGLANG] if has_sglang(rows, stage) else impls)
        for stage, main, impls in panels
        if pivot(rows, stage, "gpu_time")[0]
    ]
    if panels:
        fig, axes = plt.subplots(len(panels), 1, figsize=(15, 4.5 * len(panels)), squeeze=False)
        for ax, (stage, main, impls) in zip(axes[:, 0], panels):
            order, table, _ = pivot(rows, stage, "gpu_time")
            width = 0.8 / len(impls)
            for i, impl in enumerate(impls):
                vals = [table[k].get(impl, float("nan")) for k in order]
                ax.bar(
                    [j + (i - len(impls) / 2 + 0.5) * width for j in range(len(order))],
                    vals,
                    width,
                    label=CANARY_LABELS.get(impl, impl),
                )
            limits = [target_of(rows, stage, k, main, "gpu_time") for k in order]
            ax.scatter(
                range(len(order)),
                [v if v is not None else float("nan") for v in limits],
                marker="_",
                s=600,
                color="black",
                zorder=3,
                label="target",
            )
            ax.set_xticks(range(len(order)), order, rotation=20, ha="right")
            ax.set_yscale("log")
            ax.set_xlabel(
                "case: batch rows, SWA window, real-KV mode"
                if stage == "verify"
                else "case: kind, rows x tokens each"
            )
            ax.set_ylabel("GPU time per call (us)")
            ax.set_title(f"{stage}: median of CUDA-graph replays")
            ax.grid(True, axis="y", which="both", alpha=0.3)
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.suptitle(f"kv-canary write and verify on {run_label(rows)}")
        fig.tight_layout()
        fig.savefig(out_dir / "canary_gpu_time.png", dpi=110)
        plt.close(fig)
        print(f"wrote {out_dir / 'canary_gpu_time.png'}")
    host = [
        r
        for r in rows
        if r["section"] == "host"
        and r["stage"] != "plan"
        and r["impl"] in ("launch_plan", "launch_verify", "launch_write")
    ]
    if host:
        bare = {
            (r["stage"], _key(r), r["impl"].split(":")[0]): r
            for r in rows
            if r["section"] == "host" and r["impl"].endswith(":bare_dispatch")
        }
        labels = [f"{r['stage']} {_key(r)}\n{r['impl']}" for r in host]
        fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(host)), 5.5))
        xs = range(len(host))
        bare_at = [bare.get((r["stage"], _key(r), r["impl"])) for r in host]
        left, right = [x - 0.2 for x in xs], [x + 0.2 for x in xs]
        ax.bar(
            left,
            [b["value"] if b is not None else float("nan") for b in bare_at],
            0.4,
            label="bare dispatch (same kernels, no checks): median",
        )
        ax.bar(right, [r["value"] for r in host], 0.4, label="validated launcher: median")
        spread = spread_bars(ax, left, bare_at)
        spread |= spread_bars(ax, right, host, label_rows=False)
        targets = [
            r["value"]
            for r in rows
            if r["section"] == "target" and r["note"] == "host" and r["stage"] != "plan"
        ]
        ax.axhline(
            targets[0] if targets else harness_target(),
            color="black",
            linestyle="--",
            label="target",
        )
        ax.set_xticks(list(xs), labels, rotation=90, fontsize=7)
        ax.set_xlabel("stage, case and launcher")
        ax.set_ylabel("host time per eager call (us)")
        ax.set_title(f"Host time per eager call, every launcher: {run_label(rows)}")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0))
        how = "bars: median over the timed batches of eager calls (a sync between batches); "
        how += (
            "whiskers: fastest batch to 90th percentile"
            if spread
            else "this run recorded no spread (runs before the value_min / value_p90 columns)"
        )
        fig.text(0.01, 0.01, how, fontsize=7, va="bottom")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(out_dir / "canary_host_time.png", dpi=110)
        plt.close(fig)
        print(f"wrote {out_dir / 'canary_host_time.png'}")


def harness_target() -> float:
    from benchmarks.canary_cases import HOST_TARGET_US

    return HOST_TARGET_US


# --- main ----------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    paragraphs = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=paragraphs[0],
        epilog="\n\n".join(paragraphs[1:3]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--stage", default="all", help="comma-separated: plan, verify, write, step or all (default)"
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--quick", action="store_true", help="fewer replays and calls")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="every GPU code path at tiny sizes on the CPU under "
        "TRITON_INTERPRET=1 (set automatically), with output checks",
    )
    parser.add_argument(
        "--tune", action="store_true", help="plan stage: sweep the entries launch constants"
    )
    parser.add_argument(
        "--profile-cases",
        metavar="all|BS,WINDOW",
        help="plan stage: only run launch_plan on the cases, for ncu",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="CSV folder (default benchmarks/out/, which git ignores)",
    )
    plots = parser.add_mutually_exclusive_group()
    plots.add_argument(
        "--plots", type=Path, default=None, help="PNG folder (default: the CSV's folder)"
    )
    plots.add_argument(
        "--plots-into-docs",
        action="store_true",
        help="the PNGs into docs/, where docs/performance.md shows them",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="one folder for both the CSV and the plots"
    )
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument(
        "--sglang",
        choices=["auto", "off", "require"],
        default="auto",
        help="SGLang 0.5.23's kv-canary kernels as the sglang_cuda column of the plan, verify "
        "and write tables: auto (default) where they load (on PYTHONPATH) and the device is "
        "CUDA; require: fail unless they load (any device); off",
    )
    parser.add_argument(
        "--plot-from",
        type=Path,
        nargs="+",
        metavar="CSV",
        help="measure nothing: draw the plots of the first CSV's --stage stages (for example "
        "benchmarks/reference/h200.csv); further CSVs are repeated runs of the same code, "
        "drawn as dots on the plan's host plot. Needs no GPU",
    )
    args = parser.parse_args(argv)
    docs = ROOT / "docs" if args.plots_into_docs else None
    if args.plot_from:
        from benchmarks.plan_cases import plot

        first, *others = (harness.load_rows(p) for p in args.plot_from)
        out = docs or args.plots or args.out or harness.OUT
        chosen = parse_stages(args.stage)
        if "plan" in chosen:
            plot(first, out, others)
        if any(s != "plan" for s in chosen):
            plot_canary(first, out, others)
        return 0
    stages = parse_stages(args.stage)

    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--smoke needs TRITON_INTERPRET=1 (set before Triton is imported)")
    device = args.device
    if args.smoke:
        device = "cpu"
    elif device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    env = harness.configure(device, args.smoke)
    gpu_like = device == "cuda" or args.smoke

    if args.profile_cases:
        from benchmarks.plan_cases import profile_cases

        profile_cases(args.profile_cases)
        return 0

    results = args.out or args.results or harness.OUT
    plots = docs or args.plots or args.out or results
    label = "-".join(stages) if len(stages) < len(STAGES) else "all"
    if args.tune:
        label = "plan-tune"
    if args.smoke:
        label = f"smoke-{label}"
    stamp = harness.utc_stamp()
    name = torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or "cpu")
    rec = Recorder(name, results / f"{label}-{device}-{stamp}.csv")
    started = time.perf_counter()

    from benchmarks.sglang_cuda import resolve

    sglang = None
    sglang_note = ""
    if any(s in stages for s in ("plan", "verify", "write")) and gpu_like:
        sglang, sglang_note = resolve(args.sglang, device)
        print(sglang_note, flush=True)

    quick = args.quick
    replays = 2 if args.smoke else (20 if quick else 50)
    host_calls = 1 if args.smoke else (100 if quick else 1000)
    try:
        if args.tune:
            from benchmarks.plan_cases import tune_gpu

            if device != "cuda":
                raise SystemExit("--tune needs CUDA")
            rec.stage = "plan"
            tune_gpu(rec, replays=30)
            stages = []
        bandwidth = 0.0
        if gpu_like and stages:
            rec.stage = "device"
            bandwidth = harness.copy_bandwidth()
            rec.add("gpu", "d2d_copy", "GB_per_s", bandwidth / 1e9)
            from benchmarks.baselines import empty_launch
            from kv_canary_buffers import PlanBuffers

            scratch = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=1, device=device)
            rec.add(
                "gpu",
                "empty_launch",
                "us_per_launch",
                harness.graph_time_us(lambda: empty_launch(scratch), replays),
            )
        if not gpu_like and any(s != "plan" for s in stages):
            print(f"stages {[s for s in stages if s != 'plan']} need CUDA (or --smoke): skipped")
        for stage in stages:
            t0 = time.perf_counter()
            rec.stage = stage
            if stage == "plan":
                from benchmarks.plan_cases import GPU_BATCHES, SMOKE_BATCHES, bench_cpu, bench_gpu

                harness.guarded(
                    rec, "plan cpu", lambda: bench_cpu(rec, repeats=1 if args.smoke or quick else 5)
                )
                if gpu_like:
                    batches = (
                        SMOKE_BATCHES if args.smoke else (GPU_BATCHES[:3] if quick else GPU_BATCHES)
                    )
                    bench_gpu(
                        rec,
                        batches,
                        replays=replays if args.smoke else (20 if quick else 100),
                        host_calls=host_calls,
                        bandwidth=bandwidth,
                        sglang=sglang,
                    )
            elif gpu_like:
                from benchmarks import canary_cases as cc

                sizes = cc.SMOKE_SIZES if args.smoke else cc.GPU_SIZES
                if stage == "verify":
                    cc.bench_verify(rec, sizes, replays, host_calls, bandwidth, sglang)
                elif stage == "write":
                    cc.bench_write(
                        rec,
                        sizes,
                        replays,
                        host_calls,
                        bandwidth,
                        reference_repeats=2 if (quick or args.smoke) else 5,
                        sglang=sglang,
                    )
                elif stage == "step":
                    cc.bench_step(rec, sizes, replays, host_calls)
            else:
                continue
            rec.add("run", "stage", "seconds", time.perf_counter() - t0)
        rec.stage = "run"
        rec.add("run", "total", "seconds", time.perf_counter() - started)
    except Exception as err:  # a dead CUDA context: report what was measured
        rec.error("run aborted", err)
    finally:
        rec.close()
    print_report(rec, args.smoke, sglang_note)
    if (
        not args.no_plots
        and rec.rows
        and (env.device == "cuda" or args.smoke or os.environ.get("KV_CANARY_PLOT_CPU"))
    ):
        from benchmarks.plan_cases import plot

        plot(rec.rows, plots)
        plot_canary(rec.rows, plots)
    print(f"total {time.perf_counter() - started:.1f} s; results in {rec.path}")
    return 1 if rec.errors else 0


if __name__ == "__main__":  # one entry point, one command
    raise SystemExit(
        "kv-canary: run the benchmark as `python -m benchmarks` from the repository root"
    )

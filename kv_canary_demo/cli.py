"""The main job, ``python -m kv_canary_demo``: the whole canary around a toy engine.

It runs :class:`~kv_canary_demo.simulation.Simulation` (read the package docstring for
the step order and the HEAD/TAIL stores) for ``--steps`` steps: two buffer groups (full
attention, and a sliding window with its slot LUT), an expected-token pool, padding rows, a
batch limit and KV pool that double mid-run (plan buffers grow a generation, stores are resized),
and a full group whose verify capacity starts small so that a step overflows. Every plan
is checked against the contract and ``plan_reference``; when the kernels run, reference
stores fed the same inputs are compared with the kernels' stores every step.

``--inject-corruption`` puts each of seven corruption kinds in at a random step and shows
which launch caught it; the run exits 0 only if every kind was caught and every violation
belongs to a request some injection damaged. A clean run exits 0 only with no violation
at all. The stages are the Triton kernels where Triton can run (a GPU, replayed from CUDA
graphs, or the CPU with ``TRITON_INTERPRET=1``) and the torch references elsewhere; this
module imports Triton only in the first case, when the demo runs. This is the only module
of the project that imports rich.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import os
import re
import statistics
import sys
from collections.abc import Iterator

import torch
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kv_canary_buffers import __version__

from .config import SimConfig
from .corruption import Corruption
from .simulation import Simulation

DEVICES_THAT_WORK = "cpu, cuda, cuda:N"
MIN_INJECTION_STEPS = 20
"""Seven kinds at distinct steps, each with a few steps left to be caught."""


class DemoError(Exception):
    """A one-line refusal of the arguments (printed without a traceback, exit 2)."""


def parse_device(text: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` on a machine that has it; else :class:`DemoError`."""
    m = re.fullmatch(r"(cpu|cuda)(?::(\d+))?", text.strip())
    if m is None or (m.group(1) == "cpu" and m.group(2) not in (None, "0")):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        here = "cpu" if count == 0 else f"cpu, cuda, cuda:0..cuda:{count - 1}"
        raise DemoError(f"--device {text}: not supported; devices that work here: {here}")
    if m.group(1) == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DemoError(
            f"--device {text}: CUDA is not available on this machine; devices that work here: cpu"
        )
    index = int(m.group(2)) if m.group(2) is not None else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if index >= count:
        raise DemoError(
            f"--device {text}: this machine has {count} CUDA device(s); "
            f"devices that work: cpu, cuda, cuda:0..cuda:{count - 1}"
        )
    return torch.device("cuda", index)


def pick_kernels(device: torch.device, choice: str) -> bool:
    """Whether the Triton kernels run: where Triton can (``auto``), or as asked."""
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    can_triton = device.type == "cuda" or interpreting
    if choice == "reference":
        return False
    if choice == "kernels" and not can_triton:
        raise DemoError(
            "--stages kernels: the Triton kernels need a CUDA device, or "
            "TRITON_INTERPRET=1 to run them on the CPU in Triton's interpreter"
        )
    return can_triton


def injection_schedule(steps: int, seed: int) -> list[tuple[int, Corruption]]:
    """Each corruption kind at its own random step in ``[2, steps - 8)``."""
    gen = torch.Generator().manual_seed(seed + 1)
    kinds = list(Corruption)
    at = (torch.randperm(steps - 10, generator=gen)[: len(kinds)] + 2).tolist()
    order = torch.randperm(len(kinds), generator=gen).tolist()
    return sorted(zip(at, (kinds[i] for i in order)), key=lambda pair: pair[0])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kv_canary_demo",
        description="Run the whole KV-cache canary (plan, HEAD verify, write, TAIL verify) "
        "around a simulated serving engine, step by step.",
    )
    parser.add_argument("--version", action="version", version=f"kv-canary-buffers {__version__}")
    parser.add_argument("--steps", type=int, default=200, help="engine steps (default 200)")
    parser.add_argument(
        "--max-batch",
        type=int,
        default=32,
        help="requests per step before the engine doubles it mid-run (default 32)",
    )
    parser.add_argument(
        "--max-seq-len",
        type=int,
        default=256,
        help="longest request in tokens; prompts, outputs, prefill chunks "
        "and the sliding window scale with it (default 256)",
    )
    parser.add_argument(
        "--device", default="cpu", help=f"where the canary runs: {DEVICES_THAT_WORK} (default cpu)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--inject-corruption",
        action="store_true",
        help="inject each of the seven corruption kinds at a random step and "
        f"show it caught (needs --steps >= {MIN_INJECTION_STEPS})",
    )
    parser.add_argument(
        "--stages",
        "--planner",
        dest="stages",
        default="auto",
        choices=["auto", "kernels", "reference"],
        help="auto: the Triton kernels where Triton can run (a GPU, or "
        "TRITON_INTERPRET=1), else the torch references",
    )
    parser.add_argument(
        "--no-tail",
        dest="tail",
        action="store_false",
        help="keep only the HEAD store (no TAIL store written and verified after the forward)",
    )
    parser.add_argument(
        "--no-graphs",
        dest="graphs",
        action="store_false",
        help="on CUDA, launch the kernels eagerly instead of replaying CUDA graphs",
    )
    return parser


def run(argv: list[str] | None = None) -> int:
    """Run the demo with command-line arguments ``argv`` (``sys.argv[1:]`` when None) and
    return the exit status (see the module docstring). A closed output pipe (``| head``)
    ends it quietly with status 1, no traceback (rich's console does the same when its
    write fails)."""
    try:
        return _run(argv)
    except BrokenPipeError:
        # Python's recipe (docs of the signal module, "Note on SIGPIPE"): point stdout at
        # devnull so that the interpreter's final flush does not raise again.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 1


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.steps < 1 or args.max_batch < 1:
            raise DemoError("--steps and --max-batch must be >= 1")
        if args.max_seq_len < 8:
            raise DemoError(f"--max-seq-len must be >= 8, got {args.max_seq_len}")
        if args.inject_corruption and args.steps < MIN_INJECTION_STEPS:
            raise DemoError(
                f"--inject-corruption needs --steps >= {MIN_INJECTION_STEPS}, got {args.steps}"
            )
        device = parse_device(args.device)
        kernels = pick_kernels(device, args.stages)
    except DemoError as err:
        parser.exit(2, f"kv-canary demo: error: {err}\n")
    graphs = bool(args.graphs and kernels and device.type == "cuda")
    config = SimConfig.for_max_seq_len(
        args.max_seq_len,
        max_batch=args.max_batch,
        device=str(device),
        seed=args.seed,
        kernels=kernels,
        graphs=graphs,
        tail=args.tail,
    )

    # a bar only on a terminal; piped output is not wrapped to 80 columns
    interactive = sys.stdout.isatty() and sys.stderr.isatty()
    console = Console(
        highlight=False,
        markup=False,
        emoji=False,
        soft_wrap=True,
        width=None if sys.stdout.isatty() else 200,
    )
    with _one_thread_on_cpu(device):
        return _main(args, config, console, interactive)


@contextlib.contextmanager
def _one_thread_on_cpu(device: torch.device) -> Iterator[None]:
    """The simulation's tensors are tiny: on the CPU, intra-op threads only add overhead
    (about 3x on a 2-core machine), so the demo uses one and restores the setting."""
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _main(args: argparse.Namespace, config: SimConfig, console: Console, interactive: bool) -> int:
    progress = Progress(
        TextColumn("steps"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not interactive,
    )
    sim = Simulation(config, log=console.print)
    stores = "HEAD and TAIL stores" if config.tail else "HEAD store only"
    console.print(
        f"kv-canary demo {__version__}: {args.steps} steps on {sim.device}, "
        f"{stores}, stages: {sim.stages.name}"
        + (", replayed from CUDA graphs" if config.graphs else "")
    )
    schedule = dict(injection_schedule(args.steps, args.seed)) if args.inject_corruption else {}
    with progress:
        task = progress.add_task("steps", total=args.steps)
        for i in range(args.steps):
            if i == args.steps // 2 and i > 0:
                sim.raise_batch_limit()
            if i in schedule:
                sim.inject(schedule[i])
            sim.step()
            progress.advance(task)
    return _summary(sim, console, args.inject_corruption)


def _summary(sim: Simulation, console: Console, injecting: bool) -> int:
    s = sim.stats
    groups = ", ".join(f"{g.name} generation {g.buffers.generation}" for g in sim.groups)
    stores = ", ".join(f"{g.name} generation {g.head.generation}" for g in sim.groups)
    checked_stores = (
        str(s.store_mismatches)
        if sim.stages.kernels and sim.config.check_stores
        else "not compared (the references are the stages)"
    )
    unexplained = [seen for seen in sim.seen if not sim.explained(seen)]
    table = Table(
        box=None, show_header=False, title="summary", title_justify="left", padding=(0, 2)
    )
    table.add_column("what")
    table.add_column("value")
    rows = [
        ("steps", s.steps),
        ("requests admitted / finished / aborted", f"{s.admitted} / {s.finished} / {s.aborted}"),
        (
            "rows planned (padding included)",
            f"{s.rows} ({s.active_rows} active: {s.prefill_rows} prefill, {s.decode_rows} decode)",
        ),
        ("slots reused from earlier requests", s.reused_slots),
        ("tokens stamped (both groups)", s.write_entries),
        ("verify entries checked (HEAD + TAIL)", s.verify_entries),
        ("overflow steps (verify skipped)", s.overflow_steps),
        ("plan buffer resizes", f"{s.plan_resizes} ({groups})"),
        ("KV pool resizes", f"{s.pool_resizes} ({sim.num_slots} slots; stores {stores})"),
        ("graph captures", s.captures),
        ("plans differing from plan_reference", s.plan_mismatches),
        ("stores differing from reference stores", checked_stores),
        ("plan status flags", _flag_names(s.plan_flags)),
        ("store status flags", _flag_names(s.canary_flags)),
        ("violations", len(sim.seen)),
        ("violations outside injected requests", len(unexplained)),
    ]
    for key, value in rows:
        table.add_row(key, str(value))
    console.print()
    console.print(table)
    console.print(_timing_line(sim))

    failures = []
    if s.plan_mismatches:
        failures.append(f"{s.plan_mismatches} plan(s) differ from plan_reference")
    if s.store_mismatches:
        failures.append(f"{s.store_mismatches} store check(s) differ from the references")
    if s.plan_flags or s.canary_flags:
        failures.append("a status word is not OK")
    if injecting:
        _print_injections(sim, console)
        missed = [
            k.value
            for k in Corruption
            if not any(inj.kind is k and inj.caught for inj in sim.injections)
        ]
        if missed:
            failures.append(f"not caught: {', '.join(missed)}")
        if unexplained:
            failures.append(
                f"{len(unexplained)} violation(s) outside the injected requests, "
                f"first: {unexplained[0].violation}"
            )
    elif sim.seen:
        failures.append(
            f"{len(sim.seen)} violation(s) in a clean run, first: {sim.seen[0].violation}"
        )
    if failures:
        console.print("result: FAILED: " + "; ".join(failures))
        return 1
    if injecting:
        console.print(
            f"result: OK: all {len(Corruption)} injected kinds caught, "
            f"{len(sim.seen)} violations, all in the injected requests"
        )
    else:
        console.print("result: OK: 0 violations, every plan equal to plan_reference")
    return 0


def _print_injections(sim: Simulation, console: Console) -> None:
    """Per kind: where it was injected, what caught it (and the bits it had to carry),
    then the first violation of each kind, decoded."""
    table = Table(box=box.SIMPLE_HEAD, title="injected corruption", title_justify="left")
    for name in ("kind", "injected", "caught", "expected bits"):
        table.add_column(name)
    firsts = []
    for kind in Corruption:
        done = [inj for inj in sim.injections if inj.kind is kind]
        if not done:
            table.add_row(
                kind.value, "no (no request could take it)", "-", _flag_names(kind.expected_bits)
            )
            continue
        inj = done[0]
        caught = f"step {inj.caught_step}, {inj.caught_by}" if inj.caught else "NO"
        table.add_row(kind.value, f"step {inj.step}", caught, _flag_names(kind.expected_bits))
        if inj.first is not None:
            firsts.append(f"  {kind.value}: {inj.first}")
    console.print(table)
    console.print("first violation of each kind (decoded):")
    for line in firsts:
        console.print(line)


def _flag_names(flags: enum.IntFlag) -> str:
    names = [b.name or "" for b in type(flags) if b and b in flags]
    return "|".join(names) if names else "OK"


def _timing_line(sim: Simulation) -> str:
    us = sim.stats.step_us
    post = "write + TAIL verify" if sim.config.tail else "write"
    if sim.config.graphs:
        what = (
            f"GPU time of one step's graph replays (pre: plan + HEAD verify; post: "
            f"{post}; both groups)"
        )
    else:
        what = (
            f"host time of one eager step's canary launches (plan + HEAD verify + {post}; "
            "both groups)"
        )
    left_out = f"{sim.stats.untimed_steps} warm-up, capture or resize step(s) left out"
    if not us:
        return f"timing: {what}: no step left to time ({left_out}); run more --steps"
    p90 = statistics.quantiles(us, n=10, method="inclusive")[-1] if len(us) > 1 else us[0]
    return (
        f"timing: {what}: min {_fmt(min(us))}, median {_fmt(statistics.median(us))}, "
        f"p90 {_fmt(p90)} over {len(us)} step{'' if len(us) == 1 else 's'} ({left_out})"
    )


def _fmt(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} us"

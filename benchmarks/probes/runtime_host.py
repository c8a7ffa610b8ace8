"""Where does the canary runtime's own host time go in a transformers continuous-batching
step, with the launches taken out?

    python -m benchmarks.probes.runtime_host                      # CPU: launches as no-ops
    python -m benchmarks.probes.runtime_host --stages validate    # + the launchers' checks
    python -m benchmarks.probes.runtime_host --profile 20         # + cProfile's top 20
    python -m benchmarks.probes.runtime_host --phases             # + host us per phase
    python -m benchmarks.probes.runtime_host --device cuda --stages kernels
    python -m benchmarks.probes.runtime_host --split-write on     # the chain and the stamp
    python -m benchmarks.probes.runtime_host --thrash 64          # caches evicted as in an engine
    python -m benchmarks.probes.runtime_host --device-tables      # the CUDA path's table load

A simulated transformers CB workload (no engine, no model): ``--requests`` prompts of
``--prompt`` tokens generating ``--generate`` each, scheduled as transformers' scheduler
does (every decoding request one token, then prefill chunks up to ``--max-batch-tokens``),
blocks of ``--page-size`` slots from a free list (block 0 real, as in transformers 5.17).
Each step hands ``CanaryRuntime`` what the adapter hands it (``kv_canary_engines.
transformers``): rows with the requests' token lists, ``TokenSlots`` of every position the
rows attend to (``read_index``), the write slots, input ids and positions, one KV group
with two real-KV sources (layers 0 and the last, PARTIAL), HEAD + TAIL, verify every
step, poll every ``--poll-every``. The step's inputs are built before the clock starts:
only ``begin_step`` and ``end_step`` are timed (``perf_counter``; on CUDA a sync after
each step, outside the clock).

``--stages``: ``noop`` (default) replaces the three launchers by counters, so what is left
is the runtime's own Python and torch work; ``validate`` runs the launchers' host-side
validation (``validate_*_args``) but launches nothing; ``reference`` the torch references
(slow); ``kernels`` the Triton launchers (CUDA, or the interpreter). Per step kind
(``prefill``: some row writes more than one token; ``decode``), medians of host us of
``begin_step`` and ``end_step``, poll steps apart, and per step the torch calls the runtime
made (``TorchFunctionMode``), how many built a tensor from a Python list, how many moved
data to another device, how many read a value back to the host (``.item()``,
``.tolist()``, ``bool()`` of a tensor...).

``--module`` loads the runtime from another copy of the package (for example an older
revision's ``kv_canary_engines`` copied under another name on ``sys.path``) so that two
versions are measured in one run: ``--module kv_canary_engines,old_engines``.

Last answer (CPU, this project's 2-core development machine shared with other jobs,
2026-12-01 21:15 UTC, torch 2.13.0+cpu, one thread; medians of 5 interleaved runs each,
against a copy of the runtime before the one-copy staging (4e5a91e) loaded with
``--module kv_canary_engines,old_engines``). Host us of ``begin_step + end_step``, the
launches as counters (``noop``):

=======================  ===========  ===========  ===============  ================
step                     before (us)  now (us)     kernel ops       torch calls
=======================  ===========  ===========  ===============  ================
prefill 22 rows / 2048   631          220          14 -> 4          239 -> 42
decode 32 rows           299          165          13 -> 4          48 -> 42
decode 13 rows           170          125          13 -> 4          48 -> 42
=======================  ===========  ===========  ===============  ================

(decode 13 rows: ``--requests 13``, where the prefill steps have 12 rows: 911 -> 216.)
Today's tree on the same CPU makes 40 torch calls and 5 kernel ops a decode step (the
kept staging buffer's ``copy_`` counts as one; 2026-12-02).

As inside an engine (``--thrash 64 --device-tables --stages validate --timing``: the
caches evicted before each step, the CUDA path's table load; development CPU,
2026-12-02, 3 interleaved runs, against 29a5199's runtime as ``old_engines``): a decode
step 599 to 625 us against 859 to 908 (699 to 755 at 28f7090, before a decode step's
arrays were staged from the rows' lists), where the same run without ``--thrash`` reads
about 130 to 200 us. (29a5199's runtime has no table load: there it builds its
per-token index and runs the scatter's compute on this CPU, which on CUDA is one op, so
that comparison overstates the gain; the one between two trees that both load tables,
699-755 against 599-625, does not.) The eviction alone multiplies the runtime's host time by 5 to 6,
about what the H200's engine runs show against the runtime alone; so a host-time cut
can be tried here before it costs device time (CUDA's own calls are not in it: the
tensors are the CPU's).
With the launchers' validation and ``timing=True`` (``--stages validate --timing``):
prefill 757 -> 276, decode 341 -> 206. "kernel ops" are the ATen ops that launch a kernel
on a GPU besides the launches; before, three more were pageable host-to-device copies of
``torch.tensor(list)``, now one pinned copy. The rest of a step on this CPU is the row
pass in Python, numpy over the step's tokens, and the scatters' own CPU compute (about a
third of a decode step here; on a GPU a kernel each). docs/engines/runtime.md, "Host time
per step", says what a step does.

On the H200 (cce3276, ``--device cuda --stages kernels --requests 13 --timing
--split-write on --module kv_canary_engines,old_engines``, e4f4262's runtime as
``old_engines``, 3 interleaved runs each): a decode step 1,069 -> 990 us, a prefill step
1,357 -> 1,211 (the stream and event calls by the device's index). With ``--stages
validate``: 463 and 743 us, about three times the development CPU's figures.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import inspect
import io
import pstats
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.harness import fmt, markdown_table


# --- the simulated workload ----------------------------------------------------------------
@attrs.define(eq=False)
class _Req:
    id: str
    prompt: list[int]
    generated: list[int] = attrs.Factory(list)
    done: int = 0  # positions whose KV is written
    blocks: list[int] = attrs.Factory(list)


@attrs.frozen
class StepInputs:
    """One step as the adapter would see it: per row (id, P, E, prompt, generated), and
    the step's tensors."""

    rows: tuple[tuple[str, int, int, list[int], list[int]], ...]
    read: torch.Tensor
    write: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    finished: tuple[str, ...]

    @property
    def kind(self) -> str:
        return "prefill" if any(e > 1 for _, _, e, _, _ in self.rows) else "decode"


def workload(args: argparse.Namespace, device: torch.device) -> list[StepInputs]:
    """Every step of the simulated run, tensors on ``device``."""
    gen = torch.Generator().manual_seed(0)
    reqs = [
        _Req(f"req_{i}", torch.randint(1, 32000, (args.prompt,), generator=gen).tolist())
        for i in range(args.requests)
    ]
    page = args.page_size
    free = list(range(args.requests * -(-(args.prompt + args.generate) // page) + 8))[::-1]
    running = list(reqs)
    steps = []
    while running:
        budget = args.max_batch_tokens
        batch: list[tuple[_Req, int]] = []
        for r in running:  # decoding requests first, one token each
            if r.done >= len(r.prompt) and budget:
                batch.append((r, 1))
                budget -= 1
        for r in running:  # then prefill chunks
            if r.done < len(r.prompt) and budget:
                e = min(budget, len(r.prompt) - r.done)
                batch.append((r, e))
                budget -= e
        rows, read, write, ids, pos = [], [], [], [], []
        for r, e in batch:
            while len(r.blocks) * page < r.done + e:
                r.blocks.append(free.pop())
            slots = [r.blocks[p // page] * page + p % page for p in range(r.done + e)]
            tokens = r.prompt + r.generated
            rows.append((r.id, r.done, e, r.prompt, list(r.generated)))
            read += slots
            write += slots[r.done :]
            ids += tokens[r.done : r.done + e]
            pos += range(r.done, r.done + e)
        finished = []
        for r, e in batch:
            r.done += e
            if r.done >= len(r.prompt):
                r.generated.append(int(torch.randint(1, 32000, (1,), generator=gen)))
            if len(r.generated) >= args.generate:
                running.remove(r)
                free += r.blocks
                finished.append(r.id)

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        # input_ids and positions as transformers gives them: int32 rows of one tensor
        inputs = torch.tensor([ids, pos], dtype=torch.int32, device=device)
        steps.append(
            StepInputs(tuple(rows), t(read), t(write), inputs[0], inputs[1], tuple(finished))
        )
    return steps


# --- counting what the runtime does ----------------------------------------------------------
_SYNCS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu"}


class OpCounter(TorchFunctionMode):
    """Counts the torch calls made inside it by name, the tensors built from Python data
    (``torch.tensor``), the moves to another device (``.to`` / ``.copy_`` across devices,
    ``non_blocking`` or not) and the reads back to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.from_python = 0
        self.moves = 0
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        self.calls[name] += 1
        if func is torch.tensor or func is torch.as_tensor:
            self.from_python += 1
        elif name in ("to", "copy_", "cuda"):
            src = args[0] if args else None
            dst = args[1] if name == "copy_" and len(args) > 1 else None
            target = dst.device if isinstance(dst, torch.Tensor) else _target(args[1:], kwargs)
            if isinstance(src, torch.Tensor) and target is not None and target != src.device:
                self.moves += 1
        elif name in _SYNCS:
            self.reads += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.calls.values())


class KernelCounter(TorchDispatchMode):
    """Counts the ATen ops that ran inside it: those that would launch a kernel on a GPU
    (neither a view nor an allocation), the allocations, and the reads of a value back to
    the host (``_local_scalar_dense``: ``.item()``, ``int(t)``, ``bool(t)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels: Counter[str] = Counter()
        self.allocations = 0
        self.scalars = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func.overloadpacket.__name__)
        if name == "_local_scalar_dense":
            self.scalars += 1
        elif name.startswith("empty"):
            self.allocations += 1
        elif not func.is_view:
            self.kernels[name] += 1
        return func(*args, **(kwargs or {}))


def _target(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.device | None:
    for a in (*args, kwargs.get("device")):
        if isinstance(a, torch.device):
            return a
        if isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda", "meta"):
            return torch.device(a)
    return None


# --- the stages --------------------------------------------------------------------------
class Stages:
    """Stand-ins for the runtime's plan, write and verify stages (and the split write's
    chain and stamp: ``validate`` runs their checks and records the chain and the stamp
    on the workspace, host state only, as the launchers do)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls: Counter[str] = Counter()

    def install(self, runtime: Any) -> None:
        if self.mode in ("reference", "kernels"):
            return
        stages = runtime.stages
        if self.mode == "validate":
            from kv_canary_buffers.plan import validate_plan_args
            from kv_canary_buffers.tables import (
                validate_load_token_slots_args,
                validate_step_parts,
            )
            from kv_canary_buffers.verify import validate_verify_args
            from kv_canary_buffers.write import (
                record_chain,
                record_stamp,
                validate_write_args,
                validate_write_chain_args,
                validate_write_pair_args,
                validate_write_stamp_args,
            )

            plan, write, verify = validate_plan_args, validate_write_args, validate_verify_args
            write_pair = validate_write_pair_args

            def load_slots(table: Any, slots: Any, rows: Any, starts: Any, **k: Any) -> None:
                validate_load_token_slots_args(table, slots, rows, starts, k.pop("max_len"))
                parts = ("pool", "pool_index", "pool_tokens", "input_ids", "positions", "wide")
                validate_step_parts(table.device, *(k.get(name) for name in parts))

            def chain(store: Any, buffers: Any, workspace: Any, **k: Any) -> None:
                record_chain(
                    store, buffers, validate_write_chain_args(store, buffers, workspace, **k)
                )

            def stamp(store: Any, buffers: Any, workspace: Any, **k: Any) -> None:
                validate_write_stamp_args(store, buffers, workspace, **k)
                record_stamp(workspace)

        else:

            def plan(*_a: Any, **_k: Any) -> None:
                return None

            write = verify = chain = stamp = load_slots = write_pair = plan

        has_load = hasattr(stages, "load_slots")  # (a runtime before the table load: none)
        has_pair = hasattr(stages, "write_pair")  # (nor before the pair write)

        def counted(name: str, fn: Any) -> Any:
            def call(*a: Any, **k: Any) -> None:
                self.calls[name] += 1
                fn(*a, **k)

            return call

        runtime.stages = attrs.evolve(
            stages,
            plan=counted("plan", plan),
            write=counted("write", write),
            verify=counted("verify", verify),
            chain=counted("chain", chain),
            stamp=counted("stamp", stamp),
            **({"load_slots": counted("load_slots", load_slots)} if has_load else {}),
            **({"write_pair": counted("write_pair", write_pair)} if has_pair else {}),
        )


# --- an engine's forward, as the caches see it --------------------------------------------
class Thrasher:
    """Between two steps, outside the clock, what an engine's forward does to the host's
    caches: a pass over ``mib`` MiB of memory (one byte a cache line) and a walk over
    20,000 Python objects picked at random. Inside an engine the runtime's host time is
    several times what it is alone (H200, transformers 5.17: the staging 185 us in an
    engine run against 39 alone, in two device calls), because the forward evicts its
    code and data between steps; this puts the same in front of each step of the
    simulated run (``--thrash 64``: a decode step's host time 5 to 6 times that without,
    on the development CPU)."""

    def __init__(self, mib: int, seed: int = 0) -> None:
        self._bytes = bytearray(mib << 20)
        self._objects = [{"i": i, "s": str(i)} for i in range(200_000)]
        self._random = random.Random(seed)

    def __call__(self) -> None:
        data = self._bytes
        for i in range(0, len(data), 64):
            data[i] ^= 1
        total = 0
        for obj in self._random.sample(self._objects, 20_000):
            total += obj["i"]


# --- one run ---------------------------------------------------------------------------------
SPLIT_WRITE = {"auto": None, "on": True, "off": False}
"""``--split-write``'s values: ``CanaryConfig(split_write=...)``."""


def _split_write(eng: Any, args: argparse.Namespace) -> dict[str, Any]:
    """``split_write`` for ``eng``'s config (none for a runtime that predates it)."""
    if "split_write" not in attrs.fields_dict(eng.CanaryConfig):
        return {}
    return {"split_write": SPLIT_WRITE[args.split_write]}


@attrs.define
class StepTimes:
    kind: str
    rows: int
    tokens: int
    begin_us: float
    end_us: float
    polled: bool
    ops: int = 0
    from_python: int = 0
    moves: int = 0
    reads: int = 0
    kernels: int = 0
    allocations: int = 0


def run(
    module: str,
    steps: list[StepInputs],
    args: argparse.Namespace,
    device: torch.device,
    *,
    count: bool = False,
    profile: bool = False,
) -> tuple[list[StepTimes], Stages, cProfile.Profile | None]:
    """The workload through ``module``'s runtime; per step its times and, with ``count``,
    its counts (the counting modes slow a step down: time without them)."""
    eng = importlib.import_module(module)
    tx = importlib.import_module(f"{module}.transformers")
    from kv_canary_buffers import RealKVMode

    page = args.page_size
    blocks = max(int(s.read.max()) for s in steps) // page + 2
    kv = [torch.zeros(blocks, page * 64, dtype=torch.bfloat16, device=device) for _ in range(4)]
    config = eng.CanaryConfig(
        real_kv=RealKVMode.PARTIAL,
        tail=True,
        stages="reference" if args.stages in ("noop", "validate", "reference") else "kernels",
        verify_every=1,
        poll_every=args.poll_every,
        timing=args.timing,
        **_split_write(eng, args),
    )
    # block 0 holds real tokens (transformers 5.17): as the adapter declares it, where the
    # runtime knows the flag (else the kernels raise PADDING_SLOT_WRITTEN every step)
    real_slot0 = "slot0_real" in inspect.signature(eng.KVGroup).parameters
    group = eng.KVGroup(
        name="full_attention",
        num_slots=blocks * page,
        page_size=page,
        real_kv_sources=tuple(kv),
        real_kv_bytes_per_token=128,
        **({"slot0_real": True} if real_slot0 else {}),
    )
    sized = "expected_requests" in inspect.signature(eng.CanaryRuntime).parameters
    extra = {"expected_requests": args.requests} if sized else {}  # as the adapter passes it
    runtime = eng.CanaryRuntime(config, [group], device=device, **extra)
    if getattr(args, "device_tables", False) and hasattr(runtime, "load_tables_on_device"):
        runtime.load_tables_on_device = True  # the CUDA path's table load, off CUDA
    stages = Stages(args.stages)
    stages.install(runtime)
    out: list[StepTimes] = []
    profiler = cProfile.Profile() if profile else None
    thrash = Thrasher(args.thrash) if getattr(args, "thrash", 0) else None
    for step in steps:
        if thrash is not None:
            thrash()
        counter = OpCounter() if count else None
        aten = KernelCounter() if count else None
        rows = [
            eng.Row(request_id=rid, prefix_len=p, extend_len=e, tokens=tx._Tokens(a, b))
            for rid, p, e, a, b in step.rows
        ]
        batch = eng.StepBatch(
            rows=rows,
            tables={"full_attention": eng.TokenSlots(slots=step.read)},
            out_cache_loc={"full_attention": step.write},
            input_ids=step.input_ids,
            positions=step.positions,
        )
        polled = runtime.step % args.poll_every == args.poll_every - 1
        if profiler is not None:
            profiler.enable()
        if counter is not None and aten is not None:
            counter.__enter__()
            aten.__enter__()
        t0 = time.perf_counter()
        runtime.begin_step(batch)
        t1 = time.perf_counter()
        runtime.end_step()
        t2 = time.perf_counter()
        if counter is not None and aten is not None:
            aten.__exit__(None, None, None)
            counter.__exit__(None, None, None)
        if profiler is not None:
            profiler.disable()
        if device.type == "cuda":
            torch.cuda.synchronize()
        for rid in step.finished:
            runtime.release(rid)
        times = StepTimes(
            step.kind,
            len(rows),
            sum(r.extend_len for r in rows),
            1e6 * (t1 - t0),
            1e6 * (t2 - t1),
            polled,
        )
        if counter is not None and aten is not None:
            times.ops, times.from_python = counter.total, counter.from_python
            times.moves, times.reads = counter.moves, counter.reads + aten.scalars
            times.kernels, times.allocations = sum(aten.kernels.values()), aten.allocations
        out.append(times)
    return out, stages, profiler


def summarize(module: str, times: list[StepTimes], warm: int) -> list[list[str]]:
    rows = []
    for kind in ("prefill", "decode"):
        for polled in (False, True):
            sel = [t for t in times[warm:] if t.kind == kind and t.polled == polled]
            if not sel:
                continue

            def med(values: list[float]) -> float:
                return statistics.median(values)

            rows.append(
                [
                    module,
                    kind + (" + poll" if polled else ""),
                    str(len(sel)),
                    f"{med([t.rows for t in sel]):g}",
                    f"{med([t.tokens for t in sel]):g}",
                    fmt(med([t.begin_us for t in sel])),
                    fmt(med([t.end_us for t in sel])),
                    fmt(med([t.begin_us + t.end_us for t in sel])),
                    f"{med([t.ops for t in sel]):g}",
                    f"{med([t.kernels for t in sel]):g}",
                    f"{med([t.allocations for t in sel]):g}",
                    f"{max(t.from_python for t in sel)}",
                    f"{max(t.moves for t in sel)}",
                    f"{max(t.reads for t in sel)}",
                ]
            )
    return rows


HEADERS = [
    "runtime",
    "kind",
    "steps",
    "rows",
    "tokens",
    "begin_step us",
    "end_step us",
    "total us",
    "torch calls",
    "kernel ops",
    "allocations",
    "from lists (max)",
    "device moves (max)",
    "host reads (max)",
]


def _mib(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 MiB, got {value}")
    return value


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--module", default="kv_canary_engines", help="comma-separated")
    parser.add_argument(
        "--stages", default="noop", choices=("noop", "validate", "reference", "kernels")
    )
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--generate", type=int, default=64)
    parser.add_argument("--max-batch-tokens", type=int, default=2048)
    parser.add_argument("--page-size", type=int, default=256)
    parser.add_argument("--poll-every", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="runs per module, interleaved")
    parser.add_argument("--timing", action="store_true", help="CanaryConfig(timing=True)")
    parser.add_argument(
        "--split-write",
        default="auto",
        choices=tuple(SPLIT_WRITE),
        help="CanaryConfig(split_write=None, True, False): auto is the runtime's default",
    )
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N")
    parser.add_argument(
        "--phases", action="store_true", help="one more run, each phase timed (probes.phases)"
    )
    parser.add_argument("--no-count", dest="count", action="store_false")
    parser.add_argument(
        "--device-tables",
        action="store_true",
        help="TokenSlots loaded from the rows' starts, as on CUDA (load_tables_on_device)",
    )
    parser.add_argument(
        "--thrash",
        type=_mib,
        default=0,
        metavar="MIB",
        help="before each step, evict the caches as an engine's forward would (Thrasher)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch's CPU threads (1: an op's host cost, not a parallel region's wake-up)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    modules = [m.strip() for m in args.module.split(",") if m.strip()]
    steps = workload(args, device)
    kinds = Counter(s.kind for s in steps)
    print(
        f"runtime_host: {device}, torch {torch.__version__}; {args.requests} requests x "
        f"{args.prompt} + {args.generate}, max batch tokens {args.max_batch_tokens}, page "
        f"{args.page_size}: {len(steps)} steps ({kinds['prefill']} prefill, "
        f"{kinds['decode']} decode); stages {args.stages}; HEAD + TAIL, PARTIAL 2 sources, "
        f"verify every step, poll every {args.poll_every}; timing={args.timing}"
        + (f"; caches thrashed before each step ({args.thrash} MiB)" if args.thrash else "")
    )
    table: list[list[str]] = []
    results: dict[str, list[StepTimes]] = {m: [] for m in modules}
    for _ in range(args.repeat):  # interleaved: both versions see the same machine state
        for m in modules:
            times, stages, _ = run(m, steps, args, device)
            results[m] += times[1:]  # the first step builds the runtime's buffers
    for m in modules:
        if args.count:  # one more run, counted: the same steps, in the same order
            counted, stages, _ = run(m, steps, args, device, count=True)
            for t, c in zip(results[m], counted[1:] * args.repeat):
                t.ops, t.from_python, t.moves, t.reads = c.ops, c.from_python, c.moves, c.reads
                t.kernels, t.allocations = c.kernels, c.allocations
        table += summarize(m, results[m], 0)
    print(markdown_table(HEADERS, table))
    if args.device_tables:  # a runtime before the table load scatters per token instead
        for m in modules:
            has = hasattr(importlib.import_module(m).CanaryRuntime, "_table_index")
            print(
                f"{m}: --device-tables "
                + (
                    "applied"
                    if has
                    else "not applied (it has no table load: its per-token index and "
                    "scatter run, the scatter's compute on this CPU included)"
                )
            )
    if args.stages in ("noop", "validate"):
        print(f"stage calls over one run: {dict(stages.calls)}")
    if args.phases:
        from benchmarks.phases import Phases

        phases = Phases(modules[0])
        try:
            run(modules[0], steps, args, device)
        finally:
            phases.remove()
        print(f"host time per phase of {modules[0]} (one more run):")
        print(phases.table())
    if args.profile:
        _, _, profiler = run(modules[0], steps, args, device, profile=True)
        assert profiler is not None
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.profile)
        print(f"cProfile of {modules[0]}'s begin_step + end_step, by own time:")
        print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())

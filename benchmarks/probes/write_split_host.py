"""What does the split write cost on the host per eager call, the launch itself stubbed,
and did a change make it cheaper?

    python -m benchmarks.probes.write_split_host [--baseline REV] [--rounds 9] [--calls 2000]

Host time of ``launch_write``, ``launch_write_chain`` and a chain followed by its
``launch_write_stamp`` (a stamp needs a chain before it: the stamp's own time is the
difference), everything the launchers do on the host but the launch itself: the compiled
launch is a stand-in that returns at once (``Launcher.launch`` returns a no-op launch, as
tests/launch/test_fast_launch_split.py's recording stand-in does, with the fast path on
as on a GPU). So it runs on the CPU, without the interpreter; what the stand-in leaves
out (Triton's C launcher turning each tensor argument into an address, which the fast
path avoids: about 0.25 us a tensor on the H200's host) makes the full path's figures
here lower than on a GPU.

Cases: the write cases of ``benchmarks.probes.write_split`` (decode 4096 x 1, mixed
prefill 16 x 2048, long prefill 1 x 8192), real-KV NONE and PARTIAL (K and V of one
layer, 256 bytes a token), no expected inputs; plan buffers of ``rows`` rows, a store of
65536 slots, one workspace. Host time needs no filled plan: no kernel runs.

``--baseline REV``: also time the ``kv_canary_buffers`` and ``kv_canary_kernels`` of git
revision ``REV`` (``git archive``), each tree in processes of its own (a package and its
validation together), the trees alternating process by process so that drift of a noisy
CPU hits both alike; medians over every batch of every process.

Last answer (this project's 2-core CPU machine, 2026-12-01 21:53 UTC, ``--baseline
d3d2464``, defaults, medians in us, the three cases alike within 0.1 us): the chain
26.5 to 26.9 -> 6.0 to 6.1 (its fast path), the stamp 4.2 to 4.7 -> 3.6 to 3.7 (NONE) and
6.1 to 6.2 -> 5.2 (PARTIAL), ``launch_write`` 4.5 and 6.1 (unchanged). Not yet measured
on the H200 (``benchmarks.probes.write_split`` times it there, unstubbed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CASES = (("decode 4096 x 1", 4096, 1), ("mixed prefill 16 x 2048", 16, 2048),
         ("long prefill 1 x 8192", 1, 8192))  # fmt: skip
MODES = ("NONE", "PARTIAL")
NUM_SLOTS = 1 << 16


def worker(calls: int, rounds: int) -> dict[str, list[float]]:
    """In a process whose ``sys.path`` starts with the tree to time: per ``"case|mode|
    variant"`` the us per call of each batch."""
    import torch

    from kv_canary_buffers import CanaryStore, PlanBuffers, RealKV, RealKVMode, WriteWorkspace
    from kv_canary_kernels import fast_launch, launch_write, launch_write_chain, launch_write_stamp
    from kv_canary_kernels import write as write_module
    from kv_canary_kernels import write_split as split_module

    def no_launch(programs: int, stream: int, *args: object) -> None:
        return None

    def full_launch(self, device, grid, key, args, constexprs, options):
        return no_launch

    fast_launch.Launcher.launch = full_launch  # type: ignore[method-assign]
    fast_launch.FAST_PATH = True
    for module in (fast_launch, write_module, split_module):
        if hasattr(module, "current_device"):
            module.current_device = lambda: None  # a CPU device's index
        if hasattr(module, "stream_of"):
            module.stream_of = lambda index: 0
    store = CanaryStore.allocate(num_slots=NUM_SLOTS, violation_capacity=64, device="cpu")
    sources = tuple(torch.zeros(NUM_SLOTS, 128, dtype=torch.bfloat16) for _ in range(2))
    kv = RealKV(mode=RealKVMode.PARTIAL, sources=sources, page_size=1, bytes_per_token=256)
    ws = WriteWorkspace.for_store(store, token_capacity=max(r * t for _, r, t in CASES))
    out: dict[str, list[float]] = {}
    for name, rows, tokens in CASES:
        plan = PlanBuffers.allocate(write_req_capacity=rows, verify_capacity=64, device="cpu")
        n = rows * tokens
        t = torch.arange(n)
        step = dict(input_ids=t, positions=t + 1, out_cache_loc=t % (NUM_SLOTS - 1) + 1)
        for mode in MODES:
            real_kv = kv if mode == "PARTIAL" else None

            def write(plan=plan, step=step, real_kv=real_kv) -> None:
                launch_write(store, plan, real_kv=real_kv, **step)

            def chain(plan=plan, step=step) -> None:
                launch_write_chain(store, plan, ws, **step)

            def pair(plan=plan, step=step, real_kv=real_kv) -> None:
                launch_write_chain(store, plan, ws, **step)
                launch_write_stamp(store, plan, ws, real_kv=real_kv)

            variants = {"write": write, "chain": chain, "pair": pair}
            for fn in variants.values():
                fn()  # the first call of each takes the full path and fills the caches
            for _ in range(rounds):  # interleaved: drift hits every variant alike
                for label, fn in variants.items():
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    us = (time.perf_counter() - t0) / calls * 1e6
                    out.setdefault(f"{name}|{mode}|{label}", []).append(us)
    return out


def export(rev: str, into: Path) -> Path:
    """``rev``'s two packages in ``into`` (a tree of its own, first on the worker's path)."""
    data = subprocess.run(
        ["git", "archive", rev, "kv_canary_buffers", "kv_canary_kernels"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def run_worker(tree: Path, calls: int, rounds: int) -> dict[str, list[float]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import json, sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
        "import kv_canary_buffers, kv_canary_kernels\n"
        "assert kv_canary_kernels.__file__.startswith(sys.argv[1]), kv_canary_kernels.__file__\n"
        "assert kv_canary_buffers.__file__.startswith(sys.argv[1]), kv_canary_buffers.__file__\n"
        "from benchmarks.probes.write_split_host import worker\n"
        "print(json.dumps(worker(int(sys.argv[3]), int(sys.argv[4]))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tree), str(ROOT), str(calls), str(rounds)],
        cwd=tempfile.gettempdir(),
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the worker for {tree} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", default=None, help="a git revision to time beside")
    parser.add_argument("--processes", type=int, default=3, help="processes per tree")
    parser.add_argument("--rounds", type=int, default=5, help="batches per process")
    parser.add_argument("--calls", type=int, default=2000, help="calls per batch")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"now": ROOT}
        if args.baseline:
            trees = {"base": export(args.baseline, Path(tmp)), **trees}
        pooled: dict[str, dict[str, list[float]]] = {tag: {} for tag in trees}
        for _ in range(args.processes):
            for tag, tree in trees.items():
                for key, batches in run_worker(tree, args.calls, args.rounds).items():
                    pooled[tag].setdefault(key, []).extend(batches)
    med = {tag: {k: statistics.median(v) for k, v in got.items()} for tag, got in pooled.items()}
    print(
        f"host us per eager call, launch stubbed (CPU; {args.processes} processes x "
        f"{args.rounds} batches x {args.calls} calls per tree, medians of batches); "
        f"baseline {args.baseline or '-'}"
    )
    cols = ("write", "chain", "pair", "stamp")
    header = "| case | real-KV |" + "".join(f" {tag} {c} |" for c in cols for tag in trees)
    print(header)
    print("|" + "---|" * (2 + len(cols) * len(trees)))
    for name, _, _ in CASES:
        for mode in MODES:
            row = f"| {name} | {mode} |"
            for c in cols:
                for tag in trees:
                    m = med[tag]
                    if c == "stamp":
                        us = m[f"{name}|{mode}|pair"] - m[f"{name}|{mode}|chain"]
                    else:
                        us = m[f"{name}|{mode}|{c}"]
                    row += f" {us:.2f} |"
            print(row)
    return 0


if __name__ == "__main__":
    from benchmarks.harness import logged

    with logged(Path(__file__).stem):
        raise SystemExit(main())

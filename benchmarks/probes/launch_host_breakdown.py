"""Where does the host time of an eager launch go?

    python -m benchmarks.probes.launch_host_breakdown

For launch_plan / launch_verify / launch_write on decode cases (64, 256 and 4096 rows; needs
CUDA): the validated launcher, validation alone, dispatch alone, then the recorded kernel
launches replayed as
 A. kernel.run(..., tensors)             (what the launcher did before its fast path)
 B. kernel.run(..., ints for tensors)    (no data_ptr call, no cuPointerGetAttribute)
 C. kernel.run.launch(..., ints)         (the C launcher directly)
plus micro costs. Host us per call: batches of calls timed with perf_counter, a sync
after each batch, median of batches. On revisions since the launchers' fast path
(docs/performance.md, 2026-11-30, "fourth part") the validated launcher and dispatch rows
time the fast path; the replays still replay the recorded full-path launches and compare
A, B and C.

Last answer (H200, 2026-11-30 18:30 UTC, 998a801's launchers, bs=256, us): ``launch_verify``
NONE 26.8 = validation 7.7 + dispatch 18.0, of which the launch replayed with tensors 8.7,
with ints 5.8, through the C launcher 5.0 (``launch_plan`` 38.5: 12.9 + 18.1; 8.4 / 5.6 /
4.5): half of a dispatch was the Python that assembled the launch and a third of the
launch Triton turning tensors into addresses, which led to the fast path.
Raw, in the tag ``benchmark-results-2026-12-01``:
``benchmarks/results/h200-probe-host-launch-20261130T1830.txt``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

import kv_canary_kernels.fast_launch as L
from benchmarks.canary_cases import GPU_SIZES, World
from benchmarks.harness import logged
from kv_canary_buffers.plan import validate_plan_args
from kv_canary_buffers.verify import validate_verify_args
from kv_canary_buffers.write import validate_write_args
from kv_canary_kernels import launch_plan, launch_verify, launch_write
from kv_canary_kernels.plan import dispatch_plan
from kv_canary_kernels.verify import dispatch_verify
from kv_canary_kernels.write import dispatch_write

RECORDED: list = []
_orig = L.Launcher._launch


def _rec(self, index, grid, key, args, constexprs, options):
    go = _orig(self, index, grid, key, args, constexprs, options)
    RECORDED.append((self, index, grid, key, tuple(args), dict(constexprs)))
    return go


def host_us(fn, calls=300, batches=9):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        out.append((t1 - t0) / calls * 1e6)
    return statistics.median(out), min(out), max(out)


def replays(recorded):
    """Closures replaying the recorded launches three ways."""
    stream = torch.cuda.current_stream().cuda_stream
    kinds = {"A": [], "B": [], "C": []}
    for launcher, index, grid, key, args, constexprs in recorded:
        k = launcher.variants[(index, key)]
        ints = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
        cv = tuple(constexprs.values())
        head = (*grid, stream, k.function, k.packed_metadata, None, None, None)
        kinds["A"].append((k.run, (*head, *args, *cv)))  # tensors
        kinds["B"].append((k.run, (*head, *ints, *cv)))  # addresses
        r = k.run
        ok = (
            getattr(r, "global_scratch_size", 1) == 0 and getattr(r, "profile_scratch_size", 1) == 0
        )
        if ok:
            kinds["C"].append(
                (
                    r.launch,
                    (
                        grid[0],
                        grid[1],
                        grid[2],
                        stream,
                        k.function,
                        r.launch_cooperative_grid,
                        r.launch_pdl,
                        None,
                        None,
                        k.packed_metadata,
                        None,
                        None,
                        None,
                        *ints,
                        *cv,
                    ),
                )
            )
        else:
            print(
                "  scratch/profile size nonzero: C skipped",
                r.global_scratch_size,
                r.profile_scratch_size,
            )
    out = {}
    for name, calls in kinds.items():
        if len(calls) != len(recorded):
            continue
        if len(calls) == 1:
            f, a = calls[0]
            out[name] = lambda f=f, a=a: f(*a)
        else:
            out[name] = lambda calls=calls: [f(*a) for f, a in calls]
        out[name + " n_tensor_args"] = sum(
            isinstance(x, torch.Tensor) for r in recorded for x in r[4]
        )
    return out


def row(what, stats):
    med, lo, hi = stats
    print(f"  {what:<44} {med:7.2f} us  [{lo:.2f} .. {hi:.2f}]", flush=True)


def main():
    torch.cuda.init()
    print(torch.__version__, __import__("triton").__version__, torch.cuda.get_device_name())
    import triton.backends.nvidia.driver as drv  # noqa: F401

    L.Launcher._launch = _rec
    t = torch.zeros(8, device="cuda")
    row("t.data_ptr()", host_us(lambda: t.data_ptr(), calls=2000))
    row("_cuda_getCurrentRawStream(0)", host_us(lambda: L.stream_of(0), calls=2000))
    row("_cuda_getDevice()", host_us(lambda: L.current_device(), calls=2000))
    row("_cuda_isCurrentStreamCapturing()", host_us(lambda: L._capturing(), calls=2000))
    for bs in (64, 256, 4096):
        w = World(bs, GPU_SIZES.prefix, 1, 0, "cuda", seed=bs)
        bufs = w.plan()
        kv = w.sources("PARTIAL", GPU_SIZES, seed=1)
        store = w.new_store(kv)
        cases = {
            "verify NONE": (
                lambda: launch_verify(store, bufs),
                lambda: validate_verify_args(store, bufs),
                lambda a: dispatch_verify(store, bufs, a),
            ),
            "verify PARTIAL": (
                lambda: launch_verify(store, bufs, real_kv=kv),
                lambda: validate_verify_args(store, bufs, real_kv=kv),
                lambda a: dispatch_verify(store, bufs, a),
            ),
            "write": (
                lambda: launch_write(store, bufs, **w.step_inputs),
                lambda: validate_write_args(store, bufs, **w.step_inputs),
                lambda a: dispatch_write(store, bufs, a),
            ),
            "plan": (
                lambda: launch_plan(bufs, **w.plan_kwargs),
                lambda: validate_plan_args(bufs, **w.plan_kwargs),
                lambda a: dispatch_plan(bufs, a),
            ),
        }
        for name, (full, val, disp) in cases.items():
            print(f"bs={bs} {name}", flush=True)
            RECORDED.clear()
            full()
            torch.cuda.synchronize()
            rec = list(RECORDED)
            row("launch (validated)", host_us(full))
            row("validate only", host_us(val))
            a = val()
            row("dispatch only", host_us(lambda: disp(a)))
            if name == "plan" and bs >= 1024:
                continue  # numbered launches: not replayable
            rp = replays(rec)
            print(f"  launches {len(rec)}, tensor args {rp.get('A n_tensor_args')}")
            for k in ("A", "B", "C"):
                if k in rp:
                    row(f"replay {k}", host_us(rp[k]))
            torch.cuda.synchronize()
            # the store must still be clean (replays are equal launches)
        if store.violation_count.item() != 0 or store.status.item() != 0:
            print(
                "  WARNING: violations/status after the probe",
                store.violation_count.item(),
                store.status.item(),
            )
        torch.cuda.empty_cache()


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        main()

"""What does each stage's validation cost on the host, and did a change make it cheaper?

    python -m benchmarks.probes.validation_host [--rounds 25] [--baseline DIR]

Host time of the shared validation of the three stages (``validate_plan_args``,
``validate_verify_args``, ``validate_write_args``): everything a launcher does on the host
besides the bare dispatch. Min and median over rounds of many calls (``timeit``), on the
CPU (no kernel is launched).

``--baseline DIR``: also time the ``kv_canary_buffers`` package found in ``DIR`` (for
example ``git archive <rev> kv_canary_buffers | tar -x -C DIR``), interleaved round by
round with this checkout's, so that drift of a noisy CPU hits both alike. The baseline is
loaded under another module name (its imports are relative); either layout of the
package, before and since the layout by stage (``benchmarks/revisions.py``).

Last answer (this project's 2-core CPU machine, 2026-12-01, ``--rounds 15
--baseline`` c6e2ce1 against the fields as aliases, medians in us): plan 9.7 / 10.1 / 10.0
-> 4.3 / 4.5 / 4.2 (1, 256, 4096 rows); verify NONE / PARTIAL / ALL 7.4 / 7.7 / 7.7 -> 2.7 /
3.0 / 3.0; write 256 x 1 (plain, expected, PARTIAL, both) 7.0 / 7.9 / 8.9 / 9.8 -> 3.3 /
4.1 / 5.2 / 6.0. Raw, in the tag ``benchmark-results-2026-12-01``:
``benchmarks/results/validation-cpu-fieldalias-20261201.log``.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import statistics
import timeit
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from benchmarks.harness import logged
from benchmarks.revisions import load_buffers, validators


def plan_batch(bs: int) -> dict[str, Any]:
    """All rows active, window 128 with its LUT, token pool on (as ``plan_checks_host``)."""
    g = torch.Generator().manual_seed(bs)
    cols = 1032
    rows = bs + 1
    prefix = torch.randint(1, 1024, (bs,), generator=g)
    return dict(
        req_pool_indices=torch.randperm(bs, generator=g) + 1,
        prefix_lens=prefix,
        extend_seq_lens=torch.ones(bs, dtype=torch.int64),
        req_to_token=torch.randperm(rows * cols, generator=g).reshape(rows, cols).to(torch.int32),
        swa_window_size=128,
        full_to_swa_index_mapping=torch.randperm(rows * cols, generator=g),
        req_to_verify_expected_tokens=torch.randint(
            0, 150_000, (rows, cols), generator=g, dtype=torch.int32
        ),
        req_to_verify_expected_tokens_valid_lens=prefix + 1,
    )


def cases(lib: ModuleType) -> dict[str, Callable[[], object]]:
    """The timed calls, built with the package ``lib``."""
    validate_plan, validate_verify, validate_write = validators(lib)
    plan_buffers, store_cls = lib.PlanBuffers, lib.CanaryStore
    real_kv_cls, mode = lib.RealKV, lib.RealKVMode
    out: dict[str, Callable[[], object]] = {}
    for bs in (1, 256, 4096):
        kwargs = plan_batch(bs)
        entries = int(kwargs["prefix_lens"].clamp(max=128).sum())
        bufs = plan_buffers.allocate(write_req_capacity=bs, verify_capacity=entries, device="cpu")
        out[f"plan bs={bs}"] = functools.partial(validate_plan, bufs, **kwargs)
    store = store_cls.allocate(num_slots=1 << 16, violation_capacity=64, device="cpu")
    bufs = plan_buffers.allocate(write_req_capacity=256, verify_capacity=4096, device="cpu")
    sources = tuple(torch.zeros(1 << 16, 128, dtype=torch.bfloat16) for _ in range(2))
    kv = {
        name: real_kv_cls(mode=mode[name], sources=sources, page_size=1, bytes_per_token=256)
        for name in ("NONE", "PARTIAL", "ALL")
    }
    for name, real_kv in kv.items():
        out[f"verify {name}"] = functools.partial(
            validate_verify, store, bufs, launch_tag=7, real_kv=real_kv
        )
    n = 256
    ids = torch.arange(n)
    pos = torch.arange(n) + 100
    loc = torch.arange(n) + 1
    exp_ids, exp_pos = ids.clone(), pos.clone()
    for label, real_kv, expected in (
        ("write 256x1", None, False),
        ("write 256x1 expected", None, True),
        ("write 256x1 PARTIAL", kv["PARTIAL"], False),
        ("write 256x1 expected PARTIAL", kv["PARTIAL"], True),
    ):
        extra = dict(expected_input_ids=exp_ids, expected_positions=exp_pos) if expected else {}
        out[label] = functools.partial(
            validate_write,
            store,
            bufs,
            input_ids=ids,
            positions=pos,
            out_cache_loc=loc,
            launch_tag=7,
            real_kv=real_kv,
            **extra,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--baseline", default=None, help="a directory holding kv_canary_buffers")
    args = parser.parse_args(argv)
    libs = {"now": importlib.import_module("kv_canary_buffers")}
    if args.baseline:
        libs = {"base": load_buffers(args.baseline, "kv_canary_buffers_baseline"), **libs}
    built = {tag: cases(lib) for tag, lib in libs.items()}
    names = list(built["now"])
    times: dict[tuple[str, str], list[float]] = {(t, n): [] for t in libs for n in names}
    for tag in libs:
        for fn in built[tag].values():
            fn()
    for _ in range(args.rounds):  # interleaved: each round times every case of every package
        for name in names:
            for tag in libs:
                t = timeit.timeit(built[tag][name], number=args.calls)
                times[tag, name].append(t / args.calls * 1e6)
    print(f"torch={torch.__version__} rounds={args.rounds} calls={args.calls} (us per call)")
    header = f"{'case':32s}" + "".join(f"{tag + ' min':>10s}{tag + ' med':>10s}" for tag in libs)
    print(header)
    for name in names:
        row = f"{name:32s}"
        for tag in libs:
            ts = times[tag, name]
            row += f"{min(ts):10.2f}{statistics.median(ts):10.2f}"
        print(row)
    return 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())

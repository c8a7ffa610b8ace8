"""What do the verify and write of a decode step cost, GPU and host time, against the
number of real-KV sources, up to every layer's K and V, in modes PARTIAL and ALL?

    python -m benchmarks.probes.real_kv_sources              # CUDA: 4096 rows, 1 to 256 sources
    python -m benchmarks.probes.real_kv_sources --quick      # fewer replays and calls
    python -m benchmarks.probes.real_kv_sources --smoke      # tiny, on the CPU (interpreter)

The cases are ``benchmarks.canary_cases.bench_sources``: a decode step of 4096 rows (the
verify and write cases of ``python -m benchmarks``, SWA off), its ``RealKV`` the first 1,
2, 8, 32, 128 or 256 views of one bf16 pool ``[128 layers, K and V, slots, 64 bytes]``
(69 GB: the probe needs most of an H200), page size 1. GPU time per call: a CUDA graph of
10 calls, the median of replays; host time per eager call against the bare dispatch.
Every store is checked clean (and, in ``--smoke``, equal to the references') around each
timing. Writes ``real_kv_sources-<device>-<UTC time>.csv`` into ``benchmarks/out/``.

Last answer (H200, ``--quick``, 4e5a91e): the verify grows about 54 us a source
in PARTIAL and 80 us in ALL (PARTIAL 117 us with 1 source, 172 with 2, 6,982 with 128,
13,921 with 256; ALL 141, 217, 10,285, 20,586), the write 3.4 to 157 us (PARTIAL) and 4.4
to 444 us (ALL) from 1 to 256 sources; host per eager call 11 to 136 us (verify) and 16 to
249 us (write), the bare dispatch 7 to 20 us: the rest is each source's check. The table
is in docs/performance.md ("Real-KV sources").
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "--smoke" in sys.argv:  # before Triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse
from pathlib import Path

import torch

from benchmarks.canary_cases import GPU_SOURCES, SMOKE_SOURCES, bench_sources
from benchmarks.harness import OUT, Recorder, configure, fmt, logged, markdown_table, utc_stamp


def table(rec: Recorder) -> str:
    """GPU and host time per call of each launcher, by mode and number of sources."""
    rows: dict[tuple[str, str], dict[str, float]] = {}
    for r in rec.rows:
        if r["stage"] != "sources" or r["section"] not in ("gpu_time", "host"):
            continue
        key = (r["real_kv"], r["note"].removeprefix("sources="))
        rows.setdefault(key, {})[f"{r['section']} {r['impl']}"] = r["value"]
    columns = [
        "gpu_time launch_verify",
        "gpu_time launch_write",
        "host launch_verify",
        "host launch_verify:bare_dispatch",
        "host launch_write",
        "host launch_write:bare_dispatch",
    ]
    return markdown_table(
        ["mode", "sources", *columns],
        [[mode, n, *(fmt(v.get(c), 2) for c in columns)] for (mode, n), v in rows.items()],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--quick", action="store_true", help="fewer replays and calls")
    parser.add_argument("--results", type=Path, default=OUT, help="folder of the CSV")
    args = parser.parse_args(argv)
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("real_kv_sources --smoke: needs TRITON_INTERPRET=1 before triton is imported")
            return 1
        configure("cpu", smoke=True)
        sizes, replays, calls, device = SMOKE_SOURCES, 1, 1, "cpu-smoke"
    else:
        if not torch.cuda.is_available():
            print("real_kv_sources: needs CUDA (or --smoke)")
            return 1
        configure("cuda", smoke=False)
        sizes = GPU_SOURCES
        replays, calls = (20, 50) if args.quick else (50, 200)
        device = torch.cuda.get_device_name().replace(" ", "_")
    rec = Recorder(device, args.results / f"real_kv_sources-{device}-{utc_stamp()}.csv")
    try:
        bench_sources(rec, sizes, replays, calls)
    finally:
        rec.close()
    print(table(rec))
    for message in rec.errors:
        print(f"ERROR {message}")
    return 1 if rec.errors else 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())

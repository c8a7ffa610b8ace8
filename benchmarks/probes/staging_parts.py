"""What does a decode step's staging copy cost on the host, part by part, on CUDA?

    python -m benchmarks.probes.staging_parts

``kv_canary_engines.host.to_device`` and ``Staging.stage`` on a 13-row decode step's eight
arrays (and with a 7,800-entry per-token index in place of the rows' starts), and the torch
calls they are made of (a pinned allocation, the numpy fill, the copy, the views), with a
cast of 13 int32 and an ``Event.record`` beside them. Each: median host us of 300 calls, a
sync between calls outside the clock, with the GPU idle and behind a queued
``torch.cuda._sleep`` (busy). One process with nothing else running: inside an engine's
step the same calls cost several times as much (docs/performance.md, "Inside an engine").

Last answer (H200, 2026-12-02, torch 2.11, idle / busy us; from this probe's draft, the
same calls without the ``Staging.stage`` line, which has not run on a GPU yet):
``to_device`` 38.7 / 85.6 (with the per-token index 39.9 / 62.7); its parts: pinned
allocation 4.2 / 4.6, fill of eight arrays 16.3 / 20.9, the pinned copy 6.6 / 12.3 (into
a kept buffer 4.6 / 7.1), the views by ``split_with_sizes`` 15.5 / 15.3 (eight slices
11.4 / 31.8); a cast of 13 int32 12.4 / 35.4; ``Event.record`` 6.1 / 24.7;
``is_current_stream_capturing`` 0.8 / 2.4.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from kv_canary_engines.host import Staging, to_device

ROWS = 13
CALLS = 300


def _timed(fn: Callable[[], object], busy: bool) -> float:
    out = []
    for _ in range(CALLS):
        torch.cuda.synchronize()
        if busy:
            torch.cuda._sleep(2_000_000)
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return 1e6 * statistics.median(out)


def cases(dev: torch.device) -> dict[str, Callable[[], object]]:
    """The timed calls, by name (each keeps what it makes alive until the next sync)."""
    rows = np.arange(ROWS, dtype=np.int64) + 1
    arrays = [rows] * 6 + [rows.astype(np.int32), np.arange(ROWS + 1, dtype=np.int64)]
    per_token = [*arrays[:-1], np.arange(7800, dtype=np.int64)]
    pinned = torch.empty(128, dtype=torch.int64, pin_memory=True)
    kept = torch.empty(128, dtype=torch.int64, device=dev)
    small = torch.arange(ROWS, dtype=torch.int32, device=dev)
    event = torch.cuda.Event(enable_timing=True)
    staging = Staging(dev)
    keep: list[object] = []

    def fill() -> None:
        buf = pinned.numpy()
        for i, a in enumerate(arrays):
            buf[16 * i : 16 * i + ROWS] = a[:ROWS]

    return {
        "to_device (a decode step's 8 arrays)": lambda: keep.append(to_device(arrays, dev)),
        "to_device (7 + a 7,800-entry index)": lambda: keep.append(to_device(per_token, dev)),
        "Staging.stage (the layout repeated)": lambda: keep.append(staging.stage(arrays)),
        "torch.empty(pin_memory=True)": lambda: keep.append(
            torch.empty(128, dtype=torch.int64, pin_memory=True)
        ),
        "fill 8 arrays (numpy)": fill,
        "pinned.to(cuda, non_blocking)": lambda: keep.append(pinned.to(dev, non_blocking=True)),
        "kept.copy_(pinned, non_blocking)": lambda: kept.copy_(pinned, non_blocking=True),
        "split_with_sizes (16 parts)": lambda: keep.append(kept.split_with_sizes([8] * 16)),
        "8 slices": lambda: keep.append([kept[16 * i : 16 * i + ROWS] for i in range(8)]),
        "cast 13 int32 to int64": lambda: keep.append(small.to(torch.int64)),
        "Event.record": lambda: event.record(),
        "is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    if not torch.cuda.is_available():
        print("staging_parts: needs CUDA (it times CUDA copies)", file=sys.stderr)
        return 1
    dev = torch.device("cuda")
    timed = cases(dev)
    for fn in timed.values():  # warm: the pinned cache, the kept layout
        for _ in range(3):
            fn()
    print("| part | GPU idle us | GPU busy us |\n|---|---:|---:|")
    for name, fn in timed.items():
        print(f"| {name} | {_timed(fn, False):.1f} | {_timed(fn, True):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which neighbour on a side stream slows a bf16 GEMM, and by how much?

    python -m benchmarks.probes.gemm_neighbours            # CUDA
    python -m benchmarks.probes.gemm_neighbours --smoke    # CPU: the code path, no figures

``write_split`` measures the split write's chain beside an 8192^3 GEMM at +6 to +7.5%
(issue 28 asks at most 1%), about one wave of the GEMM's persistent kernel whatever the
chain's length, its register cap or a sleep in its loop. This asks whether the chain is
the cause or any kernel running beside the GEMM is: per GEMM shape (the 8192^3 square;
the MLP up-projections of an 8192-token prefill at Llama-3.1-8B's and Llama-3.2-1B's
shapes), GPU time of the GEMM alone and beside, on a side stream launched just before it
(as the runtime's chain is, before the forward):

- ``sleep``: ``torch.cuda._sleep``, one thread spinning for about the GEMM's time (a few
  registers: it shares a multiprocessor with the GEMM's CTA);
- ``chain 1 x 8192`` and ``chain 16 x 2048``: ``launch_write_chain`` of those write
  cases (``write_split``'s), real-KV NONE;
- ``copy``: a 64 MiB device-to-device copy (bandwidth, every multiprocessor briefly).

Eager, CUDA events on the GEMM's stream around the GEMM alone, medians of ``--rounds``
rounds, the variants interleaved in each round.

Last answer (H200, fe30b68, 2026-12-02, torch 2.11): every neighbour that stays resident
while the GEMM runs costs it several percent, the spinning thread as much as the chain:
8192^3 1,459 us alone, +6.8% beside ``sleep``, +7.4% / +8.4% beside the chains of
1 x 8192 / 16 x 2048; the 8B up-projection +6.8% / +7.4% / +5.7%; the 1B one +7.1% /
+8.3% / +23.5% (the 16 x 2048 chain, 16 programs on as many multiprocessors for 328 us,
runs through most of that 380 us GEMM). The 64 MiB copy: +0.01 to +0.26%. The table is
in docs/performance.md ("Write").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable, Sequence

if __name__ == "__main__" and "--smoke" in sys.argv:  # before Triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from benchmarks.canary_cases import GPU_SIZES, SMOKE_SIZES
from benchmarks.harness import markdown_table
from benchmarks.probes.write_split import Split, cases, on_side

SHAPES: tuple[tuple[str, int, int, int], ...] = (
    ("8192 x 8192 x 8192", 8192, 8192, 8192),
    ("8B MLP up, 8192 tokens (8192 x 4096 x 14336)", 8192, 4096, 14336),
    ("1B MLP up, 8192 tokens (8192 x 2048 x 8192)", 8192, 2048, 8192),
)
"""(name, M, K, N): ``[M, K] @ [K, N]``."""

CLOCK_MHZ = 1980
"""The H200's boost clock, to turn the GEMM's time into ``_sleep`` cycles: about (a slower
clock only makes the sleep outlast the GEMM, which is what the variant needs)."""


def _chain(rows: int, tokens: int) -> Callable[[], None]:
    for _name, r, t, prefix in cases(GPU_SIZES):
        if (r, t) == (rows, tokens):
            split = Split(GPU_SIZES, r, t, prefix, "NONE", "cuda")
            return split.chain
    raise ValueError(f"kv-canary: gemm_neighbours: no write case {rows} x {tokens}")


def measure(rounds: int) -> list[list[str]]:
    here = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    forked = torch.cuda.Event()
    src = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    chains = {"chain 1 x 8192": _chain(1, 8192), "chain 16 x 2048": _chain(16, 2048)}
    out = []
    for name, m, k, n in SHAPES:
        g = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(m, k, generator=g).to(device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, generator=g).to(device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        cycles = [0]
        neighbours: dict[str, Callable[[], None] | None] = {
            "alone": None,
            "sleep": lambda: torch.cuda._sleep(cycles[0]),
            **chains,
            "copy": lambda: dst.copy_(src),
        }
        times: dict[str, list[float]] = {v: [] for v in neighbours}
        for warm in range(3 + rounds):
            for variant, fn in neighbours.items():
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )

                def timed() -> None:
                    start.record(here)
                    torch.matmul(a, b, out=c)
                    end.record(here)

                if fn is None:
                    timed()
                else:
                    on_side(side, forked, fn, timed)
                torch.cuda.synchronize()
                us = start.elapsed_time(end) * 1e3
                if warm >= 3:
                    times[variant].append(us)
                elif fn is None:  # warm-up: the sleep as long as the GEMM alone
                    cycles[0] = int(us * CLOCK_MHZ)
        alone_us = statistics.median(times["alone"])
        row = [name, f"{alone_us:.1f}"]
        for variant in list(neighbours)[1:]:
            us = statistics.median(times[variant])
            row += [f"{us:.1f} ({100 * (us / alone_us - 1):+.2f}%)"]
        out.append(row)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--smoke", action="store_true", help="CPU: the chain's code path")
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("gemm_neighbours: needs CUDA (or --smoke for the CPU)", file=sys.stderr)
        return 1
    if args.smoke:
        name, rows, tokens, prefix = cases(SMOKE_SIZES)[0]
        Split(SMOKE_SIZES, rows, tokens, prefix, "NONE", "cpu").chain()
        print(f"gemm_neighbours: smoke on the CPU ({name}'s chain ran); no GPU, no figures")
        return 0
    print(
        f"gemm_neighbours: {torch.cuda.get_device_name()}, torch {torch.__version__}; GEMM "
        f"GPU us alone and beside each neighbour (medians of {args.rounds} rounds, eager):"
    )
    headers = ["GEMM", "alone", "sleep", "chain 1 x 8192", "chain 16 x 2048", "copy 64 MiB"]
    print(markdown_table(headers, measure(args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

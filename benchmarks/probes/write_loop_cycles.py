"""How many cycles a token does the write's token loop cost, as ptxas scheduled it?

    python -m benchmarks.probes.write_loop_cycles [REV_OR_DIR] [--load-latency 300] [--json]

A static model of the write's token loop on the H200, from its sm_90 SASS, without a GPU.
Compiles ``canary_write_kernel`` (without real-KV sources, with and without expected
inputs; ``REV_OR_DIR``: a git revision, or a directory holding a copy of a revision's
``kv_canary_kernels``, loaded as in ``kernels_vs_revisions``; default the working tree's)
for sm_90 with Triton's own ptxas (``benchmarks/sass.py``), disassembles it with Triton's
cuobjdump, finds the token loop (the backward branch whose body holds the most chain
products: since the write's split, the chain program's loop) and reads each
instruction's stall count from its control bits (bits 105-108 of the 128-bit word: the
cycles before the warp issues its next instruction, as ptxas scheduled it). A long row's
write is one warp issuing that loop, so its time a token is about the loop's stall sum
over the tokens a body handles (its ``IMAD.HI`` / 6: each ``mix3`` of the chain takes the
high halves of six products with one each), plus the waits for loads whose result is used
before it arrives: each load is given ``--load-latency`` cycles (an L2 hit, about 300) and
the loop is run a few times.

Calibration on the H200 (session of 2026-12-01, third part; docs/performance.md): the
model's cycles a token divided by 1.8 GHz (a fitted constant: the SM clock measured
1.93 to 1.95 GHz during the chain, whose mix3 took 181 cycles by ``clock64`` against 165
scheduled, so the model leaves about a tenth out) came within 8% of the measured time of
each of the ten loop variants timed for 16 x 2048 without expected inputs, within 13%
with them. It also ranked the write split's variants (fourth part) in their measured
order. Use it to sort candidate loops before spending device time, never as a
measurement.

Last answer (compiled on this project's CPU machine, 2026-12-01, d175989's kernels and
5a7b446's, which are equal here): 196.5 scheduled cycles a token without expected inputs
(4 tokens a body, 411 instructions), 236.0 with them (2 tokens, 264 instructions); 282.5 and
260.5 with load waits of 300 cycles. Divided by 1.8 GHz: 109 ns a token, against 110 ns
measured on the H200 for 16 x 2048 (226.3 us, docs/performance.md, the write split). The
chain-only knock-out scheduled 178.8 cycles a token and one ``mix3`` alone 165.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import tempfile
from pathlib import Path

from benchmarks.harness import logged
from benchmarks.revisions import export_kernels
from benchmarks.sass import compile_sm90, instructions


def compile_write(package: str, expected: bool) -> bytes:
    """The sm_90 cubin of ``package``'s write kernel, no real-KV sources (and, for a
    package with chain programs, their unroll for ``expected``)."""
    write = importlib.import_module(f"{package}.write")
    constexprs = {"HAS_EXPECTED": expected, "NUM_SOURCES": 0, "MODE": 0, "ROWS": 32, "CHUNK": 16}
    if hasattr(write, "CHAIN_UNROLL"):
        constexprs["CHAIN_UNROLL"] = write.CHAIN_UNROLL[expected]
    return compile_sm90(write.canary_write_kernel, constexprs, 1).asm["cubin"]


def products(body: list[dict]) -> int:
    """The chain's high-half products in ``body`` (six a ``mix3``)."""
    return sum(x["text"].split()[0].startswith("IMAD.HI") for x in body)


def _back_target(x: dict) -> int | None:
    m = re.search(r"BRA (0x[0-9a-f]+)", x["text"])
    return int(m.group(1), 16) if m and int(m.group(1), 16) < x["address"] else None


def token_loop(ins: list[dict]) -> list[dict]:
    """The body of the innermost loop (a backward branch's range holding no other) with
    the most chain products: the most unrolled chain loop (the replays and the short
    rows' steps are rolled)."""
    best: list[dict] = []
    for x in ins:
        start = _back_target(x)
        if start is None:
            continue
        body = [y for y in ins if start <= y["address"] <= x["address"]]
        inner = all((t := _back_target(y)) is None or t < start for y in body[:-1])
        if inner and products(body) > products(best):
            best = body
    assert best, "no chain loop in the kernel"
    return best


def loop_cycles(body: list[dict], load_latency: int, laps: int = 5) -> tuple[int, int]:
    """The body's stall sum and its cycles with load waits, on the last of ``laps`` laps."""
    now, ready, last = 0, {}, 0
    for _ in range(laps):
        start = now
        for x in body:
            for b in range(6):
                if x["wait_mask"] >> b & 1 and ready.get(b, 0) > now:
                    now = ready[b]
            if x["write_barrier"] != 7 and "LDG" in x["text"]:
                ready[x["write_barrier"]] = now + load_latency
            now += x["stall"]
        last = now - start
    return sum(x["stall"] for x in body), last


def loads_before_first_wait(ins: list[dict]) -> int:
    """64-bit loads the kernel issues before its first wait for a load: a decode step's
    round trips start there (the seed, and the row's two offsets, must all be in flight
    before the warp waits, or the token loads that need the offsets start a round trip
    late)."""
    pending: set[int] = set()
    count = 0
    for x in ins:
        if any(x["wait_mask"] >> b & 1 for b in pending):
            return count
        if "LDG" in x["text"] and x["write_barrier"] != 7:
            pending.add(x["write_barrier"])
            count += "LDG.E.64" in x["text"]
    return count


def model(package: str, load_latency: int) -> dict[str, dict]:
    """Per write variant (``expected=False`` / ``expected=True``): the token loop's
    instructions, tokens a body, and scheduled cycles a token without and with load waits
    of ``load_latency`` cycles."""
    out = {}
    for expected in (False, True):
        ins = instructions(compile_write(package, expected))
        body = token_loop(ins)
        tokens = products(body) // 6
        stalls, cycles = loop_cycles(body, load_latency)
        out[f"expected={expected}"] = {
            "instructions": len(body),
            "tokens_per_body": tokens,
            "stall_cycles_per_token": stalls / tokens,
            "cycles_per_token_with_load_waits": cycles / tokens,
            "loads_before_first_wait": loads_before_first_wait(ins),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "revision",
        nargs="?",
        default=None,
        help="a git revision or a copy of its kv_canary_kernels (default: the working tree's)",
    )
    parser.add_argument("--load-latency", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    label = args.revision or "kv_canary_kernels"
    with tempfile.TemporaryDirectory() as tmp:
        package = export_kernels(args.revision, Path(tmp)).__name__ if args.revision else label
        result = model(package, args.load_latency)
    if args.json:
        print(json.dumps(result))
        return 0
    for name, r in result.items():
        print(
            f"{label} {name}: {r['instructions']} instructions for "
            f"{r['tokens_per_body']} tokens; {r['stall_cycles_per_token']:.1f} cycles a token "
            f"scheduled, {r['cycles_per_token_with_load_waits']:.1f} with load waits "
            f"({args.load_latency} cycles a load)"
        )
    return 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())

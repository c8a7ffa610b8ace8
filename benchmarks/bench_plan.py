"""Alias of ``benchmarks/bench.py --stage plan`` (the plan stage alone), kept so that the
commands of earlier docs still work; every other argument is passed on:

    python benchmarks/bench_plan.py [--device cpu] [--quick] [--tune] [--profile-cases all]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import main

if __name__ == "__main__":
    raise SystemExit(main(["--stage", "plan", *sys.argv[1:]]))

"""benchmarks/sass_model.py on the working tree's write kernel (sm_90, compiled on the CPU).

The model guided the write loop's last changes (docs/performance.md, session of
2026-12-01, third part); this keeps it running and holds the loop's unroll rule: three
tokens a body without expected inputs, two with them (unrolled by 3, ptxas moves a test
of a freshly loaded token next to its load and the warp waits for L2). The compile runs
in a subprocess: the test process has the interpreter on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sass_model_of_the_write_loop():
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sass_model.py"), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    model = json.loads(done.stdout)
    assert set(model) == {"expected=False", "expected=True"}
    assert model["expected=False"]["tokens_per_body"] == 3
    assert model["expected=True"]["tokens_per_body"] == 2
    for r in model.values():
        # One mix3 alone is about 165 scheduled cycles (chain_floor.py's kernel); a token
        # of the write costs more, and far less than a loop that lost its unroll.
        assert 165 < r["stall_cycles_per_token"] < 400, r
        assert r["cycles_per_token_with_load_waits"] >= r["stall_cycles_per_token"], r
        # A body's instructions: the chain (about 42 a token) and the token's accesses.
        assert 60 * r["tokens_per_body"] < r["instructions"] < 200 * r["tokens_per_body"], r

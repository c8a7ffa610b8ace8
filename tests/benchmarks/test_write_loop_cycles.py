"""The write-loop model (``benchmarks.probes.write_loop_cycles``) on the working tree's write
kernel (sm_90, compiled on the CPU).

The model guided the write loop's last changes (docs/performance.md, sessions of
2026-12-01, third and fourth parts); this keeps it running and holds the chain program's
unroll rule (``write.CHAIN_UNROLL``, measured on the H200): four tokens a body without
expected inputs, two with them. The compile runs in a subprocess: the test process has
the interpreter on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_write_loop_model():
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.probes.write_loop_cycles", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    model = json.loads(done.stdout)
    assert set(model) == {"expected=False", "expected=True"}
    assert model["expected=False"]["tokens_per_body"] == 4
    assert model["expected=True"]["tokens_per_body"] == 2
    for r in model.values():
        # One mix3 alone is about 165 scheduled cycles (write_chain_floor's kernel); a token
        # of the write costs more, and far less than a loop that lost its unroll.
        assert 165 < r["stall_cycles_per_token"] < 400, r
        assert r["cycles_per_token_with_load_waits"] >= r["stall_cycles_per_token"], r
        # A body's instructions: the chain (about 66 a token) and the token's accesses.
        assert 70 * r["tokens_per_body"] < r["instructions"] < 200 * r["tokens_per_body"], r
        # The seed and both offsets in flight before the first wait: a decode step's token
        # loads need the offsets (with the seed's hash in the shared prologue, ptxas waited
        # for the seed first: one round trip more a decode step).
        assert r["loads_before_first_wait"] >= 3, r

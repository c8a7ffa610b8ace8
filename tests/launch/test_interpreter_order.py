"""``TRITON_INTERPRET=1`` set too late, in a fresh process each time (the variable is read
at import, so this process, where tests/conftest.py set it first, cannot show it): what
each launcher raises on CPU tensors, word for word as docs/troubleshooting.md quotes it.

- ``kv_canary_kernels`` imported, then the variable set: the library's "needs a CUDA
  device" ``RuntimeError`` from each launcher.
- ``triton`` imported, then the variable set, then ``kv_canary_kernels``: Triton's
  interpreter raises ``InterpreterError`` ("Cannot call @triton.jit'd outside of the scope
  of a kernel"); the launchers raise the library's message in its place."""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kv_canary_kernels.fast_launch import INTERPRETER_TOO_LATE

ROOT = Path(__file__).resolve().parents[2]
TROUBLESHOOTING = (ROOT / "docs" / "troubleshooting.md").read_text()

SCRIPT = """
import json, os, sys
import torch
FIRST = sys.argv[1]
if FIRST == "kv_canary_kernels":
    import kv_canary_kernels
else:
    import triton
os.environ["TRITON_INTERPRET"] = "1"
from kv_canary_buffers import CanaryStore, PlanBuffers, plan_reference
from kv_canary_kernels import launch_plan, launch_verify, launch_write

def i64(*v):
    return torch.tensor(v, dtype=torch.int64)

rows = dict(req_pool_indices=i64(1), prefix_lens=i64(2), extend_seq_lens=i64(1),
            req_to_token=torch.arange(16, dtype=torch.int32).view(2, 8))
plan = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device="cpu")
plan_reference(plan, **rows)  # a plan with entries: the verify has work to do
store = CanaryStore.allocate(num_slots=64, violation_capacity=4, device="cpu")
calls = {
    "launch_plan": lambda: launch_plan(plan, **rows),
    "launch_verify": lambda: launch_verify(store, plan),
    "launch_write": lambda: launch_write(
        store, plan, input_ids=i64(5), positions=i64(0), out_cache_loc=i64(3)),
}
out = {}
for name, call in calls.items():
    try:
        call()
        out[name] = ["no error", "", ""]
    except Exception as err:
        cause = type(err.__cause__).__name__ if err.__cause__ is not None else ""
        out[name] = [type(err).__name__, str(err), cause]
print(json.dumps(out))
"""


@functools.cache
def run(first: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    # a CPU machine's view, also on a GPU machine (where Triton's driver is CUDA's, and a
    # kernel launched outside the interpreter fails in other words)
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, first],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_kernels_imported_before_the_variable():
    out = run("kv_canary_kernels")
    kind, text, _ = out["launch_plan"]
    assert kind == "RuntimeError"
    assert text.startswith(
        "kv-canary: launch_plan needs a CUDA device for buffers.device, got cpu; on the CPU "
        "use kv_canary_buffers.plan_reference"
    )
    for name in ("launch_verify", "launch_write"):
        kind, text, _ = out[name]
        assert kind == "RuntimeError", (name, text)
        assert text.startswith("kv-canary: the Triton kernels need a CUDA device, got "), text
        assert text.endswith(
            "on the CPU use the torch references (plan_reference, write_reference, "
            "verify_reference), or set TRITON_INTERPRET=1 before triton is first imported "
            "to run the kernels in Triton's interpreter"
        )
    # launch_write's message is the one the troubleshooting table quotes in full
    assert f"`{out['launch_write'][1]}`" in TROUBLESHOOTING.replace("{device}", "cpu")


@pytest.mark.parametrize("name", ["launch_plan", "launch_verify", "launch_write"])
def test_triton_imported_before_the_variable(name):
    kind, text, cause = run("triton")[name]
    assert (kind, text, cause) == ("RuntimeError", INTERPRETER_TOO_LATE, "InterpreterError")
    assert f"`{INTERPRETER_TOO_LATE}`" in TROUBLESHOOTING
    assert "Cannot call @triton.jit'd outside of the scope of a kernel" in text

"""``benchmarks/sglang/run_cuda_differential.py`` (the H200 comparison with SGLang's CUDA
kernels) run on the CPU: its worlds, its comparisons and its table, with SGLang's torch
references standing in for SGLang's CUDA launchers (the same signatures) and this
project's kernels in Triton's interpreter. The GPU run differs only in the sizes, the
launchers loaded (``load_installed_sglang``) and the timer."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import pytest

from tests.sglang.sglang_refs import as_ops

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sglang" / "run_cuda_differential.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("run_cuda_differential", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_the_script_finds_every_output_equal_on_the_cpu(script, refs, tmp_path):
    out = tmp_path / "smoke.csv"
    sg = as_ops(refs)
    rows = script.run(sg, script.SMOKE_CASES, script.SMOKE_SIZES, "cpu", script.no_time, out)
    assert [(r.stage, r.mode, r.detail) for r in rows] == [
        (c.stage, c.mode, "") for c in script.SMOKE_CASES
    ]
    assert all(r.equal for r in rows)
    assert all(math.isnan(r.ours_us) and math.isnan(r.sglang_us) for r in rows)
    with open(out) as f:
        written = list(csv.DictReader(f))
    assert [w["stage"] for w in written] == [c.stage for c in script.SMOKE_CASES]
    assert sum(int(w["entries"]) > 0 for w in written) >= 5


def test_the_script_reports_a_difference(script, refs):
    """A stand-in write that changes one byte of SGLang's buffer after writing: the case
    is reported unequal, naming the records."""
    sg = as_ops(refs)

    def write_then_flip(**kw):
        refs.write_ref(**kw)
        kw["context"].canary_buf[kw["out_cache_loc"][0], 0] ^= 1

    broken = dataclasses.replace(sg, write=write_then_flip)
    case = script.Case("write", 2, 3, (1, 5), "NONE")
    row = script.run_case(broken, case, script.SMOKE_SIZES, "cpu", script.no_time, seed=7)
    assert not row.equal
    assert "fill records" in row.detail and "write records" in row.detail


def test_the_gpu_cases_are_the_issue_s_workloads(script):
    """Issue 26, section 6: verify bs 64/256/4096 at mean prefix 512 in real-KV NONE,
    PARTIAL and ALL; write decode 256x1 and 4096x1, prefill 16x2048 and 1x8192; plan bs
    64/256/4096."""
    got = {(c.stage, c.rows, c.tokens, c.mode) for c in script.GPU_CASES}
    verify = {("verify", bs, 1, m) for bs in (64, 256, 4096) for m in ("NONE", "PARTIAL", "ALL")}
    write = {("write", 256, 1, "NONE"), ("write", 4096, 1, "NONE")}
    write |= {("write", 16, 2048, "NONE"), ("write", 1, 8192, "NONE")}
    plan = {("plan", bs, 1, "NONE") for bs in (64, 256, 4096)}
    assert got == verify | write | plan
    assert all(sum(c.prefix) / 2 == 512 for c in script.GPU_CASES if c.prefix != (0, 0))

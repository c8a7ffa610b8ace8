"""The ``sglang_cuda`` column of ``python -m benchmarks`` run on the CPU: SGLang's torch
references stand in for its CUDA launchers (the same signatures, ``sglang_refs.as_ops``),
this project's kernels run in Triton's interpreter. The column appears in the plan, verify
and write tables and the CSV, its checks run, a case beyond SGLang's limits is an absent
cell (not an error), and a stand-in whose output is corrupted gives an error row. The GPU
run differs only in the sizes, the ops loaded (``load_installed_sglang``) and the timer."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from benchmarks import bench, harness, sglang_cuda
from tests.sglang.sglang_refs import as_ops


@pytest.fixture(autouse=True)
def _restore_env(monkeypatch):
    """The benchmark's run settings (``harness.ENV``) as they were, after each test."""
    monkeypatch.setattr(harness.ENV, "device", harness.ENV.device)
    monkeypatch.setattr(harness.ENV, "smoke", harness.ENV.smoke)


@pytest.fixture
def stand_ins(refs, monkeypatch):
    """``--sglang require`` loads SGLang's torch references; returns a setter for other
    stand-ins."""
    ops = as_ops(refs)

    def use(new):
        monkeypatch.setattr(sglang_cuda, "load_installed_sglang", lambda: new)

    use(ops)
    return ops, use


def _run(tmp_path, capsys, stages: str) -> tuple[int, list[dict], str]:
    rc = bench.main(
        ["--smoke", "--stage", stages, "--sglang", "require", "--no-plots", "--out", str(tmp_path)]
    )
    (path,) = tmp_path.glob("smoke-*.csv")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return rc, rows, capsys.readouterr().out


@pytest.mark.slow
def test_the_column_runs_its_checks_on_every_case(stand_ins, tmp_path, capsys):
    ops, use = stand_ins
    # A row limit below the smoke's large plan batch (1030 rows): that case is absent.
    use(dataclasses.replace(ops, plan_max_bs=64))
    rc, rows, out = _run(tmp_path, capsys, "plan,verify,write")
    assert rc == 0, [r["note"] for r in rows if r["section"] == "error"]
    sg = [r for r in rows if r["impl"] == "sglang_cuda"]

    def cases(rows, section):
        return {
            (r["stage"], r["case"] or f"bs={r['bs']} swa={r['swa']}")
            for r in rows
            if r["section"] == section
        }

    # Every plan, verify and write case of the smoke has the column: a time or an absent cell.
    ours = cases(
        [r for r in rows if r["impl"] in ("launch_plan", "launch_verify", "launch_write")],
        "gpu_time",
    )
    assert {stage for stage, _ in ours} == {"plan", "verify", "write"}
    assert cases(sg, "gpu_time") | cases(sg, "absent") == ours
    assert not cases(sg, "gpu_time") & cases(sg, "absent")
    plan_timed = {r["bs"] for r in sg if r["stage"] == "plan" and r["section"] == "gpu_time"}
    plan_absent = [r for r in sg if r["stage"] == "plan" and r["section"] == "absent"]
    assert plan_timed == {"5"}
    assert {r["bs"] for r in plan_absent} == {"1030"} and len(plan_absent) == 2  # SWA off, on
    assert all("at most 64 rows" in r["note"] for r in plan_absent)
    # Checked after timing, clean; the verify and write cases all ran.
    checks = [r for r in sg if r["section"] == "check"]
    assert len(checks) == 5 + 3 and all(float(r["value"]) == 0 for r in checks)
    # The tables: the column, its ratio, the absent cells and their reason.
    assert "SGLang 0.5.23 torch references" in out
    assert "| sglang_cuda | launch_plan / sglang_cuda |" in out
    assert "launch / sglang_cuda |" in out and "launch_write / sglang_cuda |" in out
    assert out.count("| absent ") == 2
    assert "sglang_cuda absent at bs=1030 swa=0: SGLang's plan takes at most 64 rows" in out


def test_a_wrong_sglang_plan_is_an_error_row(stand_ins, capsys):
    ops, _ = stand_ins

    def plan_then_break(**kw):
        ops.plan(**kw)
        kw["write_plan_out"].write_seed_slot_indices[0] += 1

    broken = dataclasses.replace(ops, plan=plan_then_break)
    harness.configure("cpu", True)
    from benchmarks.plan_cases import SMOKE_BATCHES, bench_gpu

    rec = harness.Recorder("cpu", None)
    rec.stage = "plan"
    bench_gpu(rec, SMOKE_BATCHES[:1], replays=1, host_calls=1, bandwidth=1e9, sglang=broken)
    errors = [e for e in rec.errors if "sglang_cuda" in e]
    assert len(errors) == 2 and all("write_seed_slot_indices" in e for e in errors), rec.errors
    assert len(rec.errors) == 2  # the other implementations still pass
    assert not [r for r in rec.rows if r["impl"] == "sglang_cuda" and r["section"] == "gpu_time"]
    capsys.readouterr()
    bench.print_report(rec, smoke=True)
    out = capsys.readouterr().out
    assert "launch_plan / sglang_cuda" in out and out.count("| error ") == 2


def test_a_wrong_sglang_write_or_verify_is_an_error_row(stand_ins, capsys):
    ops, _ = stand_ins
    from benchmarks import canary_cases as cc

    def write_then_flip(**kw):
        ops.write(**kw)
        kw["context"].canary_buf[kw["out_cache_loc"][0], 0] ^= 1

    def verify_then_forget(**kw):  # finds the violations, then loses one
        ops.verify(**kw)
        index = kw["context"].violation_write_index
        index.copy_((index - 1).clamp_min(0))

    harness.configure("cpu", True)
    sizes = cc.SMOKE_SIZES._replace(write=cc.SMOKE_SIZES.write[1:2], verify=((5, 1.0, 1.0),))
    rec = harness.Recorder("cpu", None)
    cc.bench_write(rec, sizes, 1, 1, 1e9, 1, dataclasses.replace(ops, write=write_then_flip))
    cc.bench_verify(rec, sizes, 1, 1, 1e9, dataclasses.replace(ops, verify=verify_then_forget))
    errors = [e for e in rec.errors if "sglang_cuda" in e]
    write_errors = [e for e in errors if e.startswith("write ")]
    verify_errors = [e for e in errors if e.startswith("verify ")]
    assert len(write_errors) == 1 and "fill records" in write_errors[0], rec.errors
    # NONE and PARTIAL, SWA off and on: every case's corrupted verify differs.
    assert len(verify_errors) == 4 and all("corrupted verify" in e for e in verify_errors)
    assert len(errors) == len(rec.errors)  # launch_write and launch_verify still pass
    assert not [r for r in rec.rows if r["impl"] == "sglang_cuda" and r["section"] == "gpu_time"]
    capsys.readouterr()
    bench.print_report(rec, smoke=True)
    out = capsys.readouterr().out
    assert "launch / sglang_cuda" in out and "launch_write / sglang_cuda" in out
    assert out.count("| error ") == 1 + 4


def test_off_and_auto_on_the_cpu_have_no_column(stand_ins):
    assert sglang_cuda.resolve("off", "cuda")[0] is None
    ops, note = sglang_cuda.resolve("auto", "cpu")
    assert ops is None and "need CUDA" in note
    assert sglang_cuda.resolve("require", "cpu")[0] is not None


def test_require_fails_when_sglang_does_not_load(monkeypatch):
    def unavailable():
        raise sglang_cuda.SglangUnavailable("no sglang package on the path")

    monkeypatch.setattr(sglang_cuda, "load_installed_sglang", unavailable)
    with pytest.raises(SystemExit, match="--sglang require: no sglang package"):
        sglang_cuda.resolve("require", "cuda")
    ops, note = sglang_cuda.resolve("auto", "cuda")
    assert ops is None and "no sglang package" in note

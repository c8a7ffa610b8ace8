"""The benchmark's plots drawn again from committed CSVs (``python -m benchmarks
--plot-from``), with no GPU: the rows read back as the recorder holds them, and every plot
is written; every module of the benchmark and its probes imports."""

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench, harness

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "benchmarks" / "reference"


def test_host_time_spread():
    t = harness.HostTime.of([5.0, 1.0, 3.0, 2.0, 4.0, 7.0, 6.0])
    assert (t.median, t.min) == (4.0, 1.0)
    assert 6.0 <= t.p90 <= 7.0
    assert harness.HostTime.of([2.5]) == (2.5, 2.5, 2.5)


def test_load_rows_reads_both_schemas():
    old = harness.load_rows(REFERENCE / "cpu.csv")  # before the "stage" and spread columns
    assert {r["stage"] for r in old} == {"plan"}
    assert {(r["section"], r["impl"]) for r in old} == {
        ("cpu", "plan_reference"),
        ("cpu", "python_loop"),
    }
    assert all(isinstance(r["value"], float) and r["value_min"] == "" for r in old)
    assert {r["bs"] for r in old} == {256}
    new = harness.load_rows(REFERENCE / "h200.csv")
    assert {"plan", "verify", "write", "step"} <= {r["stage"] for r in new}
    assert {r["device"] for r in new} == {"NVIDIA H200"}
    host = [r for r in new if r["section"] == "host" and r["impl"] == "launch_plan"]
    assert host and all(r["value_min"] <= r["value"] <= r["value_p90"] for r in host)


def test_the_reference_runs_are_complete():
    """The H200 reference is one whole run: every stage's GPU and host sections and each
    stage's time, the run's total last, no error row, one commit and one date."""
    rows = harness.load_rows(REFERENCE / "h200.csv")
    assert not [r for r in rows if r["section"] == "error"]
    sections = {(r["stage"], r["section"]) for r in rows}
    for stage in ("plan", "verify", "write", "step"):
        assert {(stage, "gpu_time"), (stage, "host"), (stage, "run")} <= sections, stage
    assert ("plan", "cpu") in sections
    assert (rows[-1]["stage"], rows[-1]["impl"]) == ("run", "total")
    assert len({r["commit"] for r in rows}) == len({r["date"] for r in rows}) == 1


def test_plot_from_the_reference(tmp_path):
    pytest.importorskip("matplotlib")
    h200 = str(REFERENCE / "h200.csv")
    # the reference again as "another run of the same code": the plan's host plot's dots
    args = ["--stage", "plan", "--plots", str(tmp_path), "--plot-from", h200, h200]
    assert bench.main(args) == 0
    args = ["--stage", "verify,write,step", "--plots", str(tmp_path), "--plot-from", h200]
    assert bench.main(args) == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {
        "plan_gpu_time.png",
        "plan_host_overhead.png",
        "canary_gpu_time.png",
        "canary_host_time.png",
    }


def test_plots_go_to_the_output_folder_unless_docs_are_asked_for(tmp_path, monkeypatch):
    """Without ``--plots`` the plots go beside the CSVs, into ``benchmarks/out/``, never
    into ``docs/``; ``--plots-into-docs`` names ``docs/``."""
    pytest.importorskip("matplotlib")
    drawn: list[Path] = []
    monkeypatch.setattr(bench, "plot_canary", lambda rows, out, others=(): drawn.append(out))
    h200 = str(REFERENCE / "h200.csv")
    assert bench.main(["--stage", "verify", "--plot-from", h200]) == 0
    assert bench.main(["--stage", "verify", "--plots-into-docs", "--plot-from", h200]) == 0
    assert drawn == [harness.OUT, ROOT / "docs"]
    assert harness.OUT == ROOT / "benchmarks" / "out"


def test_a_run_writes_its_csv_into_the_output_folder(tmp_path, monkeypatch):
    """A measuring run (the plan's CPU case) writes its CSV into the output folder by
    default, one row per measurement, readable again by ``load_rows``."""
    monkeypatch.setattr(harness, "OUT", tmp_path)
    assert bench.main(["--device", "cpu", "--quick", "--no-plots"]) == 0
    (csv,) = tmp_path.glob("all-cpu-*.csv")
    rows = harness.load_rows(csv)
    assert {r["impl"] for r in rows if r["section"] == "cpu"} == {"plan_reference", "python_loop"}


def module_name(path: Path) -> str:
    """``benchmarks/probes/x.py`` -> ``benchmarks.probes.x`` (a package's ``__init__``: the
    package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(
    p
    for folder in ("benchmarks", "benchmarks/probes")
    for p in (ROOT / folder).glob("*.py")
    if p.name != "__main__.py"  # it runs the benchmark
)


def test_every_probe_is_collected():
    """The probes folder holds the single-question scripts, each collected below."""
    assert len(PROBES) >= 15, PROBES


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_benchmark_modules_import(path):
    """Every module of the benchmark and of its probes imports, by its package name,
    against the packages as they are now (a renamed constant once broke the chain-floor
    probe without any test noticing)."""
    module = importlib.import_module(module_name(path))
    assert module.__file__ is not None and Path(module.__file__).resolve() == path.resolve()


PROBES = [p for p in MODULES if p.parent.name == "probes" and p.stem != "__init__"]


@pytest.mark.parametrize("path", PROBES, ids=module_name)
def test_every_probe_says_its_question_command_and_last_answer(path):
    """A probe's docstring opens with its question, gives the command that runs it, and
    its last answer (where and when it was measured)."""
    doc = importlib.import_module(module_name(path)).__doc__ or ""
    first = doc.split("\n\n")[0]
    assert first.rstrip().endswith("?"), first
    assert f"python -m {module_name(path)}" in doc
    assert "Last answer (" in doc, "the last answer says where and when it was measured"


def test_chain_floor_traffic_kernel_follows_the_contract():
    """The write's chain-and-traffic floor kernel (``benchmarks.probes.write_chain_floor``)
    stores the records the contract's chain gives, so its timing is of the work the write
    must do."""
    # in a process of its own: the flag sets TRITON_INTERPRET there, also on a GPU machine
    _run_probe("benchmarks.probes.write_chain_floor", "--smoke")


def _run_probe(*args: str) -> str:
    """``python -m benchmarks.probes.ARGS`` from the root, as a user runs it (in a process
    of its own: the CPU modes stub the kernels' dispatch, and the interpreter stays off)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "output kept in " in done.stderr  # the copy in benchmarks/out/
    return done.stdout


def test_the_cpu_probes_run(tmp_path):
    """The probes that answer on the CPU run there, the revision-comparing one against a
    copy of this tree's package (the layout by stage) as its baseline."""
    out = _run_probe("benchmarks.probes.plan_checks_calls")
    assert "PlanBuffers.check()" in out and "validate_plan_args" in out
    out = _run_probe("benchmarks.probes.plan_checks_host", "--rounds", "1", "--calls", "20")
    assert out.count("validate_plan_args") == 3
    shutil.copytree(ROOT / "kv_canary_buffers", tmp_path / "kv_canary_buffers")
    out = _run_probe(
        "benchmarks.probes.validation_host",
        *("--rounds", "1", "--calls", "5", "--baseline", str(tmp_path)),
    )
    assert "base med" in out and "write 256x1 expected PARTIAL" in out


@pytest.mark.slow
def test_the_compiled_step_probe_runs_on_the_cpu():
    """``compiled_step_host --device cpu``: the eager and the compiled step, the kernels'
    dispatch stubbed (host work only)."""
    out = _run_probe("benchmarks.probes.compiled_step_host", "--device", "cpu", "--rounds", "1")
    assert "eager" in out and "compiled" in out


def test_the_real_kv_sources_probe_runs_its_cases(tmp_path):
    """``benchmarks.probes.real_kv_sources --smoke``: the cases of the lead's H200 run
    (verify and write of a decode step against the number of real-KV sources, PARTIAL and
    ALL) at tiny sizes under the interpreter, each store checked clean and equal to the
    references', every launcher's GPU and host time recorded."""
    import csv

    from benchmarks.canary_cases import SMOKE_SOURCES

    _run_probe("benchmarks.probes.real_kv_sources", "--smoke", "--results", str(tmp_path))
    (path,) = tmp_path.glob("real_kv_sources-cpu-smoke-*.csv")
    rows = list(csv.DictReader(path.open()))
    assert not [r for r in rows if r["section"] == "error"]
    timed = {(r["real_kv"], r["note"], r["section"], r["impl"]) for r in rows}
    for mode in ("PARTIAL", "ALL"):
        for count in SMOKE_SOURCES.counts:
            for section, impl in (
                ("gpu_time", "launch_verify"),
                ("gpu_time", "launch_write"),
                ("host", "launch_verify"),
                ("host", "launch_write:bare_dispatch"),
            ):
                assert (mode, f"sources={count}", section, impl) in timed

"""The benchmark's plots drawn again from committed CSVs (``python -m benchmarks
--plot-from``), with no GPU: the rows read back as the recorder holds them, and every plot
is written; every module of the benchmark and its probes imports."""

import importlib
from pathlib import Path

import pytest

from benchmarks import bench, harness

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def test_host_time_spread():
    t = harness.HostTime.of([5.0, 1.0, 3.0, 2.0, 4.0, 7.0, 6.0])
    assert (t.median, t.min) == (4.0, 1.0)
    assert 6.0 <= t.p90 <= 7.0
    assert harness.HostTime.of([2.5]) == (2.5, 2.5, 2.5)


def test_load_rows_reads_both_schemas():
    old = harness.load_rows(RESULTS / "plan-cuda-20261129T171735Z.csv")  # before "stage"
    assert {r["stage"] for r in old} == {"plan"}
    host = [r for r in old if r["section"] == "host" and r["metric"] == "us_per_call"]
    assert sorted({r["bs"] for r in host}) == [1, 256, 4096]
    assert all(isinstance(r["value"], float) and r["value_min"] == "" for r in host)
    new = harness.load_rows(RESULTS / "all-cuda-20261130T133325Z.csv")
    assert {"plan", "verify", "write", "step"} <= {r["stage"] for r in new}
    assert {r["device"] for r in new} == {"NVIDIA H200"}


def test_plot_from_csv(tmp_path):
    pytest.importorskip("matplotlib")
    runs = [RESULTS / f"plan-cuda-20261129T17{t}Z.csv" for t in ("1735", "1443", "1612")]
    args = ["--stage", "plan", "--plots", str(tmp_path), "--plot-from", *map(str, runs)]
    assert bench.main(args) == 0
    all_run = RESULTS / "all-cuda-20261130T133325Z.csv"
    args = ["--stage", "verify,write,step", "--plots", str(tmp_path), "--plot-from", str(all_run)]
    assert bench.main(args) == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {
        "plan_gpu_time.png",
        "plan_host_overhead.png",
        "canary_gpu_time.png",
        "canary_host_time.png",
    }


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
    from benchmarks.probes import write_chain_floor

    assert write_chain_floor.main(["--smoke"]) == 0

"""The benchmark's plots drawn again from committed CSVs (``bench.py --plot-from``), with
no GPU: the rows read back as the recorder holds them, and every plot is written."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness  # noqa: E402


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
    import bench

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


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks").glob("*.py")), ids=lambda p: p.stem)
def test_benchmark_modules_import(path):
    """Every benchmark script imports against the packages as they are now (a renamed
    constant once broke ``chain_floor.py`` without any test noticing)."""
    import importlib

    module = importlib.import_module(path.stem)
    assert module.__file__ is not None and Path(module.__file__).resolve() == path.resolve()


def test_chain_floor_traffic_kernel_follows_the_contract():
    """The write's chain-and-traffic floor kernel (benchmarks/chain_floor.py) stores the
    records the contract's chain gives, so its timing is of the work the write must do."""
    import chain_floor

    assert chain_floor.main(["--smoke"]) == 0

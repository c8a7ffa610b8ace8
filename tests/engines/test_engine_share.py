"""The H200 probe of the canary's share of a transformers step
(``benchmarks.probes.engine_share``) on the CPU: its ``--smoke`` (a tiny random Llama,
the Triton kernels under the interpreter) runs the code path the H200 run takes and prints
the table, the tokens-identical check and the violations; and its checks can fail.

Needs transformers (the engines' environment): skipped where it is not importable, failed
instead under ``KV_CANARY_REQUIRE_ENGINES=1``, as ``test_transformers.py``.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("transformers") is None:
    if os.environ.get("KV_CANARY_REQUIRE_ENGINES") == "1":
        raise RuntimeError("kv-canary: KV_CANARY_REQUIRE_ENGINES=1 but transformers is missing")
    pytest.skip(
        "transformers is not installed here (the engines' environment has it: "
        "bash scripts/setup-engines.sh, then .venv-engines/bin/python -m pytest tests/engines)",
        allow_module_level=True,
    )

import torch

from benchmarks.probes import engine_share
from benchmarks.probes.engine_share import COLUMNS, Run, Step, StepCost, check, summarize

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]


def _probe(*flags: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """The probe in a process of its own, as a user runs it: ``--smoke`` sets
    TRITON_INTERPRET itself, so the test's own setting is left out."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.probes.engine_share", *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _smoke(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    done = _probe("--smoke", *flags, "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_the_smoke_runs_the_probe_end_to_end(tmp_path):
    done = _smoke(tmp_path, "--profile", "5")
    out = done.stdout
    header = next(line for line in out.splitlines() if line.startswith("| shape"))
    assert [c.strip() for c in header.strip("|").split("|")] == [h for _, h in COLUMNS]
    body = [line for line in out.splitlines() if line.startswith("| tiny")]
    assert {line.split("|")[2].strip() for line in body} == {"prefill", "decode"}
    assert "tiny: tokens identical with and without the canary: yes (3/3 requests)" in out
    assert "between the runs without it: yes (3/3)" in out
    assert "tiny: canary violations: 0 over " in out
    assert "health executing" in out
    # --profile: where the canary's host time went, and no read back before the forward
    assert "tiny: cProfile, begin_step + end_step, top 5 by own time:" in out
    assert "tiny: inside begin_step: torch and CUDA runtime calls per step" in out
    assert "tiny: begin_step syncing calls: none" in out
    assert "tiny: end_step syncing calls: aten::_local_scalar_dense" in out  # its polls
    assert "output kept in " in done.stderr  # the copy in benchmarks/out/
    (path,) = tmp_path.glob("engine_share-cpu-*.csv")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["kind"] for r in rows] == ["prefill", "decode"]
    for r in rows:
        assert r["tokens_identical"] == "True" and r["violations"] == "0"
        assert float(r["canary_host_us"]) > 0 and float(r["engine_step_ms"]) > 0
        assert float(r["begin_host_us"]) > 0 and float(r["end_host_us"]) > 0
        assert r["canary_gpu_us"] == r["share"] == r["chain_gpu_us"] == ""  # no CUDA events
        assert r["stages"] == "kernels" and r["transformers"]
        assert r["write"] == "one" and r["split_write"] == "auto"  # the CPU's default


@pytest.mark.parametrize(
    ("flag", "writes", "runs", "labels"),
    [
        ("--compare-split", ("split", "one"), "(split, off, one write, off)",
         ("on (split)", "on (one write)")),
        ("--compare-overlap", ("one+overlap", "one"), "(overlapped, off, before the forward, off)",
         ("on (one write, overlapped)", "on (one write)")),
    ],
    ids=["split", "overlap"],
)  # fmt: skip
def test_the_smoke_compares_two_modes_in_one_process(tmp_path, flag, writes, runs, labels):
    # --compare-split: each pair of runs becomes (split, off, one write, off) in one
    # process; --compare-overlap: (overlapped, off, before the forward, off); a table row
    # per step kind and mode, the same tokens in every run
    done = _smoke(tmp_path, flag)
    out = done.stdout
    body = [line.split("|") for line in out.splitlines() if line.startswith("| tiny")]
    assert {(cells[2].strip(), cells[3].strip()) for cells in body} == {
        (kind, write) for kind in ("prefill", "decode") for write in writes
    }
    assert f"runs: off, then 1 x {runs}" in out
    assert "tokens identical with and without the canary: yes (3/3, 3/3 requests)" in out
    assert "tiny: canary violations: 0 over " in out and "health executing" in out
    assert all(label in out for label in labels)
    (path,) = tmp_path.glob("engine_share-cpu-*.csv")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["write"] for r in rows) == sorted(writes * 2)
    assert {r[flag[2:].replace("-", "_")] for r in rows} == {"True"}


def _run(canary: bool, tokens: list[list[int]], kinds: str, **found: object) -> Run:
    """A run whose steps start 10 ms apart (``kinds``: ``p`` prefill, ``d`` decode), the
    canary's host time 100 us a step, its share 1%."""
    steps = [
        Step(rows=2, tokens=64 if k == "p" else 2, prefill=k == "p", start=0.01 * i)
        for i, k in enumerate(kinds)
    ]
    timing = [StepCost(100.0, None, 0.01, 70.0, 30.0)] * len(steps) if canary else []
    return Run(
        canary=canary,
        tokens=tokens,
        steps=steps,
        wall_s=1.0,
        attn="sdpa",
        timing=timing,
        runtime_steps=len(steps) if canary else 0,
        **found,  # type: ignore[arg-type]
    )


def test_the_checks_fail_on_other_tokens_or_a_violation():
    same = [[1, 2], [3, 4]]
    off = _run(False, same, "ppd")
    assert check("x", [off, off], [_run(True, same, "ppd")]).ok
    other = check("x", [off, off], [_run(True, [[1, 2], [3, 5]], "ppd")])
    assert not other.identical and not other.ok
    assert "tokens identical with and without the canary: NO (1/2 requests)" in other.lines[0]
    found = check("x", [off, off], [_run(True, same, "ppd", violations=3)])
    assert found.identical and not found.clean and not found.ok
    assert "canary violations: 3 over 3 steps" in found.lines[1]
    assert not check("x", [off, off], [_run(True, same, "ppd", flags=True)]).ok
    assert not check("x", [off, off], [_run(True, same, "ppd", executing=False)]).ok


def test_the_summary_splits_prefill_from_decode_and_leaves_each_first_step_out():
    same = [[1]]
    offs = [_run(False, same, "ppdddd"), _run(False, same, "ppdddd")]
    ons = [_run(True, same, "ppdddd")]
    ons[0].steps[-1].start += 0.01  # the last decode step of the canary run starts later
    rows = {r["kind"]: r for r in summarize("x", offs, ons)}
    # step 0 (a prefill) is left out of every run; the last step has no next one
    assert rows["prefill"]["steps"] == "2/1" and rows["decode"]["steps"] == "8/4"
    assert rows["prefill"]["engine_step_ms"] == pytest.approx(10.0)
    assert rows["decode"]["step_with_ms"] == pytest.approx(10.0)  # the median of 10, 10, 20
    assert rows["decode"]["canary_host_us"] == 100.0 and rows["decode"]["share"] == 0.01
    # one decode step of the run at 5% (a verify step of --verify-every 4): the median
    # stays, the mean weighs it in
    costly = [_run(True, same, "ppdddd")]
    costly[0].timing[-2] = StepCost(500.0, None, 0.05, 350.0, 150.0)
    worse = {r["kind"]: r for r in summarize("x", offs, costly)}["decode"]
    assert worse["share"] == 0.01
    assert worse["mean_share"] == pytest.approx((0.01 * 3 + 0.05) / 4)
    assert (rows["decode"]["begin_host_us"], rows["decode"]["end_host_us"]) == (70.0, 30.0)
    assert rows["decode"]["begin_gpu_us"] is None  # no CUDA events
    assert rows["decode"]["tokens"] == 2 and rows["prefill"]["tokens"] == 64
    assert rows["decode"]["forward_gpu_ms"] is None  # no CUDA events


def test_the_shapes_are_llama_3s():
    one, eight = engine_share.SHAPES["1b"], engine_share.SHAPES["8b"]
    assert (one["hidden_size"], one["num_hidden_layers"], one["head_dim"]) == (2048, 16, 64)
    assert (eight["hidden_size"], eight["num_hidden_layers"], eight["head_dim"]) == (4096, 32, 128)
    for shape in (one, eight):
        assert (shape["num_attention_heads"], shape["num_key_value_heads"]) == (32, 8)
        assert shape["vocab_size"] == 128256
    assert (one["intermediate_size"], eight["intermediate_size"]) == (8192, 14336)


def test_a_canary_that_raises_in_the_engine_fails_the_probe(monkeypatch):
    # transformers catches a forward's exception and fails the batch's requests: the probe
    # must not take their partial tokens for a run
    from kv_canary_engines.runtime import CanaryRuntime

    def boom(self: CanaryRuntime, batch: object) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(CanaryRuntime, "begin_step", boom)
    args = engine_share.parse(["--smoke", "--stages", "reference"])
    model, _ = engine_share.build_model("tiny", torch.device("cpu"), torch.float32)
    prompts = engine_share.make_prompts(2, 8, 512, seed=0)
    with pytest.raises(
        RuntimeError, match=r"kv-canary: engine_share: request req_\d+ failed: boom"
    ):
        engine_share.generate(model, prompts, args, canary=True, max_new=2)


def test_the_two_comparisons_are_refused_together():
    done = _probe("--smoke", "--compare-split", "--compare-overlap", timeout=120)
    assert done.returncode == 2 and "pick one" in done.stderr


def test_the_write_column_says_what_each_step_kind_ran():
    # with the defaults on CUDA (split_write=None, overlap_begin=None) only the prefill
    # steps split and overlap: the decode rows say one write, before the forward (from
    # the runtime's counts, per step)
    same = [[1]]
    offs = [_run(False, same, "ppdd")]
    on = _run(True, same, "ppdd")
    for s in on.steps:
        s.split = s.overlapped = s.prefill
    rows = {r["kind"]: r["write"] for r in summarize("x", offs, [on])}
    assert rows == {"prefill": "split+overlap", "decode": "one"}
    forced = _run(True, same, "ppdd")  # True: every step
    for s in forced.steps:
        s.split = s.overlapped = True
    rows = {r["kind"]: r["write"] for r in summarize("x", offs, [forced])}
    assert rows == {"prefill": "split+overlap", "decode": "split+overlap"}
    mixed = _run(True, same, "pppd")  # a prefill step whose rows stayed short
    for s, (split, overlapped) in zip(mixed.steps, [(1, 1), (1, 1), (0, 0), (0, 0)]):
        s.split, s.overlapped = bool(split), bool(overlapped)
    rows = {r["kind"]: r["write"] for r in summarize("x", offs, [mixed])}
    assert rows == {"prefill": "mixed+some overlap", "decode": "one"}

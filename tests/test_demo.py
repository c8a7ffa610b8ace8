"""The main job, ``python -m kv_canary_buffers``: defaults, each flag, and corruption
injection turning the status word non-zero."""

import os
import subprocess
import sys

import pytest
import torch

from kv_canary_buffers.demo import run

# Where the Triton kernels can run in this session: the GPU, else the interpreter on CPU
# (tests/conftest.py sets TRITON_INTERPRET=1 when there is no CUDA).
KERNELS = ["--device", "cuda"] if torch.cuda.is_available() else ["--planner", "kernels"]


def test_defaults_run_clean_as_a_module():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-m", "kv_canary_buffers"], capture_output=True, text=True,
        env=env, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "200 steps on cpu, planner: plan_reference (torch)" in text
    assert "plans differing from plan_reference  0" in text
    assert "verify skipped (enable=0)" in text  # at least one overflow step
    assert "pool grew: write_req_capacity 32 -> 64" in text  # a resize mid-run
    summary = text.split("summary", 1)[1]
    overflow = int(summary.split("overflow steps (verify skipped)")[1].split()[0])
    assert overflow >= 1


def test_flags_with_the_kernels(capsys):
    code = run(["--steps", "12", "--max-batch", "6", "--seed", "3", *KERNELS])
    out = capsys.readouterr().out
    assert code == 0
    assert "12 steps on" in out and "planner: launch_plan (Triton kernels" in out
    assert "steps                                12" in out
    assert "plans differing from plan_reference  0" in out
    if torch.cuda.is_available():
        assert "replayed from CUDA graphs" in out and "graph captures" in out


def test_seed_changes_the_run(capsys):
    run(["--steps", "8", "--planner", "reference", "--seed", "1"])
    first = capsys.readouterr().out.split("summary")[1]
    run(["--steps", "8", "--planner", "reference", "--seed", "2"])
    second = capsys.readouterr().out.split("summary")[1]
    assert first.split("time per plan")[0] != second.split("time per plan")[0]


def test_injected_corruption_turns_the_status_word_non_zero(capsys):
    code = run(["--steps", "14", "--max-batch", "6", "--inject-corruption", *KERNELS])
    out = capsys.readouterr().out
    assert code == 0
    assert "injected req_pool_indices past the table -> status <PlanStatus.REQ_POOL_INDEX_OUT_OF_RANGE" in out
    assert "injected prefix_lens past max_seq_len -> status <PlanStatus.PREFIX_LEN_OUT_OF_RANGE" in out
    assert "injected valid length past the token pool -> status <PlanStatus.VALID_LEN_OUT_OF_RANGE" in out
    flags = out.split("status flags seen")[1].splitlines()[0]
    assert "OK" not in flags and "REQ_POOL_INDEX_OUT_OF_RANGE" in flags
    assert "corrupted steps injected             3" in out


def test_injected_corruption_with_the_reference_is_rejected(capsys):
    code = run(["--steps", "5", "--max-batch", "6", "--inject-corruption", "--planner", "reference"])
    out = capsys.readouterr().out
    assert code == 0
    assert "req_pool_indices past the table -> rejected: kv-canary: req_pool_indices[0]" in out
    assert "REQ_POOL_INDEX_OUT_OF_RANGE" in out.split("status flags seen")[1]


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--steps", "--max-batch", "--device", "--seed", "--inject-corruption", "--planner"):
        assert flag in out


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["--steps", "0"])
    assert exit_info.value.code == 2
    assert "--steps and --max-batch must be >= 1" in capsys.readouterr().err

"""The split write's probe (``benchmarks.probes.write_split``, the lead's H200 run) at tiny
sizes under the interpreter: every case's chain + stamp checked equal to ``launch_write``,
the stamps timed from a replay of fresh fills (each stamp counted its run, none stale),
the GEMM's code path beside the chain, host times, and the three tables printed; with
``--stamp-shapes``, the stamp of other programs checked equal too and timed beside."""

import re

from benchmarks.probes import write_split


def test_the_write_split_probe_runs_its_cases(capsys):
    # (128 x 4: not the default's 32 x 1, so the config's switch is what is checked)
    assert write_split.main(["--smoke", "--stamp-shapes", "128x4"]) == 0
    out = re.sub(r" +", " ", capsys.readouterr().out)  # the tables' padding
    assert "| case | real-KV | launch_write | chain alone | stamp alone | stamp 128 x 4 |" in out
    for case in ("decode 9 x 1", "mixed prefill 2 x 16", "long prefill 1 x 24"):
        for mode in ("NONE", "PARTIAL"):
            assert f"| {case} | {mode} |" in out, (case, mode)
    assert (
        "| chain of | sleep ns | maxnreg | chain us | GEMM alone | GEMM beside | slowdown |" in out
    )
    assert "| case | real-KV | launch_write | chain | chain + stamp | stamp (difference) |" in out

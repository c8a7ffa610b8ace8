"""``benchmarks.phases``: the per-phase host timers that ``runtime_host --phases`` and
``engine_share --phases`` install count every call of the runtime's phases per step kind,
and leave the runtime as it was."""

from __future__ import annotations

import pytest
import torch

import kv_canary_engines.host as host_module
import kv_canary_engines.runtime as runtime_module
from benchmarks.phases import Phases
from benchmarks.probes import runtime_host


def test_phases_count_each_phase_per_step_kind_and_are_removed():
    args = runtime_host.parse(["--requests", "6", "--prompt", "40", "--generate", "6"])
    args.max_batch_tokens, args.page_size, args.poll_every = 64, 16, 4
    steps = runtime_host.workload(args, torch.device("cpu"))
    kinds = {k: sum(s.kind == k for s in steps) for k in ("prefill", "decode")}
    assert kinds["prefill"] and kinds["decode"]
    original = runtime_module.CanaryRuntime.__dict__["begin_step"]
    stage, flat = host_module.Staging.__dict__["stage"], runtime_module._flat
    phases = Phases()
    try:
        assert runtime_module.CanaryRuntime.__dict__["begin_step"] is not original
        assert host_module.Staging.__dict__["stage"] is not stage
        with pytest.raises(RuntimeError, match=r"kv-canary: benchmarks\.phases: .* already"):
            Phases()  # a second set would time the first one's wrappers
        runtime_host.run("kv_canary_engines", steps, args, torch.device("cpu"))
    finally:
        phases.remove()
    assert runtime_module.CanaryRuntime.__dict__["begin_step"] is original
    assert (host_module.Staging.__dict__["stage"], runtime_module._flat) == (stage, flat)
    Phases().remove()  # installable again once removed
    for kind, count in kinds.items():
        assert phases.calls[(kind, "begin_step")] == count
        assert phases.calls[(kind, "end_step")] == count
        assert phases.calls[(kind, "  _prepare")] == count
        assert phases.calls[(kind, "    Staging.stage")] == count  # one staging a step
        # (inclusive times: a step's preparation lies inside its begin_step)
        assert 0 < phases.seconds[(kind, "  _prepare")] <= phases.seconds[(kind, "begin_step")]
    # HEAD + TAIL: both writes of a step in one call, through the probe's stand-in stages
    assert phases.calls[("decode", "  _write_pair")] == kinds["decode"]
    assert phases.calls[("decode", "  _write")] == 0
    polls = sum(phases.calls[(k, "  poll")] for k in kinds)
    assert polls == len(steps) // args.poll_every
    table = phases.table()
    assert "| decode  | begin_step" in table and "| prefill | begin_step" in table

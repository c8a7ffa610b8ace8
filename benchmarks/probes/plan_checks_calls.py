"""How many Python-level calls do the plan's per-launch checks make?

    python -m benchmarks.probes.plan_checks_calls

Counts the calls (functions, and C functions and methods such as ``t.data_ptr()``) that one
``PlanBuffers.check()`` and one ``validate_plan_args`` make: a deterministic companion of
``plan_checks_host`` on a noisy host. Attribute reads served by C getters (``t.shape``,
``t.dtype``) are not calls and are not counted.

Last answer (CPU, 2026-12-01, this tree: d175989's library): ``PlanBuffers.check()`` 7 calls
(2 of Python functions), ``validate_plan_args`` 32 (4): since the fields became aliases,
``check()`` re-tests the arena only. Before (2026-11-30, d75635c): 30 (3) and 56 (6).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch

from benchmarks.harness import logged
from kv_canary_buffers import PlanBuffers, validate_plan_args


def count(fn) -> Counter:
    fn()  # warm caches
    seen: Counter = Counter()

    def prof(frame, event, arg):
        if event == "call":
            seen["python"] += 1
        elif event == "c_call":
            seen["c"] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def main() -> int:
    bs = 256
    b = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=1 << 16, device="cpu")
    i64 = dict(dtype=torch.int64)
    kwargs = dict(
        req_pool_indices=torch.ones(bs, **i64),
        prefix_lens=torch.ones(bs, **i64),
        extend_seq_lens=torch.ones(bs, **i64),
        req_to_token=torch.zeros(bs + 1, 64, dtype=torch.int32),
        swa_window_size=16,
        full_to_swa_index_mapping=torch.zeros(1024, **i64),
        req_to_verify_expected_tokens=torch.zeros(bs + 1, 64, dtype=torch.int32),
        req_to_verify_expected_tokens_valid_lens=torch.ones(bs, **i64),
    )
    for name, fn in (
        ("PlanBuffers.check()", b.check),
        ("validate_plan_args", lambda: validate_plan_args(b, **kwargs)),
    ):
        c = count(fn)
        print(
            f"{name:22s} python calls {c['python']:3d}  C calls {c['c']:3d}  "
            f"total {c['python'] + c['c']:3d}"
        )
    return 0


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())

"""Run the Triton plan on data outside the tables, for compute-sanitizer:

    PYTHONPATH=. compute-sanitizer --tool memcheck python scripts/memcheck/plan.py

Every out-of-range kind of tests/plan/test_out_of_range.py, then a large batch whose rows all
point past the tables (on both large-batch paths: one launch and three), a one-launch
plan whose ticket counters another launch left taken (PLAN_SYNC_LOST), the large batch
from a block table, and int64 edges.
Prints the status word of each and checks it against the oracle; memcheck reports any
read or write outside a tensor.
"""

import torch

from kv_canary_buffers import PlanBuffers, PlanStatus
from kv_canary_kernels import launch_plan
from kv_canary_kernels.config import launch_config
from tests.helpers import LARGE_PATHS
from tests.helpers.oracle import loop_plan
from tests.helpers.plan import assert_matches_oracle
from tests.plan.test_out_of_range import CASES, base


def main() -> int:
    dev = "cuda"
    for name, (mutate, bit, _msg) in sorted(CASES.items()):
        kwargs = base(dev)
        mutate(kwargs)
        buffers = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=32, device=dev)
        launch_plan(buffers, **kwargs)
        expected = loop_plan(write_req_capacity=4, verify_capacity=32, pad_bad=True, **kwargs)
        assert_matches_oracle(buffers, 3, expected)
        flags = buffers.take_status()
        assert flags == bit, (name, flags, bit)
        print(f"{name:28s} status={flags!r}")

    # 5000 rows, every kind at once, two-level scan and many entry blocks.
    g = torch.Generator().manual_seed(0)
    bs, rows, cols = 5000, 100, 64
    kwargs = dict(
        req_pool_indices=torch.randint(-3, rows + 3, (bs,), generator=g),
        prefix_lens=torch.randint(0, cols + 20, (bs,), generator=g),
        extend_seq_lens=torch.randint(0, 3, (bs,), generator=g),
        req_to_token=torch.randint(-1, 4000, (rows, cols), generator=g).to(torch.int32),
        swa_window_size=16,
        full_to_swa_index_mapping=torch.randint(0, 10**6, (3000,), generator=g),
        req_to_verify_expected_tokens=torch.randint(0, 9, (rows - 5, cols - 4), generator=g).to(
            torch.int32
        ),
        req_to_verify_expected_tokens_valid_lens=torch.randint(0, cols + 9, (bs,), generator=g),
        kv_token_id_vs_position_offset=1,
    )
    expected = loop_plan(write_req_capacity=bs, verify_capacity=bs * 16, pad_bad=True, **kwargs)
    kwargs = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    for path, changes in LARGE_PATHS.items():
        buffers = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=bs * 16, device=dev)
        with launch_config(**changes):
            launch_plan(buffers, **kwargs)
        assert_matches_oracle(buffers, bs, expected)
        flags = buffers.take_status()
        assert flags == expected["flags"], (flags, expected["flags"])
        assert flags == (
            PlanStatus.REQ_POOL_INDEX_OUT_OF_RANGE
            | PlanStatus.PREFIX_LEN_OUT_OF_RANGE
            | PlanStatus.LUT_SLOT_OUT_OF_RANGE
            | PlanStatus.POOL_ROW_OUT_OF_RANGE
            | PlanStatus.VALID_LEN_OUT_OF_RANGE
        )
        print(f"{'all kinds, bs=5000':20s} {path:22s} status={flags!r}")
    # Counters left taken: no program of the launch is a scanner; the workers give up.
    buffers = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=bs * 16, device=dev)
    buffers.launch_sync.fill_(10**6)
    with launch_config(one_launch_max_polls=1000):
        launch_plan(buffers, **kwargs)
    flags = buffers.take_status()
    assert flags & PlanStatus.PLAN_SYNC_LOST, flags
    launch_plan(buffers, **kwargs)  # sound again
    assert_matches_oracle(buffers, bs, expected)
    assert buffers.take_status() == expected["flags"]
    print(f"{'counters left taken':43s} status={flags!r}, then sound")
    # The same rows from a block table (page 16; ids past the LUT, -1 holes), rows and
    # prefixes past it: every read of the table stays inside it.
    from tests.helpers.plan import random_block_table

    paged = dict(kwargs)
    del paged["req_to_token"]
    paged["block_table"] = random_block_table(g, rows=rows, blocks=3, n_blocks=300).to(dev)
    paged["page_size"] = 16
    expected = loop_plan(
        write_req_capacity=bs,
        verify_capacity=bs * 16,
        pad_bad=True,
        **{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in paged.items()},
    )
    for path, changes in LARGE_PATHS.items():
        buffers = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=bs * 16, device=dev)
        with launch_config(**changes):
            launch_plan(buffers, **paged)
        assert_matches_oracle(buffers, bs, expected)
        flags = buffers.take_status()
        assert flags == expected["flags"], (flags, expected["flags"])
        print(f"{'block table, bs=5000':20s} {path:22s} status={flags!r}")
    for changes in LARGE_PATHS.values():
        with launch_config(**changes):
            extremes(dev)
    print("gpu_memcheck: all plans matched the padding oracle")
    return 0


def extremes(dev: str) -> None:
    """Per-row values from the int64 edges on both kernel paths, windows and offsets at
    theirs (docs/contract.md, "Extreme values"): before the wrap-free arithmetic the
    three-launch path wrote row hints far past their buffer here."""
    from tests.plan.test_extremes import EDGES

    g = torch.Generator().manual_seed(1)
    edges = torch.tensor(EDGES)

    def pick(bs: int) -> torch.Tensor:
        return edges[torch.randint(0, len(EDGES), (bs,), generator=g)]

    for bs in (300, 5000):
        for window, offset in ((0, 0), (3, 2**63 - 1), (2**63 - 1, -(2**63)), (2**31, 1)):
            rp = torch.randint(0, 4, (bs,), generator=g)
            rp[torch.rand(bs, generator=g) < 0.2] = edges[
                torch.randint(0, len(EDGES), (1,), generator=g)
            ]
            small = torch.rand(bs, generator=g) < 0.5
            prefix = torch.where(small, torch.randint(-2, 12, (bs,), generator=g), pick(bs))
            kwargs = dict(
                req_pool_indices=rp,
                prefix_lens=prefix,
                extend_seq_lens=pick(bs),
                req_to_token=torch.randint(-1, 30, (4, 10), generator=g).to(torch.int32),
                swa_window_size=window,
                full_to_swa_index_mapping=torch.randint(0, 1000, (28,), generator=g),
                req_to_verify_expected_tokens=torch.randint(0, 9, (3, 8), generator=g).to(
                    torch.int32
                ),
                req_to_verify_expected_tokens_valid_lens=pick(bs),
                kv_token_id_vs_position_offset=offset,
            )
            for capacity in (64, 4 * bs):
                expected = loop_plan(
                    write_req_capacity=bs, verify_capacity=capacity, pad_bad=True, **kwargs
                )
                on_dev = {
                    k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()
                }
                buffers = PlanBuffers.allocate(
                    write_req_capacity=bs, verify_capacity=capacity, device=dev
                )
                launch_plan(buffers, **on_dev)
                assert_matches_oracle(buffers, bs, expected)
                assert buffers.take_status() == expected["flags"]
                print(
                    f"{'extremes':12s} bs={bs:5d} W={window:<20d} offset={offset:<21d} "
                    f"cap={capacity:5d} enable={int(buffers.verify_enable)} "
                    f"entries={int(buffers.verify_num_valid)}"
                )


if __name__ == "__main__":
    raise SystemExit(main())

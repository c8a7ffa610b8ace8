"""gather_violation_reports over two processes on the gloo backend (CPU): each rank owns a
store, some ranks have violations, rank 0 gets one report for all."""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kv_canary_buffers import CanaryStore, PlanBuffers, ViolationReport, plan_reference
from kv_canary_buffers.distributed import gather_violation_reports
from kv_canary_buffers.status import FailBits
from kv_canary_buffers.verify import verify_reference

WORLD = 2


def _report(rank: int, corrupt: bool) -> ViolationReport:
    """A store whose slot 20 + rank is corrupted (or not), verified once."""
    table = (16 * torch.arange(4)[:, None] + torch.arange(16)[None, :]).to(torch.int32)
    plan = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=16, device="cpu")
    plan_reference(
        plan,
        req_pool_indices=torch.tensor([1]),
        prefix_lens=torch.tensor([3]),
        extend_seq_lens=torch.tensor([0]),
        req_to_token=table,
    )
    store = CanaryStore.allocate(num_slots=64, violation_capacity=4, device="cpu")
    # records of slots 16, 17, 18: a clean chain
    from kv_canary_buffers.hashing import H0_SIGNED, mix3_int

    chain = H0_SIGNED
    for pos, slot in enumerate((16, 17, 18)):
        store.records[slot] = torch.tensor([100 + pos, pos, chain, 0])
        chain = mix3_int(chain, 100 + pos, pos)
    store.owners[17] = 30 + rank  # slot 17 last written by request 30 + rank, 18 never
    if corrupt:
        store.records[17, 1] = 7  # position off: POSITION at slot 17, CHAIN at slot 18
    verify_reference(store, plan, launch_tag=rank)
    if rank == 1:  # a verify that checked nothing, counted
        plan.verify_enable.fill_(0)
        verify_reference(store, plan, launch_tag=rank)
    return store.take_violations()


def _worker(rank: int, init_file: str, corrupt_ranks, dst, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        calls = []
        original = dist.all_gather

        def counting(*args, **kwargs):
            calls.append(1)
            return original(*args, **kwargs)

        dist.all_gather = counting
        try:
            out = gather_violation_reports(_report(rank, rank in corrupt_ranks), dst=dst)
        finally:
            dist.all_gather = original
        results[rank] = (
            None
            if out is None
            else (
                out.appended,
                out.kernel_runs,
                out.slots_processed,
                [
                    (v.rank, v.violation.slot, int(v.violation.fail_bits), v.violation.launch_tag)
                    + (v.violation.req_pool_index, v.violation.expected_position, v.violation.owner)
                    for v in out.violations
                ],
                len(out.per_rank),
                str(out),
                out.verify_skipped,
                out.req_pool_indices(),
            ),
            len(calls),
        )
    finally:
        dist.destroy_process_group()


def _run(corrupt_ranks, dst):
    with tempfile.TemporaryDirectory() as tmp:
        manager = mp.Manager()
        results = manager.dict()
        mp.spawn(
            _worker,
            args=(os.path.join(tmp, "init"), corrupt_ranks, dst, results),
            nprocs=WORLD,
            join=True,
        )
        return dict(results)


@pytest.mark.parametrize("corrupt_ranks", [(1,), (0, 1)])
def test_gather_tags_each_violation_with_its_rank(corrupt_ranks):
    results = _run(corrupt_ranks, 0)
    (appended, runs, processed, rows, ranks, text, skipped, requests), calls = results[0]
    assert results[1][0] is None  # only dst gets the report
    assert ranks == WORLD and runs == WORLD + 1 and processed == 3 * WORLD
    assert skipped == 1
    # slot 17's position is off, so is the hash slot 18 chains from it; each row with its
    # context: request 1's entries at positions 1 and 2, slot 17's writer, 18's unknown
    assert appended == 2 * len(corrupt_ranks)
    assert rows == [
        row
        for r in corrupt_ranks
        for row in (
            (r, 17, int(FailBits.POSITION), r, 1, 1, 30 + r),
            (r, 18, int(FailBits.CHAIN), r, 1, 2, -1),
        )
    ]
    assert requests == tuple(sorted({1, *(30 + r for r in corrupt_ranks)}))
    assert calls == 2 and results[1][1] == 2  # counts, then the rows
    assert "rank" in text and "POSITION" in text and "; requests 1, 3" in text


def test_no_violations_costs_one_small_collective_and_every_rank_can_receive():
    results = _run((), None)
    for rank in range(WORLD):
        (appended, runs, _processed, rows, _ranks, text, skipped, _), calls = results[rank]
        assert appended == 0 and rows == [] and runs == WORLD + 1 and skipped == 1
        assert calls == 1
        assert "no violations on 2 rank(s)" in text and "1 verify call(s) skipped" in text


def test_without_a_process_group_the_error_says_so():
    report = _report(0, corrupt=False)
    with pytest.raises(RuntimeError, match="kv-canary: gather_violation_reports needs"):
        gather_violation_reports(report)
    with pytest.raises(TypeError, match="kv-canary: report must be"):
        gather_violation_reports(object())  # type: ignore[arg-type]

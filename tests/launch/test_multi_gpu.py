"""Two GPUs (skipped with fewer): every launcher runs on its buffers' device whatever the
current device is, buffers on two GPUs used alternately from one thread, a graph captured
on a non-default device, and gather_violation_reports over NCCL."""

import os
import tempfile

import pytest
import torch

from kv_canary_buffers import (
    CanaryStore,
    PlanBuffers,
    plan_reference,
    verify_reference,
    write_reference,
)
from kv_canary_kernels import launch_plan, launch_verify, launch_write
from tests.helpers.plan import assert_buffers_equal, poison

pytestmark = pytest.mark.two_gpu


def batch(device, seed, bs=3, cols=64):
    g = torch.Generator().manual_seed(seed)
    rows = bs + 1
    slots = torch.randperm(rows * cols, generator=g) + 1  # slots 1 .. rows * cols
    table = slots.reshape(rows, cols).to(torch.int32).to(device)
    prefix = torch.randint(1, cols - 4, (bs,), generator=g).to(device)
    return dict(
        req_pool_indices=torch.arange(1, bs + 1, device=device),
        prefix_lens=prefix,
        extend_seq_lens=torch.full((bs,), 2, dtype=torch.int64, device=device),
        req_to_token=table,
    ), 2 * rows * cols + 1  # slots: the table's, and as many fresh ones for the writes


def step_inputs(plan, table, device, seed):
    """Tokens for the plan's write rows, written to slots past the table's (never a seed:
    a row must not write another row's seed, docs/contract-canary.md)."""
    g = torch.Generator().manual_seed(seed)
    n = int(plan.write_offsets[int(plan.write_num_valid_reqs)])
    return dict(
        input_ids=torch.randint(0, 1000, (n,), generator=g).to(device),
        positions=torch.arange(n, device=device),
        out_cache_loc=(table.numel() + 1 + torch.randperm(table.numel(), generator=g)[:n]).to(
            device
        ),
    )


def run_both(device, seed, bs):
    """plan, verify, write with the kernels and with the references; compare."""
    kw, num_slots = batch(device, seed, bs=bs)
    out = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=bs * 64, device=device)
    ref = PlanBuffers.allocate(write_req_capacity=bs, verify_capacity=bs * 64, device=device)
    poison(out)
    launch_plan(out, **kw)
    plan_reference(ref, **kw)
    assert_buffers_equal(out, ref, bs)
    s_out = CanaryStore.allocate(num_slots=num_slots, violation_capacity=64, device=device)
    s_ref = CanaryStore.allocate(num_slots=num_slots, violation_capacity=64, device=device)
    launch_verify(s_out, out)
    verify_reference(s_ref, ref)
    step = step_inputs(ref, kw["req_to_token"], device, seed)
    launch_write(s_out, out, **step)
    write_reference(s_ref, ref, **step)
    torch.cuda.synchronize(device)
    assert torch.equal(s_out.records, s_ref.records)
    assert int(s_out.violation_count) == int(s_ref.violation_count) > 0
    assert int(s_out.slots_processed) == int(s_ref.slots_processed)


@pytest.mark.parametrize("bs", [3, 2000])
def test_launchers_run_on_the_buffers_device_not_the_current_one(bs):
    torch.cuda.set_device(0)
    run_both(torch.device("cuda", 1), seed=bs, bs=bs)
    assert torch.cuda.current_device() == 0  # the launchers restored it


def test_buffers_on_two_gpus_used_alternately_from_one_thread():
    torch.cuda.set_device(0)
    for i in range(6):
        run_both(torch.device("cuda", i % 2), seed=100 + i, bs=5 + i)


def test_graph_captured_on_a_non_default_device_replays():
    dev = torch.device("cuda", 1)
    kw, num_slots = batch(dev, 7, bs=8)
    plan = PlanBuffers.allocate(write_req_capacity=8, verify_capacity=512, device=dev)
    ref = PlanBuffers.allocate(write_req_capacity=8, verify_capacity=512, device=dev)
    store = CanaryStore.allocate(num_slots=num_slots, violation_capacity=64, device=dev)
    s_ref = CanaryStore.allocate(num_slots=num_slots, violation_capacity=64, device=dev)
    plan_reference(ref, **kw)
    step = step_inputs(ref, kw["req_to_token"], dev, 7)
    with torch.cuda.device(1):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            launch_plan(plan, **kw)
            launch_verify(store, plan)
            launch_write(store, plan, **step)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # torch.cuda.graph's default capture stream is on the device current when the
        # process first captured (device 0 after the other GPU tests): capture on cuda:1's.
        with torch.cuda.graph(graph, stream=torch.cuda.Stream(dev)):
            launch_plan(plan, **kw)
            launch_verify(store, plan)
            launch_write(store, plan, **step)
    torch.cuda.set_device(0)
    for _ in range(3):
        graph.replay()
        verify_reference(s_ref, ref)
        write_reference(s_ref, ref, **step)
    verify_reference(s_ref, ref)  # the eager warm-up step
    write_reference(s_ref, ref, **step)
    torch.cuda.synchronize(dev)
    assert torch.equal(store.records, s_ref.records)
    assert int(store.kernel_runs) == int(s_ref.kernel_runs) == 8
    assert int(store.violation_count) == int(s_ref.violation_count)


def test_capture_on_another_devices_stream_is_refused_before_any_launch():
    dev = torch.device("cuda", 1)
    kw, num_slots = batch(dev, 9, bs=4)
    plan = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=256, device=dev)
    store = CanaryStore.allocate(num_slots=num_slots, violation_capacity=64, device=dev)
    launch_plan(plan, **kw)
    torch.cuda.synchronize(dev)
    before = plan.write_offsets.clone(), store.kernel_runs.clone()
    torch.cuda.set_device(0)
    graph = torch.cuda.CUDAGraph()
    refused = r"kv-canary: a CUDA graph is being captured on a stream of cuda:0 but the buffers"
    with (
        pytest.raises(RuntimeError, match=refused),
        torch.cuda.graph(graph, stream=torch.cuda.Stream(0)),
    ):
        launch_verify(store, plan)
    torch.cuda.synchronize(dev)
    assert torch.equal(plan.write_offsets, before[0])
    assert torch.equal(store.kernel_runs, before[1])


def _nccl_worker(rank, init_file, results):
    import torch.distributed as dist

    from kv_canary_buffers.distributed import gather_violation_reports

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        dev = torch.device("cuda", rank)
        kw, num_slots = batch(dev, rank, bs=4)
        plan = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=256, device=dev)
        launch_plan(plan, **kw)
        store = CanaryStore.allocate(num_slots=num_slots, violation_capacity=512, device=dev)
        if rank == 1:
            launch_verify(store, plan, launch_tag=11)  # records never written: violations
        report = store.take_violations()
        out = gather_violation_reports(report, dst=0)
        results[rank] = (
            None
            if out is None
            else (
                out.appended,
                sorted({v.rank for v in out.violations}),
                report.appended,
            )
        )
    finally:
        dist.destroy_process_group()


def test_gather_over_nccl_on_two_gpus():
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        results = mp.Manager().dict()
        mp.spawn(_nccl_worker, args=(os.path.join(tmp, "init"), results), nprocs=2, join=True)
        appended, ranks, _ = results[0]
        assert results[1] is None
        assert ranks == [1] and appended > 0

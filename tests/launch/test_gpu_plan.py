"""GPU-only tests (skipped without CUDA): CUDA-graph capture and replay, no allocation,
no recompilation, and differential tests at engine sizes."""

import pytest
import torch

from kv_canary_buffers import GraphInputs, PlanBuffers, PlanStatus, plan_reference
from kv_canary_kernels import launch_plan
from kv_canary_kernels.plan.entries import plan_entries_kernel
from kv_canary_kernels.plan.large_batch import plan_large_batch_kernel
from kv_canary_kernels.plan.offsets import plan_offsets_kernel, scan_block_sums_kernel
from kv_canary_kernels.plan.small_batch import plan_small_batch_kernel
from tests.helpers.plan import (
    assert_buffers_equal,
    expand_block_table,
    make_rows,
    make_tables,
    poison,
    random_block_table,
)

pytestmark = pytest.mark.gpu
DEV = "cuda"


def engine_batch(seed, *, bs, rows=None, max_prefix=600, window=0, pool=True, lut=True):
    g = torch.Generator().manual_seed(seed)
    rows = rows or bs + 1
    max_seq_len = max_prefix + 8
    tables = make_tables(
        g,
        rows=rows,
        max_seq_len=max_seq_len,
        n_slots=rows * 64,
        lut=lut or window > 0,
        pool_cols=max_seq_len if pool else None,
        device=DEV,
    )
    per_row = make_rows(
        g,
        bs=bs,
        rows=rows,
        max_prefix=max_prefix,
        pool_cols=max_seq_len if pool else None,
        device=DEV,
    )
    kwargs = {k: v for k, v in {**tables, **per_row}.items() if v is not None}
    kwargs["swa_window_size"] = window
    kwargs["kv_token_id_vs_position_offset"] = seed % 2
    return kwargs


@pytest.mark.parametrize("bs", [0, 1, 16, 17, 1000, 1024, 4097, 20000])
@pytest.mark.parametrize("window", [0, 100])
def test_kernels_equal_reference_at_engine_sizes(bs, window):
    kwargs = engine_batch(bs + window, bs=bs, window=window)
    ref = PlanBuffers.allocate(
        write_req_capacity=max(bs, 1) + 5, verify_capacity=12_000_000, device=DEV
    )
    out = PlanBuffers.allocate(
        write_req_capacity=max(bs, 1) + 5, verify_capacity=12_000_000, device=DEV
    )
    poison(ref)
    poison(out)
    plan_reference(ref, **kwargs)
    launch_plan(out, **kwargs)
    assert_buffers_equal(out, ref, bs)
    assert out.take_status() == PlanStatus.OK


def test_overflow_at_engine_size_skips_entries():
    kwargs = engine_batch(7, bs=3000)
    ref = PlanBuffers.allocate(write_req_capacity=3000, verify_capacity=1000, device=DEV)
    out = PlanBuffers.allocate(write_req_capacity=3000, verify_capacity=1000, device=DEV)
    poison(ref)
    poison(out)
    plan_reference(ref, **kwargs)
    launch_plan(out, **kwargs)
    assert int(out.verify_enable) == 0
    assert (out.verify_slot_indices == -7777).all()
    assert_buffers_equal(out, ref, 3000)


def _cache_sizes():
    sizes = []
    kernels = (
        plan_small_batch_kernel,
        scan_block_sums_kernel,
        plan_offsets_kernel,
        plan_entries_kernel,
        plan_large_batch_kernel,
    )
    for fn in kernels:
        sizes.append(sum(len(c[0]) for c in fn.device_caches.values()))
    return sizes


def test_new_batch_sizes_and_capacities_do_not_recompile():
    buffers = PlanBuffers.allocate(write_req_capacity=7000, verify_capacity=5_000_000, device=DEV)
    launch_plan(buffers, **engine_batch(1, bs=7000))  # the three launches (>= 6144 rows)
    launch_plan(buffers, **engine_batch(2, bs=2000))  # the eager one-launch large path
    for seed, bs in enumerate([17, 300, 700]):  # one-launch path, each row tile
        launch_plan(buffers, **engine_batch(20 + seed, bs=bs))
    before = _cache_sizes()
    assert all(before), f"a kernel was not compiled by the warm-up: {before}"
    for i, bs in enumerate([0, 1, 16, 32, 256, 257, 512, 513, 1023, 1024, 1025, 4096, 4097]):
        launch_plan(buffers, **engine_batch(10 + i, bs=bs))
    bigger = buffers.resize(write_req_capacity=7777, verify_capacity=5_000_001)
    launch_plan(bigger, **engine_batch(3, bs=7777))
    launch_plan(bigger, **engine_batch(4, bs=1))
    launch_plan(bigger, **engine_batch(5, bs=999))
    torch.cuda.synchronize()
    assert _cache_sizes() == before


def test_no_device_allocation_after_warm_up():
    buffers = PlanBuffers.allocate(write_req_capacity=4096, verify_capacity=3_000_000, device=DEV)
    batches = [
        engine_batch(s, bs=bs, window=w)
        for s, (bs, w) in enumerate([(1, 0), (256, 64), (4096, 0), (300, 64)])
    ]
    for kwargs in batches:
        launch_plan(buffers, **kwargs)
    torch.cuda.synchronize()
    start = torch.cuda.memory_stats()["allocation.all.allocated"]
    for i in range(100):
        launch_plan(buffers, **batches[i % len(batches)])
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == start


@pytest.mark.parametrize("capacity", [64, 1536])  # one-launch path; three-launch path (PDL)
@pytest.mark.parametrize("window", [0, 64])
def test_captured_plan_replays_any_batch_up_to_capacity(window, capacity):
    rows, max_seq_len = capacity + 1, 512
    g = torch.Generator().manual_seed(window)
    tables = make_tables(
        g,
        rows=rows,
        max_seq_len=max_seq_len,
        n_slots=rows * max_seq_len,
        lut=True,
        pool_cols=max_seq_len,
        device=DEV,
    )
    buffers = PlanBuffers.allocate(
        write_req_capacity=capacity, verify_capacity=capacity * max_seq_len, device=DEV
    )
    staging = GraphInputs.for_buffers(buffers)
    static = dict(
        req_to_token=tables["req_to_token"],
        full_to_swa_index_mapping=tables["full_to_swa_index_mapping"],
        req_to_verify_expected_tokens=tables["req_to_verify_expected_tokens"],
        swa_window_size=window,
        **staging.plan_kwargs(with_valid_lens=True),
    )
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch_plan(buffers, **static)  # warm up (compile) outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch_plan(buffers, **static)

    ref = PlanBuffers.allocate(
        write_req_capacity=capacity, verify_capacity=capacity * max_seq_len, device=DEV
    )
    for _step in range(25):
        n = int(torch.randint(0, capacity + 1, (1,), generator=g))
        rows_in = make_rows(
            g, bs=n, rows=rows, max_prefix=max_seq_len - 1, pool_cols=max_seq_len, device=DEV
        )
        staging.fill(
            req_pool_indices=rows_in["req_pool_indices"],
            prefix_lens=rows_in["prefix_lens"],
            extend_seq_lens=rows_in["extend_seq_lens"],
            valid_lens=rows_in["req_to_verify_expected_tokens_valid_lens"],
        )
        poison(buffers)
        graph.replay()
        # the staging is linked to `buffers` (other buffers refuse it): plan copies
        staged = staging.plan_kwargs(with_valid_lens=True)
        plan_reference(ref, **dict(static, **{k: t.clone() for k, t in staged.items()}))
        assert_buffers_equal(buffers, ref, capacity)
        # the graph's rows past n are padding: the plan of the first n rows is unchanged
        assert (buffers.write_offsets[n:] == buffers.write_offsets[n]).all()
    assert buffers.take_status() == PlanStatus.OK


@pytest.mark.parametrize("capacity", [64, 1536])  # one-launch path; three-launch path (PDL)
@pytest.mark.parametrize("verify", [True, False], ids=["plan", "write-only"])
def test_captured_block_table_plan_replays_new_rows_and_new_pages(capacity, verify):
    """A plan from a block table captured in a CUDA graph (the table is an input like
    req_to_token: read at its address), replayed with new rows and new page ids written
    into the same tensors: every replay equals the reference of the expanded table, and a
    write-only plan replays its write half (no entry written)."""
    page, max_blocks = 16, 8
    rows, max_seq_len = capacity + 1, page * max_blocks
    g = torch.Generator().manual_seed(capacity + verify)
    block_table = random_block_table(g, rows=rows, blocks=max_blocks, n_blocks=4 * rows).to(DEV)
    buffers = PlanBuffers.allocate(
        write_req_capacity=capacity, verify_capacity=capacity * max_seq_len, device=DEV
    )
    staging = GraphInputs.for_buffers(buffers)
    static = dict(block_table=block_table, page_size=page, verify=verify, **staging.plan_kwargs())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch_plan(buffers, **static)  # warm up (compile) outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch_plan(buffers, **static)

    ref = PlanBuffers.allocate(
        write_req_capacity=capacity, verify_capacity=capacity * max_seq_len, device=DEV
    )
    for _step in range(10):
        n = int(torch.randint(0, capacity + 1, (1,), generator=g))
        rows_in = make_rows(g, bs=n, rows=rows, max_prefix=max_seq_len - 1, device=DEV)
        staging.fill(
            req_pool_indices=rows_in["req_pool_indices"],
            prefix_lens=rows_in["prefix_lens"],
            extend_seq_lens=rows_in["extend_seq_lens"],
        )
        block_table.copy_(random_block_table(g, rows=rows, blocks=max_blocks, n_blocks=4 * rows))
        poison(buffers)
        graph.replay()
        staged = {k: t.clone() for k, t in staging.plan_kwargs().items()}
        plan_reference(
            ref, req_to_token=expand_block_table(block_table, page), verify=verify, **staged
        )
        assert_buffers_equal(buffers, ref, capacity)
        if not verify:
            assert (buffers.verify_slot_indices == -7777).all()
    assert buffers.take_status() == PlanStatus.OK

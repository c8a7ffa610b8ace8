"""GPU-only tests of the launchers inside ``torch.compile(fullgraph=True)`` with inductor
(skipped without CUDA): one engine step (plan, HEAD verify, a KV write, HEAD and TAIL
writes, TAIL verify) compiled in one graph equals the eager kernels and the torch
references after every step; no graph break; a CUDA graph of the compiled step, captured
by hand or by ``mode="reduce-overhead"``, replays correctly with refilled inputs.

    PYTHONPATH=. python -m pytest -q tests/compile/test_gpu_compile.py
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from kv_canary_buffers import CanaryStore, PlanBuffers
from kv_canary_kernels import compiled, launch_plan, launch_verify, launch_write
from kv_canary_kernels.compiled import field
from tests.compile.engine_step import (
    BATCHES,
    Engine,
    assert_same_state,
    kernel_step,
    reference_step,
    run_three_ways,
)

pytestmark = [
    pytest.mark.gpu,
    # torch's own compile stack calls torch.jit.script_method, deprecated in recent torch
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated"),
]
DEV = "cuda"
PADDING: tuple = ()  # a batch of no rows: every staged row is padding, no token is written


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    compiled.CALLS.clear()
    yield
    torch._dynamo.reset()


def i64(values):
    return torch.tensor(values, dtype=torch.int64, device=DEV)


def assert_fields_match(out, ref: Engine) -> None:
    """The fields the compiled step returned (views of its arenas) against the
    reference engine's."""
    assert torch.equal(out[0], ref.plan.write_offsets)
    assert torch.equal(out[1], ref.head.violation_count)
    assert torch.equal(out[2], ref.tail.kernel_runs)


def test_compiled_step_equals_eager_and_references():
    step = torch.compile(kernel_step, fullgraph=True)
    comp, _eager, _ref = run_three_ways(step, DEV)
    assert int(comp.head.violation_count) > 0  # the injected bug was reported
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]


def test_no_graph_break():
    e = Engine(DEV)
    e.schedule(BATCHES[0])
    explained = torch._dynamo.explain(kernel_step)(e)
    assert explained.graph_break_count == 0
    assert explained.graph_count == 1


def test_inductor_writes_the_arenas_in_place():
    """Inductor re-inplaces the operators: the kernels write the arenas themselves (no
    copy of an arena per call)."""
    step = torch.compile(kernel_step, fullgraph=True)
    run_three_ways(step, DEV)
    n = len(BATCHES)
    assert compiled.CALLS == {"plan in place": n, "verify in place": 2 * n, "write in place": 2 * n}


def test_cuda_graph_of_the_compiled_step_replays_every_batch():
    """The compiled step (default mode) captured in a CUDA graph by hand after warm-up on
    a side stream, then replayed once per batch with the staging and token tensors
    refilled in place: after each replay the stores, the plan, the KV layer and the
    fields the captured call returned equal the references'."""
    e, ref = Engine(DEV), Engine(DEV)
    step = torch.compile(kernel_step, fullgraph=True)
    for engine in (e, ref):
        engine.schedule(PADDING)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # compiles (dynamo, inductor, the Triton variants), then runs
            step(e)
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(2):
        reference_step(ref)
    torch.cuda.synchronize()
    assert_same_state(e, ref, plan_bytes=False)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(e)  # recorded, not run
    assert counters["stats"]["unique_graphs"] == 1  # the capture did not recompile
    for batch in BATCHES:
        for engine in (e, ref):
            engine.schedule(batch)
        graph.replay()
        reference_step(ref)
        torch.cuda.synchronize()
        assert_same_state(e, ref, plan_bytes=False)
        assert_fields_match(out, ref)
    assert int(e.head.violation_count) > 0


def test_reduce_overhead_replays_every_batch():
    """``mode="reduce-overhead"`` (CUDA graph trees): correct after every call. The
    arenas are marked static at allocation; the KV layer, which the step writes, is
    marked static here as an engine marks its KV cache."""
    e, ref = Engine(DEV), Engine(DEV)
    torch._dynamo.mark_static_address(e.kv)
    step = torch.compile(kernel_step, mode="reduce-overhead", fullgraph=True)
    for batch in BATCHES + BATCHES[:2]:  # warm-up, recording, then replays
        for engine in (e, ref):
            engine.schedule(batch)
        torch.compiler.cudagraph_mark_step_begin()
        out = [int(t[-1]) if t.numel() > 1 else int(t) for t in step(e)]
        reference_step(ref)
        torch.cuda.synchronize()
        assert_same_state(e, ref, plan_bytes=False)
        want = (ref.plan.write_offsets[-1], ref.head.violation_count, ref.tail.kernel_runs)
        assert out == [int(t) for t in want]


def test_reduce_overhead_does_not_skip_cuda_graphs():
    """Separate from the correctness test above: CUDA graph trees accept the graph (no
    "skipping cudagraphs due to mutated inputs"), because the arenas are static inputs."""
    e = Engine(DEV)
    torch._dynamo.mark_static_address(e.kv)
    step = torch.compile(kernel_step, mode="reduce-overhead", fullgraph=True)
    for batch in BATCHES[:3]:
        e.schedule(batch)
        torch.compiler.cudagraph_mark_step_begin()
        step(e)
    assert counters["inductor"]["cudagraph_skips"] == 0


def test_rejected_input_raises_inside_the_compiled_step_and_writes_nothing():
    plan = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=16, device=DEV)
    store = CanaryStore.allocate(num_slots=16, violation_capacity=4, device=DEV)
    table = torch.arange(1, 49, dtype=torch.int32, device=DEV).reshape(6, 8)

    def step(rp, P, E, ids, pos, loc):
        launch_plan(plan, req_pool_indices=rp, prefix_lens=P, extend_seq_lens=E, req_to_token=table)
        launch_write(store, plan, input_ids=ids, positions=pos, out_cache_loc=loc)
        launch_verify(store, plan)
        return field(store, "kernel_runs")

    fn = torch.compile(step, fullgraph=True)
    assert (
        int(fn(i64([1, 2]), i64([0, 0]), i64([1, 1]), i64([7, 8]), i64([0, 0]), i64([1, 9]))) == 2
    )
    plan_before, store_before = plan.arena.tensor.clone(), store.arena.tensor.clone()
    with pytest.raises(ValueError, match="kv-canary: bs = len"):
        fn(i64([1, 2, 3]), i64([0] * 3), i64([1] * 3), i64([7]), i64([0]), i64([1]))
    with pytest.raises(ValueError, match="kv-canary: positions"):
        fn(i64([1, 2]), i64([0, 0]), i64([1, 1]), i64([7, 8]), i64([0]), i64([1, 9]))
    torch.cuda.synchronize()
    assert torch.equal(plan.arena.tensor, plan_before)
    assert torch.equal(store.arena.tensor, store_before)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_large_batch_plans_equal_the_reference(mode):
    """Plans of 1100 to 5000 rows compiled with inductor: eager one-launch plans
    (``default``) and, with ``reduce-overhead``, CUDA graph trees whose warm-up runs the
    one launch and whose capture takes the three; every call equals the reference."""
    from kv_canary_buffers import plan_reference
    from tests.helpers.plan import assert_buffers_equal, poison

    g = torch.Generator().manual_seed(6)
    rows, cols = 64, 600
    table = torch.randint(0, 40000, (rows, cols), generator=g).to(torch.int32).to(DEV)
    plan = PlanBuffers.allocate(write_req_capacity=5000, verify_capacity=3_000_000, device=DEV)

    def step(rp, P, E):
        launch_plan(plan, req_pool_indices=rp, prefix_lens=P, extend_seq_lens=E, req_to_token=table)

    fn = torch.compile(step, mode=mode, fullgraph=True)
    for bs in (1100, 1100, 5000, 1100, 5000):  # each size again: replays in reduce-overhead
        rp = torch.randint(1, rows, (bs,), generator=g).to(DEV)
        P = torch.randint(0, cols + 1, (bs,), generator=g).to(DEV)
        E = torch.randint(0, 4, (bs,), generator=g).to(DEV)
        ref = PlanBuffers.allocate(write_req_capacity=5000, verify_capacity=3_000_000, device=DEV)
        plan_reference(
            ref, req_pool_indices=rp, prefix_lens=P, extend_seq_lens=E, req_to_token=table
        )
        poison(plan)
        fn(rp, P, E)
        torch.cuda.synchronize()
        assert plan.take_status() == 0
        assert_buffers_equal(plan, ref, bs)

"""The launchers inside ``torch.compile(fullgraph=True)`` on the CPU: the Triton kernels
run in the interpreter, called by the ``kv_canary::*`` custom operators
(``kv_canary_kernels.compiled``). Backend ``aot_eager`` (functionalization passes the
operators copies of the arenas) and ``inductor`` (which writes in place); the GPU side is
tests/compile/test_gpu_compile.py."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

from kv_canary_buffers import CanaryStore, PlanBuffers, RealKV, RealKVMode, plan_reference
from kv_canary_kernels import compiled, launch_plan, launch_verify, launch_write
from kv_canary_kernels.compiled import field
from tests.compile.engine_step import BATCHES, Engine, kernel_step, run_three_ways, state

if torch.cuda.is_available():
    pytest.skip("the GPU runs tests/compile/test_gpu_compile.py", allow_module_level=True)

DEV = "cpu"
# torch's own compile stack calls torch.jit.script_method, which torch 2.13 deprecates
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch, on one thread (tiny tensors)."""
    torch._dynamo.reset()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch._dynamo.reset()


def i64(values):
    return torch.tensor(values, dtype=torch.int64)


def test_compiled_step_equals_eager_and_references():
    """plan, HEAD verify, a KV write, HEAD and TAIL writes and TAIL verify compiled in one
    graph: after every step (one of which hands a request another's slot) the stores,
    the plan and the fields read inside the compiled function equal the eager kernels'
    byte for byte and the references'; the operators worked on copies of the arenas."""
    counter = CompileCounterWithBackend("aot_eager")
    compiled.CALLS.clear()
    step = torch.compile(kernel_step, backend=counter, fullgraph=True)
    comp, _eager, _ref = run_three_ways(step, DEV)
    assert counter.frame_count == 1  # one graph, compiled once for every step
    assert state(comp)["head"]["counters"][0] > 0  # the injected bug was reported
    n = len(BATCHES)
    assert compiled.CALLS == {
        "plan on a copy": n,
        "verify on a copy": 2 * n,
        "write on a copy": 2 * n,
    }


def test_inductor_writes_in_place_and_reads_see_it():
    """Inductor (the default backend) calls the operator on the arena itself, and a
    field read after it in the same function sees the plan."""
    plan = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=DEV)
    table = torch.arange(48, dtype=torch.int32).reshape(6, 8)

    def step(rp, P, E):
        launch_plan(plan, req_pool_indices=rp, prefix_lens=P, extend_seq_lens=E, req_to_token=table)
        return field(plan, "write_offsets"), field(plan, "verify_slot_indices")

    compiled.CALLS.clear()
    offsets, slots = torch.compile(step, fullgraph=True)(i64([1, 2]), i64([1, 2]), i64([1, 1]))
    ref = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=DEV)
    plan_reference(ref, req_pool_indices=i64([1, 2]), prefix_lens=i64([1, 2]),
                   extend_seq_lens=i64([1, 1]), req_to_token=table)  # fmt: skip
    assert torch.equal(offsets, ref.write_offsets)
    assert torch.equal(slots[:3], ref.verify_slot_indices[:3])
    assert compiled.CALLS == {"plan in place": 1}


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_plan_from_a_block_table_compiles(backend):
    """``block_table`` (an optional tensor) and ``page_size`` (an int) cross the operator
    (its schema derives from PlanInputs): the compiled plan equals the reference's."""
    plan = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=DEV)
    block_table = torch.tensor([[0, 0], [3, -1], [5, 6]], dtype=torch.int32)

    def step(rp, P, E):
        launch_plan(
            plan, req_pool_indices=rp, prefix_lens=P, extend_seq_lens=E,
            block_table=block_table, page_size=4,
        )  # fmt: skip
        return field(plan, "verify_slot_indices").clone()

    rows = (i64([1, 2]), i64([5, 6]), i64([1, 1]))
    slots = torch.compile(step, backend=backend, fullgraph=True)(*rows)
    ref = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=DEV)
    plan_reference(ref, req_pool_indices=rows[0], prefix_lens=rows[1], extend_seq_lens=rows[2],
                   block_table=block_table, page_size=4)  # fmt: skip
    assert slots[:11].tolist() == [12, 13, 14, 15, -1, 20, 21, 22, 23, 24, 25]
    assert torch.equal(slots[:11], ref.verify_slot_indices[:11])


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_write_only_plan_compiles_with_its_bool(backend):
    """``verify=False`` crosses the operator as its ``bool verify`` argument: the compiled
    plan is the write-only plan (no entry, ``verify_enable = 0``), equal to the reference."""
    plan = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=DEV)
    table = torch.arange(48, dtype=torch.int32).reshape(6, 8)

    def step(rp, P, E):
        launch_plan(
            plan, req_pool_indices=rp, prefix_lens=P, extend_seq_lens=E, req_to_token=table,
            verify=False,
        )  # fmt: skip
        return field(plan, "write_offsets").clone(), field(plan, "verify_enable").clone()

    rows = (i64([1, 2]), i64([1, 2]), i64([1, 1]))
    offsets, enable = torch.compile(step, backend=backend, fullgraph=True)(*rows)
    ref = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=DEV)
    plan_reference(ref, req_pool_indices=rows[0], prefix_lens=rows[1], extend_seq_lens=rows[2],
                   req_to_token=table, verify=False)  # fmt: skip
    assert torch.equal(offsets, ref.write_offsets) and int(enable) == 0
    assert int(plan.verify_num_valid) == 0 and int(plan.verify_enable) == 0


def test_no_graph_break():
    e = Engine(DEV)
    e.schedule(BATCHES[0])
    explained = torch._dynamo.explain(kernel_step)(e)
    assert explained.graph_break_count == 0
    assert explained.graph_count == 1
    ops = [
        n.target.name()
        for g in explained.graphs
        for n in g.graph.nodes
        if isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "kv_canary"
    ]
    assert ops == [f"kv_canary::{op}" for op in ("plan", "verify", "write", "write", "verify")]


def test_rejected_input_raises_inside_compiled_function_and_writes_nothing():
    """Validation runs when the compiled graph runs: a batch larger than the buffers, a
    wrongly typed tensor, a write of another length: the launcher's own kv-canary error,
    and neither arena changed."""
    plan = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=16, device=DEV)
    store = CanaryStore.allocate(num_slots=16, violation_capacity=4, device=DEV)
    table = torch.arange(1, 49, dtype=torch.int32).reshape(6, 8)

    def step(rp, P, E, ids, pos, loc):
        launch_plan(plan, req_pool_indices=rp, prefix_lens=P, extend_seq_lens=E, req_to_token=table)
        launch_write(store, plan, input_ids=ids, positions=pos, out_cache_loc=loc)
        launch_verify(store, plan)

    fn = torch.compile(step, backend="aot_eager", fullgraph=True)
    fn(i64([1, 2]), i64([0, 0]), i64([1, 1]), i64([7, 8]), i64([0, 0]), i64([1, 9]))
    plan_before, store_before = plan.arena.tensor.clone(), store.arena.tensor.clone()
    cases = [
        ((i64([1, 2, 3]), i64([0] * 3), i64([1] * 3), i64([7]), i64([0]), i64([1])),
         "bs = len(req_pool_indices) must be <= write_req_capacity, got 3 > 2"),
        ((i64([1, 2]), i64([0, 0]), torch.ones(2, dtype=torch.int32), i64([7]), i64([0]), i64([1])),
         "extend_seq_lens must have dtype torch.int64, got torch.int32"),
        ((i64([1, 2]), i64([0, 0]), i64([1, 1]), i64([7, 8]), i64([0]), i64([1, 9])),
         "positions"),
    ]  # fmt: skip
    for args, message in cases:
        with pytest.raises((TypeError, ValueError), match="kv-canary: ") as err:
            fn(*args)
        assert message in str(err.value)
        assert torch.equal(plan.arena.tensor, plan_before)
        assert torch.equal(store.arena.tensor, store_before)


def test_wrong_object_fails_while_tracing_with_the_kv_canary_message():
    table = torch.zeros(2, 2, dtype=torch.int32)

    def step(buffers):
        launch_plan(buffers, req_pool_indices=i64([1]), prefix_lens=i64([0]),
                    extend_seq_lens=i64([1]), req_to_token=table)  # fmt: skip

    with pytest.raises(Exception, match="kv-canary: buffers must be a") as err:
        torch.compile(step, backend="aot_eager", fullgraph=True)(object())
    assert isinstance(err.value, torch._dynamo.exc.Unsupported)


def test_attribute_read_of_a_launched_object_does_not_compile():
    """The documented limit: reading ``plan.write_offsets`` in a compiled function that
    launches on ``plan`` makes a second graph input sharing the arena's storage, which
    AOTAutograd refuses (views of one storage with different dtypes, one mutated). If
    this test fails, PyTorch lifted the limit: update docs/user-guide.md."""
    plan = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=8, device=DEV)
    table = torch.zeros(3, 4, dtype=torch.int32)

    def step(rp):
        launch_plan(plan, req_pool_indices=rp, prefix_lens=rp * 0, extend_seq_lens=rp,
                    req_to_token=table)  # fmt: skip
        return plan.write_offsets + 0

    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="different dtypes"):
        torch.compile(step, backend="aot_eager", fullgraph=True)(i64([1]))


def test_new_objects_and_resizes_stop_recompiling():
    """Dynamo guards on the arena's address and layout, then makes them dynamic: a second
    object and a first resize compile again, and after that no object or capacity does
    (12 objects, 5 resizes: 4 compiles)."""
    table = torch.arange(1, 49, dtype=torch.int32).reshape(6, 8)
    counter = CompileCounterWithBackend("aot_eager")

    def step(buffers, rp):
        launch_plan(buffers, req_pool_indices=rp, prefix_lens=rp, extend_seq_lens=rp,
                    req_to_token=table)  # fmt: skip
        return field(buffers, "write_offsets") + 0

    fn = torch.compile(step, backend=counter, fullgraph=True)
    buffers = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=DEV)
    for k in range(12):
        if k in (3, 5, 7, 9, 11):
            buffers = buffers.resize(write_req_capacity=buffers.write_req_capacity + 4)
        elif k:
            buffers = PlanBuffers.allocate(
                write_req_capacity=buffers.write_req_capacity, verify_capacity=16, device=DEV
            )
        got = fn(buffers, i64([1, 2]))
        ref = PlanBuffers.allocate(write_req_capacity=buffers.write_req_capacity,
                                   verify_capacity=16, device=DEV)  # fmt: skip
        plan_reference(ref, req_pool_indices=i64([1, 2]), prefix_lens=i64([1, 2]),
                       extend_seq_lens=i64([1, 2]), req_to_token=table)  # fmt: skip
        assert torch.equal(got, ref.write_offsets)
    assert counter.frame_count <= 4


def test_new_real_kv_objects_stop_recompiling():
    """A RealKV is passed by a handle of its own, which dynamo makes dynamic after the
    second one: five RealKV objects (a rebuilt KV cache each) compile twice."""
    plan = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=8, device=DEV)
    store = CanaryStore.allocate(num_slots=16, violation_capacity=4, device=DEV)
    counter = CompileCounterWithBackend("aot_eager")

    def step(real_kv):
        launch_verify(store, plan, real_kv=real_kv)
        return field(store, "kernel_runs")

    fn = torch.compile(step, backend=counter, fullgraph=True)
    for k in range(5):
        kv = torch.zeros(16, 4, dtype=torch.int64)
        real_kv = RealKV(mode=RealKVMode.PARTIAL, sources=(kv,), page_size=1, bytes_per_token=32)
        assert int(fn(real_kv)) == k + 1
    assert counter.frame_count == 2


def test_field_equals_the_attribute_outside_compiled_code():
    plan = PlanBuffers.allocate(write_req_capacity=3, verify_capacity=8, device=DEV)
    store = CanaryStore.allocate(num_slots=8, violation_capacity=2, device=DEV)
    for obj in (plan, store):
        for f in obj.arena.fields:
            view = field(obj, f.name)
            got = getattr(obj, f.name)
            assert view.data_ptr() == got.data_ptr()
            assert (view.dtype, view.shape) == (got.dtype, got.shape)
    with pytest.raises(ValueError, match="kv-canary: name must be a field of PlanBuffers"):
        field(plan, "records")


def test_copies_of_a_real_kv_are_objects_of_their_own():
    """copy, deepcopy and pickle rebuild a RealKV through its constructor: a handle and a
    fingerprint of its own, so a compiled launch validates the very object it reads (a copy
    carrying the original's handle would be validated as the original while the kernels
    read the copy's sources)."""
    import copy
    import pickle

    from kv_canary_buffers.live import find_real_kv

    src = torch.zeros(32, 16, dtype=torch.uint8)
    kv = RealKV(sources=(src,), mode=RealKVMode.PARTIAL, page_size=1, bytes_per_token=16)
    copies = [copy.copy(kv), copy.deepcopy(kv), pickle.loads(pickle.dumps(kv))]
    handles = {kv._handle} | {c._handle for c in copies}
    assert len(handles) == 4
    for c in copies:
        assert find_real_kv(c._handle) is c
        c.check()  # its fingerprint is its own sources'
    assert copies[0].tensors[0] is src and copies[1].tensors[0] is not src
    store = CanaryStore.allocate(num_slots=32, violation_capacity=4, device=DEV)
    plan = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=4, device=DEV)

    def step(s, p, r):
        launch_verify(s, p, launch_tag=1, real_kv=r)

    fn = torch.compile(step, backend="aot_eager", fullgraph=True)
    fn(store, plan, copies[1])
    del kv
    fn(store, plan, copies[1])  # the original gone: the copy still resolves to itself
    assert int(store.kernel_runs) == 2


def test_arena_handles_are_never_shared():
    """A second Arena object over a live allocation (attrs.evolve) neither takes over nor,
    once dropped, removes the live arena's registry entry."""
    import gc

    import attrs

    from kv_canary_buffers.live import find_arena
    from kv_canary_kernels.compiled import _owner

    plan = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=4, device=DEV)
    other = attrs.evolve(plan.arena)
    assert other.handle != plan.arena.handle and other.base == plan.arena.base
    assert find_arena(plan.arena.handle) is plan.arena
    del other
    gc.collect()
    assert _owner(plan.arena.handle, PlanBuffers, "buffers") is plan


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_large_batch_plans_equal_the_reference(backend):
    """Batches of 1024 rows and more (the eager one-launch path, whose launches are
    numbered by the buffers' arena) in a compiled function, twice on the same buffers:
    each plan equals the reference, with aot_eager's copies of the arena and with
    inductor's in-place writes."""
    from tests.helpers.plan import assert_buffers_equal, poison

    g = torch.Generator().manual_seed(5)
    rows, cols = 40, 24
    table = torch.randint(0, 900, (rows, cols), generator=g).to(torch.int32)
    plan = PlanBuffers.allocate(write_req_capacity=1400, verify_capacity=4000, device=DEV)

    def step(rp, P, E):
        launch_plan(plan, req_pool_indices=rp, prefix_lens=P, extend_seq_lens=E, req_to_token=table)

    fn = torch.compile(step, backend=backend, fullgraph=True)
    for bs in (1100, 1300, 1100):
        rp = torch.randint(1, rows, (bs,), generator=g)
        rp[torch.rand(bs, generator=g) < 0.9] = 0
        P = torch.randint(0, cols + 1, (bs,), generator=g)
        E = torch.randint(0, 4, (bs,), generator=g)
        ref = PlanBuffers.allocate(write_req_capacity=1400, verify_capacity=4000, device=DEV)
        poison(ref)
        plan_reference(
            ref, req_pool_indices=rp, prefix_lens=P, extend_seq_lens=E, req_to_token=table
        )
        poison(plan)
        fn(rp, P, E)
        assert plan.take_status() == 0
        assert_buffers_equal(plan, ref, bs)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_sources_of_their_own_geometries_in_a_compiled_step(backend):
    """A compiled write and verify with real-KV sources of different geometries (a
    [pages, page_size, ...] source, page sizes 1 and 4, read widths) and a KV byte written
    in the same graph before the verify: the records and the violation rows equal the
    eager kernels'. ``aot_eager`` passes the operators copies of the sources, whose
    source table is built over the copies (once per set of addresses); ``inductor``
    passes the sources themselves."""
    from kv_canary_buffers import RealKVSource

    g = torch.Generator().manual_seed(9)
    k = torch.randint(-100, 100, (16, 2, 16), generator=g).to(torch.bfloat16)  # 4 pages of 4
    k = k.view(4, 4, 2, 16)
    v = torch.randint(0, 256, (16, 48), generator=g).to(torch.uint8)

    def real_kv_of(k, v):
        return RealKV(
            mode=RealKVMode.ALL,
            sources=[
                RealKVSource(k, page_size=4, bytes_per_token=64, read_bytes=48),
                RealKVSource(v, page_size=1, bytes_per_token=48, read_bytes=32),
            ],
        )

    tok = dict(input_ids=i64([5, 6, 7]), positions=i64([0, 1, 2]), out_cache_loc=i64([3, 9, 14]))

    def step(store, plan, real_kv, k):
        launch_write(store, plan, real_kv=real_kv, **tok)
        k[2, 1, 0, 0] += 1  # slot 9's first bytes in the first source: a REAL_KV row
        launch_verify(store, plan, launch_tag=4, real_kv=real_kv)
        return field(store, "violation_count") + 0

    def new(k, v):
        plan = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=8, device=DEV)
        plan.write_offsets[:2] = i64([0, 3])
        plan.write_seed_slot_indices[:1] = i64([-1])
        plan.write_num_valid_reqs.fill_(1)
        plan.verify_slot_indices[:3] = i64([3, 9, 14])
        plan.verify_prev_slot_indices[:3] = i64([-1, 3, 9])
        plan.verify_expected_positions[:3] = i64([0, 1, 2])
        plan.verify_expected_tokens[:3] = i64([-1, -1, -1])
        plan.verify_num_valid.fill_(3)
        plan.verify_enable.fill_(1)
        store = CanaryStore.allocate(num_slots=16, violation_capacity=4, device=DEV)
        return store, plan, real_kv_of(k, v)

    compiled.CALLS.clear()
    fn = torch.compile(step, backend=backend, fullgraph=True)
    stores = []
    for run, kv_tensors in (
        ("compiled", (k.clone(), v.clone())),
        ("eager", (k.clone(), v.clone())),
    ):
        store, plan, real_kv = new(*kv_tensors)
        if run == "compiled":
            real_kv_seen = [real_kv]
        count = (fn if run == "compiled" else step)(store, plan, real_kv, kv_tensors[0])
        assert int(count) == 1
        stores.append(store)
    comp, eager = stores
    assert torch.equal(comp.records, eager.records)
    assert torch.equal(comp.violations[:1], eager.violations[:1])
    assert int(comp.violations[0, 1]) == 9 and int(comp.violations[0, 7]) == 4
    copies = compiled._COPY_TABLES.get(real_kv_seen[0], {})
    if backend == "aot_eager":  # the verify read the copy of the written source
        assert compiled.CALLS["verify on a copy"] == 1 and len(copies) == 1
        (table,) = copies.values()
        assert table.shape == (2, 6) and not torch.equal(table, real_kv_seen[0]._source_table)


def test_a_copy_of_a_source_laid_out_otherwise_is_refused():
    """A functionalization copy whose bytes within a row lie elsewhere than the source's
    (strides past the first differ) cannot be read with the source's geometry: refused,
    naming the layouts, before any kernel; a copy that differs only in its row stride is
    read through a table over it."""
    from kv_canary_buffers import RealKVSource

    k = torch.zeros(4, 4, 2, 16, dtype=torch.bfloat16)
    kv = RealKV(mode=RealKVMode.ALL, sources=[RealKVSource(k, page_size=4, bytes_per_token=64)])
    store = CanaryStore.allocate(num_slots=16, violation_capacity=4, device=DEV)
    plan = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=4, device=DEV)
    other = k.transpose(2, 3).contiguous().transpose(2, 3)  # same shape, slots laid out otherwise
    args = (store.arena.tensor, plan.arena.tensor, store.arena.handle, plan.arena.handle, 5, True)
    with pytest.raises(
        ValueError,
        match=r"^kv-canary: the compiled function passed a copy of real_kv.sources\[0\] that "
        r"the kernels cannot read: expected shape \(4, 4, 2, 16\) torch.bfloat16 on cpu with "
        r"strides \(128, 32, 16, 1\) \(but the first\)",
    ):
        compiled._verify_impl(*args, kv._handle, [other])
    assert int(store.kernel_runs) == 0
    wider = torch.zeros(4, 160, dtype=torch.bfloat16)[:, :128].view(4, 4, 2, 16)  # rows 320 B apart
    compiled._verify_impl(*args, kv._handle, [wider])
    assert int(store.kernel_runs) == 1
    (table,) = compiled._COPY_TABLES[kv].values()
    assert table[0, :3].tolist() == [wider.data_ptr(), 320 // 8, 4]

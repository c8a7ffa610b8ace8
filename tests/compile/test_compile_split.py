"""The split write inside ``torch.compile(fullgraph=True)`` on the CPU: ``launch_write_chain``
and ``launch_write_stamp`` traced as the ``kv_canary::write_chain`` / ``write_stamp``
operators (they declare the store's and the workspace's arenas written), with the plan, a
KV write between them (the forward) and the real-KV hash of it, in one graph: the store
equals the eager ``launch_write``'s byte for byte, over steps; a rejected stamp raises its
``kv-canary:`` error from inside the compiled function and writes nothing."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

from kv_canary_buffers import CanaryStore, PlanBuffers, RealKV, RealKVMode, WriteWorkspace
from kv_canary_kernels import (
    compiled,
    launch_plan,
    launch_write,
    launch_write_chain,
    launch_write_stamp,
)

if torch.cuda.is_available():
    pytest.skip("the GPU runs tests/compile/test_gpu_compile.py", allow_module_level=True)

DEV = "cpu"
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch._dynamo.reset()


def i64(values):
    return torch.tensor(values, dtype=torch.int64)


NUM_SLOTS = 49
TABLE = torch.arange(1, 49, dtype=torch.int32).reshape(6, 8)


def objects():
    plan = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=32, device=DEV)
    store = CanaryStore.allocate(num_slots=NUM_SLOTS, violation_capacity=8, device=DEV)
    store.enable_chain_position_check()
    kv = torch.zeros(NUM_SLOTS, 4, dtype=torch.int64)  # 32 bytes a slot
    real_kv = RealKV(mode=RealKVMode.PARTIAL, sources=(kv,), page_size=1, bytes_per_token=32)
    return plan, store, kv, real_kv


STEPS = [  # (rows, prefix lens, new tokens a row)
    ([1, 2], [0, 0], [3, 2]),
    ([1, 2], [3, 2], [1, 1]),
    ([1, 3], [4, 0], [1, 4]),
]


def step_inputs(rows, prefix, new):
    ids, pos, loc = [], [], []
    for r, p, e in zip(rows, prefix, new):
        for k in range(p, p + e):
            ids.append(100 * r + k)
            pos.append(k)
            loc.append(int(TABLE[r, k]))
    return i64(rows), i64(prefix), i64(new), i64(ids), i64(pos), i64(loc)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_compiled_split_step_equals_the_eager_write(backend):
    plan, store, kv, real_kv = objects()
    e_plan, e_store, e_kv, e_real_kv = objects()
    ws = WriteWorkspace.for_store(store, token_capacity=8)

    def step(rp, P, E, ids, pos, loc, fresh_kv):
        launch_plan(plan, req_pool_indices=rp, prefix_lens=P, extend_seq_lens=E, req_to_token=TABLE)
        launch_write_chain(
            store, plan, ws, input_ids=ids, positions=pos, out_cache_loc=loc, launch_tag=5,
            expected_input_ids=ids, expected_positions=pos,
        )  # fmt: skip
        kv.index_copy_(0, loc, fresh_kv)  # the forward writes the KV bytes
        launch_write_stamp(store, plan, ws, real_kv=real_kv)

    counter = CompileCounterWithBackend(backend)
    fn = torch.compile(step, backend=counter, fullgraph=True)
    compiled.CALLS.clear()
    g = torch.Generator().manual_seed(3)
    for rows, prefix, new in STEPS:
        rp, P, E, ids, pos, loc = step_inputs(rows, prefix, new)
        fresh_kv = torch.randint(-(2**40), 2**40, (len(loc), 4), generator=g)
        fn(rp, P, E, ids, pos, loc, fresh_kv)
        launch_plan(e_plan, req_pool_indices=rp, prefix_lens=P, extend_seq_lens=E,
                    req_to_token=TABLE)  # fmt: skip
        e_kv.index_copy_(0, loc, fresh_kv)
        launch_write(
            e_store, e_plan, input_ids=ids, positions=pos, out_cache_loc=loc, launch_tag=5,
            expected_input_ids=ids, expected_positions=pos, real_kv=e_real_kv,
        )  # fmt: skip
        assert torch.equal(store.arena.tensor, e_store.arena.tensor)  # every byte
    assert int(store.kernel_runs) == len(STEPS) and int(store.slots_processed) == 12
    assert counter.frame_count <= 2  # a new n recompiles at most once (dynamic sizes)
    where = "in place" if backend == "inductor" else "on a copy"
    assert compiled.CALLS[f"write_chain {where}"] == len(STEPS)
    assert compiled.CALLS[f"write_stamp {where}"] == len(STEPS)


def test_a_rejected_stamp_raises_inside_the_compiled_function_and_writes_nothing():
    plan, store, _kv, real_kv = objects()
    other = CanaryStore.allocate(num_slots=NUM_SLOTS, violation_capacity=8, device=DEV)
    ws = WriteWorkspace.for_store(store, token_capacity=8)
    rp, P, E, ids, pos, loc = step_inputs(*STEPS[0])
    launch_plan(plan, req_pool_indices=rp, prefix_lens=P, extend_seq_lens=E, req_to_token=TABLE)

    def stamp(target):
        launch_write_stamp(target, plan, ws, real_kv=real_kv)

    fn = torch.compile(stamp, backend="aot_eager", fullgraph=True)
    with pytest.raises(ValueError, match=r"kv-canary: workspace must hold a chain not yet"):
        fn(store)
    launch_write_chain(store, plan, ws, input_ids=ids, positions=pos, out_cache_loc=loc)
    before = other.arena.tensor.clone(), ws.arena.tensor.clone()
    with pytest.raises(ValueError, match=r"kv-canary: store must be the CanaryStore the "):
        fn(other)
    assert torch.equal(other.arena.tensor, before[0]) and torch.equal(ws.arena.tensor, before[1])
    fn(store)  # its own store: stamped
    assert int(store.kernel_runs) == 1 and int(store.slots_processed) == 5

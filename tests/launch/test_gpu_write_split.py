"""GPU-only tests of the split write (skipped without CUDA): the chain captured on a side
stream and the stamp on the capture stream in one CUDA graph (the pattern of
docs/user-guide.md, "The split write": the side stream waits for an event recorded after
the plan, the stamp waits for an event recorded after the chain), replayed with refilled
inputs and checked against the eager ``launch_write`` after each replay, with no device
allocation across replays; and a stamp graph replayed without its chain flagged stale."""

from collections import Counter

import pytest
import torch

from kv_canary_buffers import (
    CanaryStatus,
    CanaryStore,
    GraphInputs,
    PlanBuffers,
    RealKV,
    RealKVMode,
    WriteWorkspace,
)
from kv_canary_kernels import launch_plan, launch_write, launch_write_chain, launch_write_stamp

pytestmark = pytest.mark.gpu
DEV = "cuda"


def rows(store):
    n = min(int(store.violation_count), store.violation_capacity)
    return Counter(map(tuple, store.violations[:n].tolist()))


class Pool:
    def __init__(self, cap_rows=32, cols=64, seed=5):
        self.g = torch.Generator().manual_seed(seed)
        self.cap_rows, self.cols = cap_rows, cols
        self.num_slots = (cap_rows + 1) * cols + 1
        slots = torch.randperm(self.num_slots - 1, generator=self.g) + 1
        self.table = slots.reshape(cap_rows + 1, cols).to(torch.int32).to(DEV)
        self.kv = torch.zeros(self.num_slots, 4, dtype=torch.int64, device=DEV)
        self.real_kv = RealKV(
            mode=RealKVMode.PARTIAL, sources=(self.kv,), page_size=1, bytes_per_token=32
        )
        self.prefix = torch.zeros(cap_rows + 1, dtype=torch.int64)

    def store(self):
        store = CanaryStore.allocate(num_slots=self.num_slots, violation_capacity=256, device=DEV)
        store.enable_chain_position_check()
        return store

    def batch(self):
        bs = int(torch.randint(1, self.cap_rows + 1, (1,), generator=self.g))
        rp = torch.randperm(self.cap_rows, generator=self.g)[:bs] + 1
        ext = torch.where(
            self.prefix[rp] == 0,
            torch.randint(1, 9, (bs,), generator=self.g),
            torch.ones(bs, dtype=torch.int64),
        )
        ext = torch.minimum(ext, self.cols - 1 - self.prefix[rp])
        P = self.prefix[rp].clone()
        ids, pos, loc = [], [], []
        for r, p, e in zip(rp.tolist(), P.tolist(), ext.tolist()):
            ids.append(torch.randint(0, 1000, (e,), generator=self.g))
            pos.append(torch.arange(p, p + e))
            loc.append(self.table[r, p : p + e].long().cpu())
        self.prefix[rp] += ext
        return rp, P, ext, torch.cat(ids), torch.cat(pos), torch.cat(loc)


def test_split_write_captured_with_a_side_stream_replays_refilled_steps():
    pool = Pool()
    cap_tokens = pool.cap_rows * 8
    plan = PlanBuffers.allocate(write_req_capacity=pool.cap_rows, verify_capacity=1, device=DEV)
    staging = GraphInputs.for_buffers(plan)
    store, ref = pool.store(), pool.store()
    ws = WriteWorkspace.for_store(store, token_capacity=cap_tokens)
    tok = {
        name: torch.full((cap_tokens,), -1 if name == "out_cache_loc" else 0, device=DEV)
        for name in ("input_ids", "positions", "out_cache_loc")
    }
    side = torch.cuda.Stream()
    planned, chained = torch.cuda.Event(), torch.cuda.Event()

    def step():
        here = torch.cuda.current_stream()
        launch_plan(plan, **staging.plan_kwargs(), req_to_token=pool.table, verify=False)
        planned.record(here)
        side.wait_event(planned)
        with torch.cuda.stream(side):
            launch_write_chain(store, plan, ws, **tok, launch_tag=7)
            chained.record(side)
        # (the forward runs here, on `here`, beside the chain)
        here.wait_event(chained)
        launch_write_stamp(store, plan, ws, real_kv=pool.real_kv)

    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        step()  # compiles outside the capture (all-padding staging: nothing written)
    torch.cuda.current_stream().wait_stream(warm)
    torch.cuda.synchronize()
    ref._copy_state_from(store)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    ref_plan = PlanBuffers.allocate(write_req_capacity=pool.cap_rows, verify_capacity=1, device=DEV)
    ref_staging = GraphInputs.for_buffers(ref_plan)  # staging is linked to its own buffers
    allocated = None
    for it in range(12):
        rp, P, ext, ids, pos, loc = pool.batch()
        n = ids.shape[0]
        for into in (staging, ref_staging):
            into.fill(
                req_pool_indices=rp.to(DEV), prefix_lens=P.to(DEV), extend_seq_lens=ext.to(DEV)
            )
        for name, src in (("input_ids", ids), ("positions", pos), ("out_cache_loc", loc)):
            tok[name][:n].copy_(src)
            tok[name][n:].fill_(-1 if name == "out_cache_loc" else 0)
        pool.kv[loc.to(DEV)] = torch.randint(-(2**40), 2**40, (n, 4), generator=pool.g).to(DEV)
        if it == 8:  # a position off by one: a violation row from the chain
            tok["positions"][0] += 1
        torch.cuda.synchronize()
        if allocated is None:
            allocated = torch.cuda.memory_allocated()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == allocated
        launch_plan(ref_plan, **ref_staging.plan_kwargs(), req_to_token=pool.table, verify=False)
        launch_write(ref, ref_plan, **tok, launch_tag=7, real_kv=pool.real_kv)
        torch.cuda.synchronize()
        assert torch.equal(store.records, ref.records), it
        assert torch.equal(store.owners, ref.owners), it
        for name in ("violation_count", "kernel_runs", "slots_processed", "status"):
            assert torch.equal(getattr(store, name), getattr(ref, name)), (it, name)
        assert rows(store) == rows(ref)
    assert int(store.violation_count) >= 1 and int(store.status) == 0


def test_a_stamp_graph_replayed_without_its_chain_is_flagged():
    pool = Pool(cap_rows=4)
    plan = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=1, device=DEV)
    store = pool.store()
    ws = WriteWorkspace.for_store(store, token_capacity=4 * 8)  # Pool.batch: <= 8 tokens a row
    rp, P, ext, ids, pos, loc = pool.batch()
    launch_plan(plan, req_pool_indices=rp.to(DEV), prefix_lens=P.to(DEV),
                extend_seq_lens=ext.to(DEV), req_to_token=pool.table, verify=False)  # fmt: skip
    kw = dict(input_ids=ids.to(DEV), positions=pos.to(DEV), out_cache_loc=loc.to(DEV))
    launch_write_chain(store, plan, ws, **kw)
    launch_write_stamp(store, plan, ws)  # compiled; stamped
    launch_write_chain(store, plan, ws, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch_write_stamp(store, plan, ws)
    graph.replay()
    torch.cuda.synchronize()
    runs = int(store.kernel_runs)
    assert store.take_status() == CanaryStatus.OK
    graph.replay()  # no chain since: stale
    torch.cuda.synchronize()
    assert store.take_status() == CanaryStatus.WRITE_CHAIN_STALE
    assert int(store.kernel_runs) == runs

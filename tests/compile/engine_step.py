"""A tiny engine step for the torch.compile tests (tests/compile/test_compile.py on the CPU,
tests/compile/test_gpu_compile.py on a GPU): plan, HEAD verify, a "forward" that writes the KV
layer, HEAD and TAIL writes, TAIL verify, with every per-row and per-token input in a
tensor of fixed capacity (so the same compiled step, and a CUDA graph of it, serves
every batch), run three ways on three copies of the state: compiled, eager kernels and
the torch references, compared after every step."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from kv_canary_buffers import (
    CanaryStore,
    GraphInputs,
    PlanBuffers,
    RealKV,
    RealKVMode,
    plan_reference,
    plans_equal,
    verify_reference,
    write_reference,
)
from kv_canary_kernels import launch_plan, launch_verify, launch_write
from kv_canary_kernels.compiled import field

HEAD_VERIFY, HEAD_WRITE, TAIL_WRITE, TAIL_VERIFY = 0, 1, 2, 3
TOKEN_NAMES = (
    "input_ids",
    "positions",
    "out_cache_loc",
    "expected_input_ids",
    "expected_positions",
)

# (row, prefix_len, new slots, new tokens) per request of a step. Request A is row 1, B
# row 2, C row 3. Step 4 hands B a slot A still holds (an allocator bug): the TAIL verify
# of that step and the HEAD verify of the next report it.
BATCHES: tuple[tuple[tuple[int, int, list[int], list[int]], ...], ...] = (
    ((1, 0, [5, 6, 7], [11, 12, 13]), (2, 0, [9, 10], [21, 22])),
    ((1, 3, [8], [14]), (2, 2, [11], [23])),
    ((1, 4, [12], [15]), (2, 3, [13], [24]), (3, 0, [20, 21, 22], [31, 32, 33])),
    ((1, 5, [14], [16]), (2, 4, [6], [25])),
    ((1, 6, [15], [17]), (3, 3, [23], [34])),
)


class Engine:
    """One KV pool's canary state and the engine tensors it reads, at fixed addresses."""

    def __init__(
        self,
        device: torch.device | str,
        *,
        rows: int = 4,
        max_len: int = 16,
        max_tokens: int = 8,
        num_slots: int = 64,
        verify_capacity: int = 64,
    ):
        dev = torch.device(device)
        self.device = dev
        self.req_to_token = torch.zeros(rows + 1, max_len, dtype=torch.int32, device=dev)
        self.token_pool = torch.zeros(rows + 1, max_len, dtype=torch.int32, device=dev)
        # 32 bytes a slot, page_size 1: the "forward" writes whole int64 rows
        self.kv = torch.zeros(num_slots, 4, dtype=torch.int64, device=dev)
        self.plan = PlanBuffers.allocate(
            write_req_capacity=rows, verify_capacity=verify_capacity, device=dev
        )
        self.head = CanaryStore.allocate(num_slots=num_slots, violation_capacity=64, device=dev)
        self.tail = CanaryStore.allocate(num_slots=num_slots, violation_capacity=64, device=dev)
        self.real_kv = RealKV(
            mode=RealKVMode.PARTIAL, sources=(self.kv,), page_size=1, bytes_per_token=32
        )
        self.staging = GraphInputs.for_buffers(self.plan)
        self.tok = {
            name: torch.full(
                (max_tokens,), -1 if name == "out_cache_loc" else 0, dtype=torch.int64, device=dev
            )
            for name in TOKEN_NAMES
        }

    def schedule(self, batch: tuple[tuple[int, int, list[int], list[int]], ...]) -> None:
        """Host side, before the step: the batch's slots and tokens into the tables, its
        rows into the staging (the rest padding), its tokens into the token tensors (the
        rest skipped writes)."""
        dev = self.device
        for row, p, slots, tokens in batch:
            self.req_to_token[row, p : p + len(slots)] = torch.tensor(slots, dtype=torch.int32)
            self.token_pool[row, p : p + len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        prefix = torch.tensor([b[1] for b in batch], dtype=torch.int64, device=dev)
        self.staging.fill(
            req_pool_indices=torch.tensor([b[0] for b in batch], dtype=torch.int64, device=dev),
            prefix_lens=prefix,
            extend_seq_lens=torch.tensor([len(b[2]) for b in batch], dtype=torch.int64, device=dev),
            valid_lens=prefix,
        )
        loc = [s for b in batch for s in b[2]]
        pos = [b[1] + k for b in batch for k in range(len(b[2]))]
        ids = [t for b in batch for t in b[3]]
        values = {
            "input_ids": ids,
            "positions": pos,
            "out_cache_loc": loc,
            "expected_input_ids": ids,
            "expected_positions": pos,
        }
        n = len(loc)
        for name, t in self.tok.items():
            t[:n] = torch.tensor(values[name], dtype=torch.int64)
            t[n:] = -1 if name == "out_cache_loc" else 0

    def forward(self) -> None:
        """The model's KV write: a row derived from each token at its slot (padding
        tokens write zeros to slot 0, the pool's padding slot)."""
        loc, ids, pos = (self.tok[k] for k in ("out_cache_loc", "input_ids", "positions"))
        live = loc >= 0
        rows = torch.stack((ids, pos, ids * 7 + pos, ids - pos), 1)
        self.kv.index_copy_(0, torch.where(live, loc, 0), torch.where(live[:, None], rows, 0))


def kernel_step(e: Engine) -> tuple[torch.Tensor, ...]:
    """The step through the launchers (eager, or traced by torch.compile). Returns three
    fields read after the launches, through ``field`` (views of the arenas)."""
    s = e.staging
    launch_plan(
        e.plan,
        req_pool_indices=s.req_pool_indices,
        prefix_lens=s.prefix_lens,
        extend_seq_lens=s.extend_seq_lens,
        req_to_token=e.req_to_token,
        req_to_verify_expected_tokens=e.token_pool,
        req_to_verify_expected_tokens_valid_lens=s.valid_lens,
    )
    launch_verify(e.head, e.plan, launch_tag=HEAD_VERIFY, real_kv=e.real_kv)
    e.forward()
    tok = e.tok
    plain = {k: tok[k] for k in ("input_ids", "positions", "out_cache_loc")}
    launch_write(e.head, e.plan, **tok, launch_tag=HEAD_WRITE, real_kv=e.real_kv)
    launch_write(e.tail, e.plan, **plain, launch_tag=TAIL_WRITE, real_kv=e.real_kv)
    launch_verify(e.tail, e.plan, launch_tag=TAIL_VERIFY, real_kv=e.real_kv)
    return (
        field(e.plan, "write_offsets"),
        field(e.head, "violation_count"),
        field(e.tail, "kernel_runs"),
    )


def reference_step(e: Engine) -> None:
    """The same step through the torch references (the oracle)."""
    s = e.staging
    plan_reference(
        e.plan,
        req_pool_indices=s.req_pool_indices,
        prefix_lens=s.prefix_lens,
        extend_seq_lens=s.extend_seq_lens,
        req_to_token=e.req_to_token,
        req_to_verify_expected_tokens=e.token_pool,
        req_to_verify_expected_tokens_valid_lens=s.valid_lens,
    )
    verify_reference(e.head, e.plan, launch_tag=HEAD_VERIFY, real_kv=e.real_kv)
    e.forward()
    tok = e.tok
    plain = {k: tok[k] for k in ("input_ids", "positions", "out_cache_loc")}
    write_reference(e.head, e.plan, **tok, launch_tag=HEAD_WRITE, real_kv=e.real_kv)
    write_reference(e.tail, e.plan, **plain, launch_tag=TAIL_WRITE, real_kv=e.real_kv)
    verify_reference(e.tail, e.plan, launch_tag=TAIL_VERIFY, real_kv=e.real_kv)


def state(e: Engine) -> dict[str, Any]:
    """Everything a step left behind, in comparable form: the records, counters, status
    and violation rows (a multiset: their order within a launch is unspecified) of both
    stores, and the KV layer. Reads the rings without clearing them."""
    out: dict[str, Any] = {"kv": e.kv.cpu()}
    for name in ("head", "tail"):
        st: CanaryStore = getattr(e, name)
        kept = min(int(st.violation_count), st.violation_capacity)
        out[name] = {
            "records": st.records.cpu(),
            "counters": [
                int(getattr(st, k))
                for k in ("violation_count", "kernel_runs", "slots_processed", "status")
            ],
            "rows": Counter(map(tuple, st.violations[:kept].tolist())),
        }
    return out


def assert_same_state(a: Engine, b: Engine, *, plan_bytes: bool) -> None:
    """``a`` and ``b`` hold the same canary state after the same steps; with
    ``plan_bytes`` the plan arenas are equal byte for byte (two runs of the same kernels),
    otherwise equal in the contract's specified part (kernels against references)."""
    sa, sb = state(a), state(b)
    assert torch.equal(sa["kv"], sb["kv"])
    for name in ("head", "tail"):
        assert torch.equal(sa[name]["records"], sb[name]["records"]), name
        assert sa[name]["counters"] == sb[name]["counters"], name
        assert sa[name]["rows"] == sb[name]["rows"], name
    if plan_bytes:
        assert torch.equal(a.plan.arena.tensor, b.plan.arena.tensor)
    else:
        assert plans_equal(a.plan, b.plan, a.plan.write_req_capacity)


def run_three_ways(
    compiled_step: Callable[[Engine], tuple[torch.Tensor, ...]],
    device: torch.device | str,
    **sizes: int,
) -> tuple[Engine, Engine, Engine]:
    """Every batch of :data:`BATCHES` through ``compiled_step``, the eager launchers and
    the references, each on its own engine; states compared after every step, and the
    compiled step's returned fields compared with the eager step's."""
    comp, eager, ref = (Engine(device, **sizes) for _ in range(3))
    for batch in BATCHES:
        for e in (comp, eager, ref):
            e.schedule(batch)
        got = [t.clone() for t in compiled_step(comp)]
        want = [t.clone() for t in kernel_step(eager)]
        reference_step(ref)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
        assert_same_state(comp, eager, plan_bytes=True)
        assert_same_state(comp, ref, plan_bytes=False)
    return comp, eager, ref

"""The main job: a serving engine's KV pool over many steps, planned and checked.

``python -m kv_canary_buffers`` simulates requests arriving, prefilling in chunks,
decoding and finishing over a KV pool with two buffer groups: a full-attention group and a
sliding-window group with its slot LUT, both with an expected-token pool. Every step it
plans each group, checks the plan against the contract's invariants and against
``plan_reference``, and prints a summary at the end. The write-request capacity grows
mid-run (``ensure_capacity``: a new generation, and on a GPU a re-captured CUDA graph), and
the full group's verify capacity starts small so that at least one step overflows.

It plans with ``kv_canary_kernels.launch_plan`` where Triton can run (a GPU, or the CPU
with ``TRITON_INTERPRET=1``) and with ``plan_reference`` otherwise. This module imports
Triton only in that case, and only when the demo runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import attrs
import torch

from .buffers import PlanBuffers
from .compare import plans_equal
from .plan_reference import plan_reference
from .staging import GraphInputs
from .status import PlanStatus

CORRUPTIONS = ("req_pool_indices past the table", "prefix_lens past max_seq_len",
               "valid length past the token pool")


@attrs.define
class Request:
    row: int
    prompt_len: int
    output_len: int
    prefix: int = 0  # tokens already in the KV cache

    @property
    def done(self) -> bool:
        return self.prefix >= self.prompt_len + self.output_len


@attrs.define
class Group:
    """One buffer group: its window, LUT, buffers and (on a GPU) its captured graph."""

    name: str
    window: int
    lut: Optional[torch.Tensor]
    buffers: PlanBuffers
    oracle: PlanBuffers
    staging: Optional[GraphInputs] = None
    graph: Optional["torch.cuda.CUDAGraph"] = None
    graph_generation: int = -1


@attrs.define
class Stats:
    steps: int = 0
    rows: int = 0
    active_rows: int = 0
    write_entries: int = 0
    verify_entries: int = 0
    overflow_steps: int = 0
    resizes: int = 0
    captures: int = 0
    mismatches: int = 0
    corrupt_steps: int = 0
    flags: PlanStatus = PlanStatus.OK
    plan_us: List[float] = attrs.Factory(list)


def pick_planner(device: torch.device, choice: str):
    """``(name, plan function)``: the kernels where Triton can run, else the reference."""
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    can_triton = device.type == "cuda" or (device.type == "cpu" and interpreting)
    if choice == "reference" or (choice == "auto" and not can_triton):
        return "plan_reference (torch)", plan_reference
    if not can_triton:
        raise SystemExit(
            "kv-canary demo: --planner kernels needs a CUDA device, "
            "or TRITON_INTERPRET=1 on the CPU"
        )
    from kv_canary_kernels import launch_plan  # deferred: this package never needs Triton

    where = "GPU" if device.type == "cuda" else "CPU, Triton interpreter"
    return f"launch_plan (Triton kernels, {where})", launch_plan


class Engine:
    """A toy serving engine: a request table, a slot allocator and the plan each step."""

    def __init__(self, *, max_batch: int, device: torch.device, seed: int, planner: Callable,
                 use_graphs: bool, inject_corruption: bool):
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)
        self.max_batch = max_batch
        self.max_seq_len = 256
        self.rows = 4 * max_batch + 1  # row 0 is never a request: it marks padding
        self.n_slots = self.rows * self.max_seq_len
        self.planner = planner
        self.use_graphs = use_graphs
        self.inject_corruption = inject_corruption
        shape = (self.rows, self.max_seq_len)
        self.req_to_token = torch.zeros(shape, dtype=torch.int32, device=device)
        self.tokens = torch.zeros(shape, dtype=torch.int32, device=device)
        perm = torch.randperm(self.n_slots, generator=self.gen)
        self.free_slots: List[int] = [s for s in perm.tolist() if s != 0]  # slot 0: dummy
        self.free_rows = list(range(1, self.rows))
        self.running: List[Request] = []
        self.stats = Stats()
        swa_lut = torch.randperm(self.n_slots, generator=self.gen).to(device)
        self.groups = [
            # the full group's verify capacity starts small: the first long batch overflows
            self._group("full", window=0, lut=None, verify_capacity=max_batch * 32),
            self._group("swa", window=32, lut=swa_lut, verify_capacity=max_batch * 32),
        ]

    def _group(self, name, *, window, lut, verify_capacity) -> Group:
        make = lambda: PlanBuffers.allocate(  # noqa: E731
            write_req_capacity=self.max_batch, verify_capacity=verify_capacity, device=self.device
        )
        return Group(name=name, window=window, lut=lut, buffers=make(), oracle=make())

    # --- the engine loop ----------------------------------------------------------
    def admit(self) -> None:
        arrivals = int(torch.randint(0, 5, (1,), generator=self.gen))
        for _ in range(arrivals):
            if len(self.running) >= self.max_batch or not self.free_rows:
                break
            prompt = int(torch.randint(1, 200, (1,), generator=self.gen))
            output = int(torch.randint(16, 96, (1,), generator=self.gen))
            self.running.append(Request(row=self.free_rows.pop(), prompt_len=prompt,
                                        output_len=min(output, self.max_seq_len - prompt)))

    def step(self, index: int) -> None:
        self.admit()
        batch = self.running[: self.max_batch]
        extends = []
        for req in batch:
            chunk = 64 if req.prefix < req.prompt_len else 1  # chunked prefill, then decode
            extends.append(min(chunk, req.prompt_len + req.output_len - req.prefix))
        pad = (-len(batch)) % 4  # pad to a bucket, as graph-captured engines do
        rp = [r.row for r in batch] + [0] * pad
        garbage = lambda: torch.randint(-9, 10**6, (pad,), generator=self.gen).tolist()  # noqa: E731
        prefix = [r.prefix for r in batch] + garbage()  # padding rows: any lengths at all
        extend = extends + garbage()
        valid = [r.prefix for r in batch] + [0] * pad  # tokens known: the prefix
        corrupt = None
        if self.inject_corruption and index % 5 == 3 and batch:
            corrupt = CORRUPTIONS[(index // 5) % len(CORRUPTIONS)]
            if corrupt == CORRUPTIONS[0]:
                rp[0] = self.rows + 7
            elif corrupt == CORRUPTIONS[1]:
                prefix[0] = self.max_seq_len + 3
            else:
                valid[0] = self.max_seq_len + 5
        as_tensor = lambda v: torch.tensor(v, dtype=torch.int64, device=self.device)  # noqa: E731
        rows = dict(req_pool_indices=as_tensor(rp), prefix_lens=as_tensor(prefix),
                    extend_seq_lens=as_tensor(extend))
        valid_lens = as_tensor(valid)
        self._grow_if_needed(len(rp))
        for group in self.groups:
            self._plan_group(group, rows, valid_lens, corrupt, index)
        # the step's forward pass: write the new tokens' slots, then retire finished requests
        for req, n in zip(batch, extends):
            slots = [self.free_slots.pop() for _ in range(n)]
            span = slice(req.prefix, req.prefix + n)
            self.req_to_token[req.row, span] = torch.tensor(slots, dtype=torch.int32)
            self.tokens[req.row, span] = torch.randint(
                0, 32000, (n,), generator=self.gen, dtype=torch.int32).to(self.device)
            req.prefix += n
        for req in [r for r in self.running if r.done]:
            self.running.remove(req)
            self.free_slots.extend(self.req_to_token[req.row, : req.prefix].tolist())
            self.req_to_token[req.row].zero_()
            self.free_rows.append(req.row)
        self.stats.steps += 1
        self.stats.rows += len(rp)
        self.stats.active_rows += len(batch)
        self.stats.corrupt_steps += corrupt is not None

    def _grow_if_needed(self, bs: int) -> None:
        for group in self.groups:
            grown = group.buffers.ensure_capacity(write_reqs=bs)
            if grown is not group.buffers:
                print(f"  {group.name:4s}: pool grew: write_req_capacity "
                      f"{group.buffers.write_req_capacity} -> {grown.write_req_capacity}, "
                      f"generation {grown.generation}"
                      + (" (graph re-captured)" if self.use_graphs else ""))
                group.buffers = grown
                group.oracle = group.oracle.ensure_capacity(write_reqs=bs)
                self.stats.resizes += 1

    def _plan_group(self, group: Group, rows: Dict[str, torch.Tensor], valid_lens: torch.Tensor,
                    corrupt: Optional[str], index: int) -> None:
        bs = rows["req_pool_indices"].shape[0]
        tables: Dict[str, Any] = dict(
            req_to_token=self.req_to_token, swa_window_size=group.window,
            full_to_swa_index_mapping=group.lut, req_to_verify_expected_tokens=self.tokens,
        )
        P = rows["prefix_lens"].clamp(0, self.max_seq_len)
        active = rows["req_pool_indices"] != 0
        ws = (P - group.window).clamp_min(0) if group.window else torch.zeros_like(P)
        total = int(torch.where(active, P - ws, 0).sum())
        kwargs: Dict[str, Any]
        if self.use_graphs:
            kwargs = self._replay(group, rows, valid_lens, tables)
            bs = group.buffers.write_req_capacity
        else:
            kwargs = dict(rows, req_to_verify_expected_tokens_valid_lens=valid_lens, **tables)
            start = time.perf_counter()
            try:
                self.planner(group.buffers, **kwargs)
            except ValueError as err:  # plan_reference rejects data outside the tables
                print(f"  step {index:4d} {group.name:4s}: {corrupt} -> rejected: {err}")
                self.stats.flags |= _flags_of(err)
                return
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.stats.plan_us.append((time.perf_counter() - start) * 1e6)
        flags = group.buffers.take_status()  # a sync: the demo reads it every step
        self.stats.flags |= flags
        if corrupt is not None:
            print(f"  step {index:4d} {group.name:4s}: injected {corrupt} -> status {flags!r}")
            try:
                plan_reference(group.oracle, **kwargs)
                self.stats.mismatches += 1  # the reference must reject it
            except ValueError:
                pass
            return
        if flags:
            self.stats.mismatches += 1
        if total > group.buffers.verify_capacity:
            self.stats.overflow_steps += 1
            print(f"  step {index:4d} {group.name:4s}: {total} verify entries > capacity "
                  f"{group.buffers.verify_capacity}: verify skipped (enable=0), growing")
        self._check(group, kwargs, bs, total)
        if total > group.buffers.verify_capacity:
            group.buffers = group.buffers.ensure_capacity(verify_entries=total)
            group.oracle = group.oracle.ensure_capacity(verify_entries=total)
            self.stats.resizes += 1
        self.stats.write_entries += int(group.buffers.write_offsets[bs])
        b = group.buffers
        self.stats.verify_entries += int(b.verify_num_valid) * int(b.verify_enable)

    def _replay(self, group: Group, rows, valid_lens, tables) -> Dict[str, Any]:
        """Fill the group's staging in place and replay its graph (capture it first, or
        again after a resize made a new generation)."""
        if group.staging is None or group.staging.built_for is not group.buffers:
            group.staging = GraphInputs.for_buffers(group.buffers)  # linked to these buffers
        group.staging.fill(valid_lens=valid_lens, **rows)
        kwargs = dict(group.staging.plan_kwargs(with_valid_lens=True), **tables)
        if group.graph_generation != group.buffers.generation:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.planner(group.buffers, **kwargs)  # compile outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            group.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(group.graph):
                self.planner(group.buffers, **kwargs)
            group.graph_generation = group.buffers.generation
            self.stats.captures += 1
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        assert group.graph is not None
        group.graph.replay()
        end.record()
        end.synchronize()
        self.stats.plan_us.append(start.elapsed_time(end) * 1e3)
        # The staging is linked to group.buffers (other buffers refuse it): the oracle
        # plans the same staged rows from copies.
        staged = group.staging.plan_kwargs(with_valid_lens=True)
        return dict(kwargs, **{name: t.clone() for name, t in staged.items()})

    def _check(self, group: Group, kwargs, bs: int, total: int) -> None:
        """The contract's invariants, then equality with plan_reference."""
        b = group.buffers
        offsets = b.write_offsets
        ok = int(offsets[0]) == 0 and bool((offsets[1 : bs + 1] >= offsets[:bs]).all())
        ok &= bool((offsets[bs + 1 :] == 0).all()) and int(b.write_num_valid_reqs) == bs
        overflow = total > b.verify_capacity
        ok &= int(b.verify_enable) == (0 if overflow else 1)
        ok &= int(b.verify_num_valid) == (b.verify_capacity if overflow else total)
        if not overflow and total:
            pos = b.verify_expected_positions[:total]
            prev = b.verify_prev_slot_indices[1:total]
            same_row = pos[1:] == pos[:-1] + 1
            ok &= bool((prev[same_row] == b.verify_slot_indices[: total - 1][same_row]).all())
        plan_reference(group.oracle, **kwargs)
        ok &= plans_equal(b, group.oracle, bs)
        self.stats.mismatches += not ok


def _flags_of(err: ValueError) -> PlanStatus:
    """The status bit matching a reference rejection, so both paths report alike."""
    text = str(err)
    if "valid_lens" in text:
        return PlanStatus.VALID_LEN_OUT_OF_RANGE
    if "prefix_lens" in text:
        return PlanStatus.PREFIX_LEN_OUT_OF_RANGE
    if "full_to_swa_index_mapping" in text:
        return PlanStatus.LUT_SLOT_OUT_OF_RANGE
    return PlanStatus.REQ_POOL_INDEX_OUT_OF_RANGE


def _progress(done: int, total: int) -> None:
    width = 30
    filled = width * done // total
    sys.stderr.write(f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} steps")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def run(argv: Optional[List[str]] = None) -> int:
    """Run the demo with command-line arguments ``argv`` (``sys.argv[1:]`` when None).

    Returns the exit status: 0, or 1 if any plan differed from ``plan_reference``.
    """
    parser = argparse.ArgumentParser(
        prog="python -m kv_canary_buffers",
        description="Simulate a serving engine's KV pool and plan every step of its canary.",
    )
    parser.add_argument("--steps", type=int, default=200, help="engine steps (default 200)")
    parser.add_argument("--max-batch", type=int, default=32,
                        help="rows per step before the pool grows (default 32; doubles mid-run)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--inject-corruption", action="store_true",
                        help="feed out-of-range data on some steps and show it being caught")
    parser.add_argument("--planner", choices=["auto", "kernels", "reference"], default="auto",
                        help="auto: the Triton kernels where Triton can run, else plan_reference")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.max_batch < 1:
        parser.error("--steps and --max-batch must be >= 1")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    name, planner = pick_planner(device, args.planner)
    use_graphs = device.type == "cuda" and planner is not plan_reference
    print(f"kv-canary demo: {args.steps} steps on {device}, planner: {name}"
          + (", replayed from CUDA graphs" if use_graphs else ""))
    engine = Engine(max_batch=args.max_batch, device=device, seed=args.seed, planner=planner,
                    use_graphs=use_graphs, inject_corruption=args.inject_corruption)
    show_bar = args.steps >= 50 and sys.stderr.isatty()
    for i in range(args.steps):
        if i == args.steps // 2:
            engine.max_batch *= 2  # the engine raises its batch limit: buffers must grow
            print(f"  step {i:4d}: max batch -> {engine.max_batch}")
        engine.step(i)
        if show_bar:
            _progress(i + 1, args.steps)
    s = engine.stats
    gens = ", ".join(f"{g.name} gen {g.buffers.generation}" for g in engine.groups)
    median = statistics.median(s.plan_us) if s.plan_us else float("nan")
    table = [
        ("steps", s.steps),
        ("rows planned (padding included)", s.rows),
        ("active rows", s.active_rows),
        ("write entries", s.write_entries),
        ("verify entries", s.verify_entries),
        ("overflow steps (verify skipped)", s.overflow_steps),
        ("resizes", f"{s.resizes} ({gens})"),
        ("graph captures", s.captures),
        ("corrupted steps injected", s.corrupt_steps),
        ("status flags seen", repr(s.flags)),
        ("time per plan, median", f"{median:.1f} us ({name})"),
        ("plans differing from plan_reference", s.mismatches),
    ]
    print("\nsummary")
    for key, value in table:
        print(f"  {key:36s} {value}")
    return 1 if s.mismatches else 0

"""The toy engine's scheduler: requests and their rows, the KV slot pool with its LIFO free
list, admission, the batch of a step and the inputs the plan and the write see."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import attrs
import torch

from .config import SimConfig, Stats

VOCAB = 32000
ROW_BUCKET = 4
"""Eager batches are padded to a multiple of this with padding rows (garbage lengths)."""


def draw(gen: torch.Generator, low: int, high: int) -> int:
    """A random int in ``[low, high)`` from the run's generator."""
    return int(torch.randint(low, high, (1,), generator=gen))


@attrs.define(eq=False)
class Request:
    id: int
    row: int
    prompt_len: int
    output_len: int
    prefix: int = 0
    """Tokens whose KV is written and stamped."""
    slots: list[int] = attrs.Factory(list)
    """KV slot of each position (this step's included once allocated)."""
    tokens: list[int] = attrs.Factory(list)
    """The scheduler's token at each position."""

    @property
    def total(self) -> int:
        return self.prompt_len + self.output_len

    @property
    def done(self) -> bool:
        return self.prefix >= self.total


class SlotPool:
    """The KV pool's slots (slot 0 reserved, never allocated): a LIFO free list, so that a
    finished request's slots are reused at once; which requests hold each slot; and the
    ``swa`` group's LUT (``full_to_swa_index_mapping``) with its inverse."""

    def __init__(self, num_slots: int, gen: torch.Generator, device: torch.device):
        self.num_slots = num_slots
        self.device = device
        self.free: list[int] = []
        self.in_free: set[int] = set()
        self.add_free(range(1, num_slots))
        self.holders: dict[int, set[int]] = {}
        self.used_slots: set[int] = set()
        lut = torch.cat(
            [torch.zeros(1, dtype=torch.int64), 1 + torch.randperm(num_slots - 1, generator=gen)]
        )
        self.inv_lut = torch.argsort(lut)
        self.lut = lut.to(device)

    def add_free(self, slots: Iterable[int]) -> None:
        for s in slots:
            if s not in self.in_free:
                self.free.append(s)
                self.in_free.add(s)

    def take(self) -> tuple[int, bool]:
        """The top of the free list (the caller grows an empty one first) and whether an
        earlier request had held it."""
        s = self.free.pop()
        self.in_free.discard(s)
        reused = s in self.used_slots
        self.used_slots.add(s)
        return s, reused

    def grow(self, gen: torch.Generator) -> tuple[int, int]:
        """Double the slots: the LUT extended, the new slots below the old free ones (used
        last). Returns the old and new slot counts."""
        old, new = self.num_slots, 2 * self.num_slots
        extra = old + torch.randperm(new - old, generator=gen)
        lut = torch.cat([self.lut.cpu(), extra])
        self.lut = lut.to(self.device)
        self.inv_lut = torch.argsort(lut)
        self.free[:0] = list(range(old, new))
        self.in_free.update(range(old, new))
        self.num_slots = new
        return old, new


@attrs.frozen
class StepInputs:
    """One step's batch as the plan sees it and as the write sees it."""

    host: dict[str, list[int]]
    """The host lists the rows are built from (what an engine's scheduler holds):
    ``req_pool_indices`` and ``prefix_lens``, padding rows included."""
    rows: dict[str, torch.Tensor]
    """``req_pool_indices``, ``prefix_lens``, ``extend_seq_lens``, padded to a bucket with
    padding rows of garbage lengths."""
    valid_lens: torch.Tensor
    """The token pool's valid length of each row."""
    tokens: dict[str, torch.Tensor]
    """The write's per-token inputs, flat in row order."""
    offsets: dict[int, int]
    """Each request's first index into ``tokens``."""


class Scheduler:
    """Rows (``req_to_token`` and the expected-token pool, row 0 never a request: it marks
    padding), the running requests and the KV slot pool. ``grow_pool`` is called when the
    free list runs out (the engine grows the KV pool and every store with it)."""

    def __init__(
        self,
        config: SimConfig,
        *,
        gen: torch.Generator,
        device: torch.device,
        stats: Stats,
        num_slots: int,
        grow_pool: Callable[[str], None],
    ):
        self.config = config
        self.gen = gen
        self.device = device
        self.stats = stats
        self.grow_pool = grow_pool
        self.max_batch = config.max_batch
        self.rows = 4 * config.max_batch + 1  # row 0 is never a request: it marks padding
        shape = (self.rows, config.max_seq_len)
        self.req_to_token = torch.zeros(shape, dtype=torch.int32, device=device)
        self.token_pool = torch.zeros(shape, dtype=torch.int32, device=device)
        self.free_rows = list(range(self.rows - 1, 0, -1))
        self.running: list[Request] = []
        self.next_id = 1
        self.pool = SlotPool(num_slots, gen, device)

    # --- admission and the batch ----------------------------------------------------
    def admit(self) -> None:
        cfg = self.config
        arrivals = draw(self.gen, 0, cfg.max_arrivals + 1)
        if not self.running:
            arrivals = max(arrivals, 1)  # never plan an empty step
        for _ in range(arrivals):
            if len(self.running) >= self.max_batch or not self.free_rows:
                break
            prompt = draw(self.gen, 1, cfg.max_prompt + 1)
            output = draw(self.gen, cfg.min_output, cfg.max_output + 1)
            req = Request(
                id=self.next_id,
                row=self.free_rows.pop(),
                prompt_len=prompt,
                output_len=max(1, min(output, cfg.max_seq_len - prompt)),
            )
            self.next_id += 1
            self.running.append(req)
            self.stats.admitted += 1

    def pick_batch(self) -> tuple[list[Request], dict[int, int]]:
        """The batch (every running request) and each one's token count this step."""
        batch = list(self.running)
        extends: dict[int, int] = {}
        for req in batch:  # chunked prefill, then one token a step
            chunk = self.config.prefill_chunk if req.prefix < req.prompt_len else 1
            extends[req.id] = min(chunk, req.total - req.prefix)
        self.stats.prefill_rows += sum(1 for r in batch if r.prefix < r.prompt_len)
        self.stats.decode_rows += sum(1 for r in batch if r.prefix >= r.prompt_len)
        return batch, extends

    def allocate(self, batch: list[Request], extends: dict[int, int]) -> dict[int, list[int]]:
        """This step's new slots of each request, from the free list."""
        return {r.id: [self.alloc() for _ in range(extends[r.id])] for r in batch}

    def place(
        self, batch: list[Request], extends: dict[int, int], new_slots: dict[int, list[int]]
    ) -> None:
        """Put the new slots into ``req_to_token`` and the scheduled tokens (fresh random
        ones) into the expected-token pool."""
        for req in batch:
            e = extends[req.id]
            span = slice(req.prefix, req.prefix + e)
            req.slots[span] = new_slots[req.id]
            for s in new_slots[req.id]:
                self.pool.holders.setdefault(s, set()).add(req.id)
            new_tokens = torch.randint(0, VOCAB, (e,), generator=self.gen).tolist()
            req.tokens[span] = new_tokens
            self.req_to_token[req.row, span] = torch.tensor(new_slots[req.id], dtype=torch.int32)
            self.token_pool[req.row, span] = torch.tensor(new_tokens, dtype=torch.int32)

    def steps_left(self, req: Request, prefix: int) -> int:
        """Steps ``req`` runs once ``prefix`` tokens are stamped."""
        steps = 0
        while prefix < req.total:
            prefix += self.config.prefill_chunk if prefix < req.prompt_len else 1
            steps += 1
        return steps

    # --- slots ------------------------------------------------------------------------
    def alloc(self) -> int:
        if not self.pool.free:
            self.grow_pool("the free list ran out")
        s, reused = self.pool.take()
        if reused:
            self.stats.reused_slots += 1
        return s

    def release(self, req: Request) -> None:
        """Give back a finished or aborted request's row and slots (a slot still held by
        another request stays out of the free list)."""
        holders = self.pool.holders
        for s in dict.fromkeys(req.slots):
            owners = holders.get(s)
            if owners is None:
                continue
            owners.discard(req.id)
            if not owners:
                del holders[s]
                self.pool.add_free([s])
        self.req_to_token[req.row].zero_()
        self.free_rows.append(req.row)
        self.running.remove(req)

    # --- the step's inputs and its end ----------------------------------------------
    def step_inputs(self, batch: list[Request], extends: dict[int, int]) -> StepInputs:
        """The batch as the plan sees it (rows, padded to a bucket with padding rows of
        garbage lengths, and the token pool's valid lengths) and as the write sees it (the
        tokens flat in row order; ``offsets``: each request's first index)."""
        pad = (-len(batch)) % ROW_BUCKET
        device = self.device

        def garbage() -> list[int]:  # a padding row's lengths may hold anything
            return torch.randint(-9, 10**6, (pad,), generator=self.gen).tolist()

        host = {
            "req_pool_indices": [r.row for r in batch] + [0] * pad,
            "prefix_lens": [r.prefix for r in batch] + garbage(),
        }
        rows = dict(
            req_pool_indices=_i64(host["req_pool_indices"], device),
            prefix_lens=_i64(host["prefix_lens"], device),
            extend_seq_lens=_i64([extends[r.id] for r in batch] + garbage(), device),
        )
        valid_lens = _i64([r.prefix for r in batch] + [0] * pad, device)
        offsets: dict[int, int] = {}
        flat_slots: list[int] = []
        flat_pos: list[int] = []
        flat_tok: list[int] = []
        for req in batch:
            e = extends[req.id]
            offsets[req.id] = len(flat_slots)
            flat_slots += req.slots[req.prefix : req.prefix + e]
            flat_pos += list(range(req.prefix, req.prefix + e))
            flat_tok += req.tokens[req.prefix : req.prefix + e]
        tokens = {
            "input_ids": _i64(flat_tok, device),  # what the forward consumes
            "positions": _i64(flat_pos, device),
            "out_cache_loc": _i64(flat_slots, device),
            "expected_input_ids": _i64(flat_tok, device),  # the scheduler's view
            "expected_positions": _i64(flat_pos, device),
        }
        return StepInputs(host, rows, valid_lens, tokens, offsets)

    def finish_step(
        self, batch: list[Request], extends: dict[int, int], rows: int, groups: int
    ) -> None:
        """Advance the surviving requests, retire the finished ones, count the step
        (``rows`` planned, padding included, for ``groups`` buffer groups)."""
        for req in batch:
            if req in self.running:
                req.prefix += extends[req.id]
        for req in [r for r in self.running if r.done]:
            self.release(req)
            self.stats.finished += 1
        s = self.stats
        s.steps += 1
        s.rows += rows
        s.active_rows += len(batch)
        s.write_entries += sum(extends.values()) * groups


def _i64(values: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).to(device)

"""Input generators, output poisoning and comparison shared by the tests."""

from __future__ import annotations

from typing import Any

import torch

from kv_canary_buffers import PlanBuffers, PlanStatus
from kv_canary_buffers.compare import VERIFY_ENTRY_FIELDS
from kv_canary_buffers.layout import PLAN_FIELDS

POISON = -7777
ENTRY_FIELDS = VERIFY_ENTRY_FIELDS


def poison(buffers: PlanBuffers) -> None:
    """Fill every output with junk so an element the plan forgot to write shows."""
    for field in PLAN_FIELDS:
        if field.role == "output":
            getattr(buffers, field.name).fill_(POISON)


def snapshot(buffers: PlanBuffers) -> dict[str, torch.Tensor]:
    return {name: getattr(buffers, name).clone() for name, *_ in PLAN_FIELDS}


def assert_untouched(buffers: PlanBuffers, before: dict[str, torch.Tensor]) -> None:
    for name, old in before.items():
        assert torch.equal(getattr(buffers, name), old), f"{name} was written"


def observed(buffers: PlanBuffers, bs: int) -> dict[str, Any]:
    """The specified part of the buffers, in the oracle's format."""
    nv = int(buffers.verify_num_valid)
    enable = int(buffers.verify_enable)
    entries = []
    if enable:
        cols = [getattr(buffers, f)[:nv].cpu().tolist() for f in ENTRY_FIELDS]
        entries = list(zip(*cols))
    return {
        "write_offsets": buffers.write_offsets.cpu().tolist(),
        "write_seed_slot_indices": buffers.write_seed_slot_indices[:bs].cpu().tolist(),
        "write_num_valid_reqs": int(buffers.write_num_valid_reqs),
        "row_req_pool_indices": buffers.row_req_pool_indices[:bs].cpu().tolist(),
        "verify_offsets": buffers.verify_offsets[: bs + 1].cpu().tolist() if enable else None,
        "entries": entries,
        "verify_num_valid": nv,
        "verify_enable": enable,
    }


def assert_matches_oracle(buffers: PlanBuffers, bs: int, expected: dict[str, Any]) -> None:
    got = observed(buffers, bs)
    for key, value in got.items():
        assert value == expected[key], f"{key}: got {value}, expected {expected[key]}"


def assert_buffers_equal(a: PlanBuffers, b: PlanBuffers, bs: int) -> None:
    """Byte equality of the specified outputs of two plans (other paths, same input), and
    of their status words (the reference sets VERIFY_OVERFLOW as the kernels do)."""
    assert observed(a, bs) == observed(b, bs)
    assert int(a.status) == int(b.status), (PlanStatus(int(a.status)), PlanStatus(int(b.status)))


def expand_block_table(block_table: torch.Tensor, page_size: int) -> torch.Tensor:
    """The ``req_to_token`` a block table stands for (docs/contract.md, "The table"):
    ``[rows, max_blocks * page_size]``, a negative block id giving ``-1`` for each of its
    positions."""
    blocks = block_table.shape[1]
    pos = torch.arange(blocks * page_size, device=block_table.device)
    ids = block_table.long()[:, pos // page_size]
    slots = torch.where(ids >= 0, ids * page_size + pos % page_size, -1)
    return slots.to(torch.int32).contiguous()


def random_block_table(
    gen: torch.Generator, *, rows: int, blocks: int, n_blocks: int, holes: float = 0.15
) -> torch.Tensor:
    """An int32 ``[rows, blocks]`` block table of ids in ``[0, n_blocks)``, some ``-1``
    (pages not mapped)."""
    ids = torch.randint(0, max(n_blocks, 1), (rows, blocks), generator=gen)
    ids[torch.rand(rows, blocks, generator=gen) < holes] = -1
    return ids.to(torch.int32)


def make_tables(
    gen: torch.Generator,
    *,
    rows: int,
    max_seq_len: int,
    n_slots: int,
    lut: bool = False,
    pool_cols: int | None = None,
    device: str = "cpu",
) -> dict[str, torch.Tensor | None]:
    """A ``req_to_token`` with distinct random slots (some negative), and optionally a LUT
    over every slot and an expected-token pool."""
    table = torch.randint(-2, n_slots, (rows, max_seq_len), generator=gen, dtype=torch.int64)
    out: dict[str, torch.Tensor | None] = {
        "req_to_token": table.to(torch.int32).to(device),
        "full_to_swa_index_mapping": None,
        "req_to_verify_expected_tokens": None,
    }
    if lut:
        out["full_to_swa_index_mapping"] = torch.randint(
            -1, 10 * n_slots, (n_slots,), generator=gen
        ).to(device)
    if pool_cols is not None:
        out["req_to_verify_expected_tokens"] = (
            torch.randint(0, 50000, (rows, pool_cols), generator=gen, dtype=torch.int64)
            .to(torch.int32)
            .to(device)
        )
    return out


def make_rows(
    gen: torch.Generator,
    *,
    bs: int,
    rows: int,
    max_prefix: int,
    max_extend: int = 4,
    pad_fraction: float = 0.2,
    pool_cols: int | None = None,
    device: str = "cpu",
) -> dict[str, torch.Tensor]:
    """Per-row inputs: some padding rows holding garbage lengths."""
    rp = torch.randint(1, max(rows, 2), (bs,), generator=gen)
    pad = torch.rand(bs, generator=gen) < pad_fraction
    rp[pad] = 0
    prefix = torch.randint(0, max_prefix + 1, (bs,), generator=gen)
    extend = torch.randint(0, max_extend + 1, (bs,), generator=gen)
    prefix[pad] = torch.randint(-50, 10**6, (int(pad.sum()),), generator=gen)
    extend[pad] = torch.randint(-50, 10**6, (int(pad.sum()),), generator=gen)
    out = {
        "req_pool_indices": rp.to(device),
        "prefix_lens": prefix.to(device),
        "extend_seq_lens": extend.to(device),
    }
    if pool_cols is not None:
        out["req_to_verify_expected_tokens_valid_lens"] = torch.randint(
            -1, pool_cols + 1, (bs,), generator=gen
        ).to(device)
    return out


# --- the whole arena: sentinels in the alignment gaps, byte snapshots -----------------
SENTINEL_BYTE = 0xA5
SENTINEL_INT64 = int.from_bytes(bytes([SENTINEL_BYTE]) * 8, "little", signed=True)


def arena_bytes(obj) -> torch.Tensor:
    """Every byte of a PlanBuffers' (or GraphInputs') arena, as a uint8 view."""
    return obj.arena.byte_view()


def arena_snapshot(obj) -> torch.Tensor:
    return arena_bytes(obj).clone()


def assert_arena_unchanged(obj, before: torch.Tensor) -> None:
    now = arena_bytes(obj)
    assert torch.equal(now, before), f"{int((now != before).sum())} arena bytes were written"


def poison_arena(buffers: PlanBuffers) -> None:
    """Fill every byte of the arena (outputs, scratch, alignment gaps) with the sentinel
    byte, then clear the status word (its bits are sticky, not outputs) and the sync words
    (what the one-launch plan's programs wait on, zero in fresh buffers:
    tests/plan/test_large_batch.py sets them itself)."""
    arena_bytes(buffers).fill_(SENTINEL_BYTE)
    buffers.status.zero_()
    for field in PLAN_FIELDS:
        if field.role == "sync":
            getattr(buffers, field.name).zero_()


def arena_gaps(buffers: PlanBuffers):
    """``[start, end)`` byte ranges of the arena that belong to no field: the alignment
    padding after each field (a sentinel region no kernel may write)."""
    gaps = []
    fields = buffers.arena.fields
    for f, nxt in zip(fields, fields[1:] + (None,)):
        end = buffers.arena.nbytes if nxt is None else nxt.offset
        if f.offset + f.nbytes < end:
            gaps.append((f.name, f.offset + f.nbytes, end))
    return gaps


def assert_in_bounds(buffers: PlanBuffers, bs: int) -> None:
    """Nothing was written outside what the plan may write: every alignment gap still
    holds the sentinel, and so do the seeds, ``row_req_pool_indices`` and ``verify_offsets``
    past ``bs`` (``bs + 1`` for the offsets) and the verify entries past
    ``verify_num_valid`` (all of them on overflow)."""
    raw = arena_bytes(buffers)
    for name, start, end in arena_gaps(buffers):
        assert bool((raw[start:end] == SENTINEL_BYTE).all()), f"the gap after {name} was written"
    assert bool((buffers.write_seed_slot_indices[bs:] == SENTINEL_INT64).all()), "seeds past bs"
    assert bool((buffers.row_req_pool_indices[bs:] == SENTINEL_INT64).all()), "rows past bs"
    assert bool((buffers.verify_offsets[bs + 1 :] == SENTINEL_INT64).all()), "offsets past bs"
    written = int(buffers.verify_num_valid) if int(buffers.verify_enable) else 0
    for name in ENTRY_FIELDS:
        tail = getattr(buffers, name)[written:]
        assert bool((tail == SENTINEL_INT64).all()), f"{name} written past {written}"

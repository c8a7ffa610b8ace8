"""Input generators, output poisoning and comparison shared by the tests."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from kv_canary_buffers import PlanBuffers
from kv_canary_buffers.compare import VERIFY_ENTRY_FIELDS
from kv_canary_buffers.layout import BUFFER_SPECS

POISON = -7777
ENTRY_FIELDS = VERIFY_ENTRY_FIELDS


def poison(buffers: PlanBuffers) -> None:
    """Fill every output with junk so an element the plan forgot to write shows."""
    for name, (_dtype, _shape, role) in BUFFER_SPECS.items():
        if role == "output":
            getattr(buffers, name).fill_(POISON)


def snapshot(buffers: PlanBuffers) -> Dict[str, torch.Tensor]:
    return {name: getattr(buffers, name).clone() for name in BUFFER_SPECS}


def assert_untouched(buffers: PlanBuffers, before: Dict[str, torch.Tensor]) -> None:
    for name, old in before.items():
        assert torch.equal(getattr(buffers, name), old), f"{name} was written"


def observed(buffers: PlanBuffers, bs: int) -> Dict[str, Any]:
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
        "entries": entries,
        "verify_num_valid": nv,
        "verify_enable": enable,
    }


def assert_matches_oracle(buffers: PlanBuffers, bs: int, expected: Dict[str, Any]) -> None:
    got = observed(buffers, bs)
    for key, value in got.items():
        assert value == expected[key], f"{key}: got {value}, expected {expected[key]}"


def assert_buffers_equal(a: PlanBuffers, b: PlanBuffers, bs: int) -> None:
    """Byte equality of the specified outputs of two plans (other paths, same input)."""
    assert observed(a, bs) == observed(b, bs)


def make_tables(
    gen: torch.Generator,
    *,
    rows: int,
    max_seq_len: int,
    n_slots: int,
    lut: bool = False,
    pool_cols: Optional[int] = None,
    device: str = "cpu",
) -> Dict[str, Optional[torch.Tensor]]:
    """A ``req_to_token`` with distinct random slots (some negative), and optionally a LUT
    over every slot and an expected-token pool."""
    table = torch.randint(-2, n_slots, (rows, max_seq_len), generator=gen, dtype=torch.int64)
    out: Dict[str, Optional[torch.Tensor]] = {
        "req_to_token": table.to(torch.int32).to(device),
        "full_to_swa_index_mapping": None,
        "req_to_verify_expected_tokens": None,
    }
    if lut:
        out["full_to_swa_index_mapping"] = (
            torch.randint(-1, 10 * n_slots, (n_slots,), generator=gen).to(device)
        )
    if pool_cols is not None:
        out["req_to_verify_expected_tokens"] = torch.randint(
            0, 50000, (rows, pool_cols), generator=gen, dtype=torch.int64
        ).to(torch.int32).to(device)
    return out


def make_rows(
    gen: torch.Generator,
    *,
    bs: int,
    rows: int,
    max_prefix: int,
    max_extend: int = 4,
    pad_fraction: float = 0.2,
    pool_cols: Optional[int] = None,
    device: str = "cpu",
) -> Dict[str, torch.Tensor]:
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

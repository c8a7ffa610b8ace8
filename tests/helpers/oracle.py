"""A plain-Python loop statement of the contract, written independently of the library.

It is the oracle of the property tests. With ``pad_bad=True`` it also states what the
Triton kernels produce for data outside the tables (padding values plus status bits);
with ``pad_bad=False`` such data raises ``ValueError``, as ``plan_reference`` does. Its
``flags`` are the status word the kernels leave: the data bits (``data_flags``, which the
reference raises for instead) and ``VERIFY_OVERFLOW`` (both paths set it: an overflow is
not an error).
"""

from __future__ import annotations

from typing import Any

import torch

from kv_canary_buffers import PlanStatus

MAX_ROW_WRITES = 2**32  # the contract's clamp of a row's write count (stated, not imported)


def _rows(t: torch.Tensor | None):
    return None if t is None else t.cpu().tolist()


def loop_plan(
    *,
    write_req_capacity: int,
    verify_capacity: int,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    req_to_token: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    page_size: int = 1,
    swa_window_size: int = 0,
    full_to_swa_index_mapping: torch.Tensor | None = None,
    req_to_verify_expected_tokens: torch.Tensor | None = None,
    req_to_verify_expected_tokens_valid_lens: torch.Tensor | None = None,
    kv_token_id_vs_position_offset: int = 0,
    verify: bool = True,
    pad_bad: bool = False,
) -> dict[str, Any]:
    rp_l, p_l, e_l = _rows(req_pool_indices), _rows(prefix_lens), _rows(extend_seq_lens)
    assert (req_to_token is None) != (block_table is None)
    if req_to_token is not None:
        table = _rows(req_to_token)
        rows, cols = req_to_token.shape
    else:  # a paged table: each position's slot from its page's block id
        table = _rows(block_table)
        rows, cols = block_table.shape[0], block_table.shape[1] * page_size
    lut = _rows(full_to_swa_index_mapping)
    pool = _rows(req_to_verify_expected_tokens)
    vlen = _rows(req_to_verify_expected_tokens_valid_lens)
    W = swa_window_size
    off = kv_token_id_vs_position_offset
    flags = PlanStatus.OK
    bs = len(rp_l)

    def read(rp: int, pos: int) -> tuple:
        if not 0 <= rp < rows or pos >= cols:
            return 0, False
        if req_to_token is not None:
            return table[rp][pos], True
        block = table[rp][pos // page_size]
        return (block * page_size + pos % page_size if block >= 0 else -1), True

    def xlat(s: int) -> int:
        nonlocal flags
        if lut is None or s < 0:
            return s
        if s >= len(lut):
            flags |= PlanStatus.LUT_SLOT_OUT_OF_RANGE
            return 0
        return lut[s]

    def slot_at(rp: int, pos: int) -> int:
        s, ok = read(rp, pos)
        return xlat(s) if ok else 0

    offsets, seeds, entries = [0], [], []
    v_rows = []
    for r in range(bs):
        rp, P, E = rp_l[r], p_l[r], e_l[r]
        # a busy row of negative length is planned as padding, and flagged
        active = rp != 0 and P >= 0 and E >= 0
        if rp != 0 and not active:
            flags |= PlanStatus.NEGATIVE_LENGTH
        if active and not 0 <= rp < rows:
            flags |= PlanStatus.REQ_POOL_INDEX_OUT_OF_RANGE
        if active and P > cols:
            flags |= PlanStatus.PREFIX_LEN_OUT_OF_RANGE
        if active and pool is not None:
            if not 0 <= rp < len(pool):
                flags |= PlanStatus.POOL_ROW_OUT_OF_RANGE
            if vlen[r] > req_to_verify_expected_tokens.shape[1]:
                flags |= PlanStatus.VALID_LEN_OUT_OF_RANGE
        ws = max(0, P - W) if W > 0 else 0
        vcount = max(0, P - ws) if active else 0
        wcount = min(E, MAX_ROW_WRITES) if active else 0
        seeds.append(slot_at(rp, P - 1) if active and P > 0 and wcount > 0 else -1)
        offsets.append(offsets[-1] + wcount)
        v_rows.append((r, rp, ws, vcount))
    total = sum(v[3] for v in v_rows) if verify else 0  # a write-only plan: no entry
    enable = int(total <= verify_capacity) if verify else 0
    verify_offsets = [0]
    for v in v_rows:
        verify_offsets.append(verify_offsets[-1] + v[3])
    if enable:
        for r, rp, ws, vcount in v_rows:
            for pos in range(ws, ws + vcount):
                prev = slot_at(rp, pos - 1) if pos > 0 else -1
                token = -1
                q = pos + off
                if (
                    pool is not None
                    and 0 <= q < vlen[r]
                    and 0 <= rp < len(pool)
                    and q < len(pool[rp])
                ):
                    token = pool[rp][q]
                entries.append((slot_at(rp, pos), token, pos, prev))
    if flags and not pad_bad:
        raise ValueError(f"data outside the tables: {flags!r}")
    data_flags = flags
    if verify and not enable:
        flags |= PlanStatus.VERIFY_OVERFLOW
    offsets += [0] * (write_req_capacity - bs)
    return {
        "write_offsets": offsets,
        "write_seed_slot_indices": seeds,
        "write_num_valid_reqs": bs,
        "row_req_pool_indices": list(rp_l),
        "verify_offsets": verify_offsets if enable else None,
        "entries": entries,
        "verify_num_valid": total if enable or not verify else verify_capacity,
        "verify_enable": enable,
        "flags": flags,
        "data_flags": data_flags,
    }

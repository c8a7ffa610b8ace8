"""Implementations of the same plan that the benchmark compares against.

- ``python_loop_plan``: the tests' plain-Python loop oracle, writing into the buffers
  (the CPU baseline of ``plan_reference``).
- ``torch_plan``: a torch-only plan with static shapes (one lane per verify-capacity
  entry, rows found by ``searchsorted``), so it can be captured in a CUDA graph.
- ``sglang_design_plan``: SGLang's design re-implemented here: a memset of the offsets,
  a single-program offsets scan (one program, one lane per row, so bs <= 4096) and a
  persistent entries kernel with a full binary search per entry. No bounds checks.

Both write every output of the plan that ``plans_equal`` compares (docs/contract.md's
write plan, ``row_req_pool_indices``, the counters, ``verify_offsets`` and the verify
entries), so that each is timed doing the work ``launch_plan`` does and is checked with
the same ``plans_equal`` against ``plan_reference``. SGLang's own plan has no
``row_req_pool_indices`` and keeps its verify offsets in a scratch tensor: the design's
offsets kernel here stores both as it scans its rows (one more int64 store a row). SGLang's
own kernels, on SGLang's own fields, are the ``sglang_cuda`` column
(``benchmarks/sglang_cuda.py``).

- ``traffic_only_plan``, ``memset_outputs`` and ``empty_launch``: not plans but references
  measured the same way. ``traffic_only_plan`` makes the plan's per-entry memory accesses
  and nothing else: it reads a table slot (and a pool token) per entry from contiguous
  memory, looks the slot up in the LUT under SWA (a random read), and writes the four
  int64 outputs; no scan, no row search, no bounds logic. ``memset_outputs`` writes the
  outputs' bytes with one ``zero_()`` (the driver's fill kernel: the fastest write
  measured). ``empty_launch`` is one launch of a kernel that writes one word.

All assume valid data (no entries outside the tables) and are benchmark baselines only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kv_canary_buffers import PlanBuffers
from tests.helpers.oracle import loop_plan

SGLANG_MAX_BS = 4096


def python_loop_plan(buffers: PlanBuffers, **kwargs) -> None:
    """The loop oracle, then its results copied into the buffers."""
    out = loop_plan(
        write_req_capacity=buffers.write_req_capacity,
        verify_capacity=buffers.verify_capacity,
        **kwargs,
    )
    bs = len(out["write_seed_slot_indices"])
    buffers.write_offsets.copy_(torch.tensor(out["write_offsets"]))
    buffers.write_seed_slot_indices[:bs].copy_(torch.tensor(out["write_seed_slot_indices"]))
    buffers.write_num_valid_reqs.fill_(out["write_num_valid_reqs"])
    buffers.row_req_pool_indices[:bs].copy_(torch.tensor(out["row_req_pool_indices"]))
    if out["verify_offsets"] is not None:
        buffers.verify_offsets[: bs + 1].copy_(torch.tensor(out["verify_offsets"]))
    if out["entries"]:
        cols = torch.tensor(out["entries"]).t()
        n = cols.shape[1]
        for dst, col in zip(
            (
                buffers.verify_slot_indices,
                buffers.verify_expected_tokens,
                buffers.verify_expected_positions,
                buffers.verify_prev_slot_indices,
            ),
            cols,
        ):
            dst[:n].copy_(col)
    buffers.verify_num_valid.fill_(out["verify_num_valid"])
    buffers.verify_enable.fill_(out["verify_enable"])


def torch_plan(
    buffers: PlanBuffers,
    *,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    swa_window_size: int = 0,
    full_to_swa_index_mapping: torch.Tensor | None = None,
    req_to_verify_expected_tokens: torch.Tensor | None = None,
    req_to_verify_expected_tokens_valid_lens: torch.Tensor | None = None,
    kv_token_id_vs_position_offset: int = 0,
) -> None:
    """Static-shape torch plan (capturable); needs bs >= 1 and valid data."""
    rp, P, E = req_pool_indices, prefix_lens, extend_seq_lens
    lut = full_to_swa_index_mapping
    bs = rp.shape[0]
    cols = req_to_token.shape[1]
    W = swa_window_size
    active = rp != 0
    ws = (P - W).clamp_min(0) if W > 0 else torch.zeros_like(P)
    vcount = torch.where(active, (P - ws).clamp_min(0), 0)
    wcount = torch.where(active, E.clamp_min(0), 0)

    def xlat(s: torch.Tensor) -> torch.Tensor:
        if lut is None:
            return s
        return torch.where(s >= 0, lut[s.clamp(0, lut.shape[0] - 1)], s)

    buffers.write_offsets.zero_()
    torch.cumsum(wcount, 0, out=buffers.write_offsets[1 : bs + 1])
    seed = xlat(req_to_token[rp, (P - 1).clamp(0, cols - 1)].long())
    buffers.write_seed_slot_indices[:bs] = torch.where(active & (P > 0) & (wcount > 0), seed, -1)
    buffers.write_num_valid_reqs.fill_(bs)
    buffers.row_req_pool_indices[:bs] = rp

    inclusive = torch.cumsum(vcount, 0)
    total = inclusive[-1]
    t = torch.arange(buffers.verify_capacity, device=rp.device)
    row = torch.searchsorted(inclusive, t, right=True).clamp_max(bs - 1)
    pos = ws[row] + t - (inclusive[row] - vcount[row])
    r = rp[row]
    slot = xlat(req_to_token[r, pos.clamp(0, cols - 1)].long())
    prev = torch.where(pos > 0, xlat(req_to_token[r, (pos - 1).clamp(0, cols - 1)].long()), -1)
    if req_to_verify_expected_tokens is not None:
        pool = req_to_verify_expected_tokens
        q = pos + kv_token_id_vs_position_offset
        ok = (q >= 0) & (q < req_to_verify_expected_tokens_valid_lens[row])
        token = torch.where(ok, pool[r, q.clamp(0, pool.shape[1] - 1)].long(), -1)
    else:
        token = torch.full_like(pos, -1)
    enable = total <= buffers.verify_capacity
    for dst, src in (
        (buffers.verify_slot_indices, slot),
        (buffers.verify_expected_tokens, token),
        (buffers.verify_expected_positions, pos),
        (buffers.verify_prev_slot_indices, prev),
    ):
        dst.copy_(torch.where(enable, src, dst))
    # verify_offsets is specified when the plan is enabled (unspecified on an overflow).
    buffers.verify_offsets[:1].zero_()
    torch.cumsum(vcount, 0, out=buffers.verify_offsets[1 : bs + 1])
    buffers.verify_num_valid.copy_(torch.where(enable, total, buffers.verify_capacity))
    buffers.verify_enable.copy_(enable)


@triton.jit
def _sgl_offsets_kernel(
    rp_ptr,
    p_ptr,
    e_ptr,
    table_ptr,
    lut_ptr,
    write_offsets_ptr,
    seed_ptr,
    row_rp_ptr,
    nvr_ptr,
    voff_ptr,
    vnv_ptr,
    ven_ptr,
    bs,
    verify_capacity,
    window,
    cols,
    HAS_LUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.arange(0, BLOCK)
    m = rows < bs
    rp = tl.load(rp_ptr + rows, mask=m, other=0)
    P = tl.load(p_ptr + rows, mask=m, other=0)
    E = tl.load(e_ptr + rows, mask=m, other=0)
    active = m & (rp != 0)
    ws = tl.where(window > 0, tl.maximum(P - window, 0), 0)
    vcount = tl.where(active, tl.maximum(P - ws, 0), 0)
    wcount = tl.where(active, tl.maximum(E, 0), 0)
    tl.store(write_offsets_ptr + rows + 1, tl.cumsum(wcount, 0), mask=m)
    tl.store(row_rp_ptr + rows, rp, mask=m)
    tl.store(voff_ptr + rows + 1, tl.cumsum(vcount, 0), mask=m)
    tl.store(voff_ptr, 0)
    need = active & (P > 0) & (wcount > 0)
    seed = tl.load(table_ptr + rp * cols + P - 1, mask=need, other=0).to(tl.int64)
    if HAS_LUT:
        seed = tl.where(seed >= 0, tl.load(lut_ptr + seed, mask=need & (seed >= 0), other=0), seed)
    tl.store(seed_ptr + rows, tl.where(need, seed, -1), mask=m)
    total = tl.sum(vcount, 0)
    tl.store(nvr_ptr, bs)
    tl.store(vnv_ptr, tl.where(total > verify_capacity, verify_capacity, total).to(tl.int32))
    tl.store(ven_ptr, tl.where(total > verify_capacity, 0, 1).to(tl.int32))


@triton.jit
def _sgl_entries_kernel(
    rp_ptr,
    p_ptr,
    table_ptr,
    lut_ptr,
    pool_ptr,
    vlen_ptr,
    voff_ptr,
    vnv_ptr,
    ven_ptr,
    slot_ptr,
    tok_ptr,
    pos_ptr,
    prev_ptr,
    bs,
    window,
    offset,
    cols,
    pool_cols,
    n_steps,
    HAS_LUT: tl.constexpr,
    HAS_POOL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    total = tl.where(tl.load(ven_ptr) != 0, tl.load(vnv_ptr), 0)
    for start in range(pid * BLOCK, total, nprog * BLOCK):
        t = start + tl.arange(0, BLOCK)
        m = t < total
        lo = tl.zeros([BLOCK], tl.int32)
        hi = lo + bs
        for _ in range(n_steps):
            mid = (lo + hi) // 2
            right = tl.load(voff_ptr + mid, mask=mid < bs, other=0) <= t
            lo = tl.where(right, mid, lo)
            hi = tl.where(right, hi, mid)
        row = lo
        rp = tl.load(rp_ptr + row, mask=m, other=0)
        P = tl.load(p_ptr + row, mask=m, other=0)
        ws = tl.where(window > 0, tl.maximum(P - window, 0), 0)
        pos = ws + t - tl.load(voff_ptr + row, mask=m, other=0)
        slot = tl.load(table_ptr + rp * cols + pos, mask=m, other=0).to(tl.int64)
        prev = tl.load(table_ptr + rp * cols + pos - 1, mask=m & (pos > 0), other=0).to(tl.int64)
        if HAS_LUT:
            slot = tl.where(slot >= 0, tl.load(lut_ptr + slot, mask=m & (slot >= 0), other=0), slot)
            prev = tl.where(prev >= 0, tl.load(lut_ptr + prev, mask=m & (prev >= 0), other=0), prev)
        prev = tl.where(pos > 0, prev, -1)
        if HAS_POOL:
            q = pos + offset
            ok = m & (q >= 0) & (q < tl.load(vlen_ptr + row, mask=m, other=0))
            tok = tl.load(pool_ptr + rp * pool_cols + q, mask=ok, other=-1).to(tl.int64)
        else:
            tok = tl.full([BLOCK], -1, tl.int64)
        tl.store(slot_ptr + t, slot, mask=m)
        tl.store(tok_ptr + t, tok, mask=m)
        tl.store(pos_ptr + t, pos, mask=m)
        tl.store(prev_ptr + t, prev, mask=m)


def sglang_design_plan(
    buffers: PlanBuffers,
    *,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    swa_window_size: int = 0,
    full_to_swa_index_mapping: torch.Tensor | None = None,
    req_to_verify_expected_tokens: torch.Tensor | None = None,
    req_to_verify_expected_tokens_valid_lens: torch.Tensor | None = None,
    kv_token_id_vs_position_offset: int = 0,
) -> None:
    """Memset + single-program scan + persistent entries kernel; bs <= 4096."""
    bs = req_pool_indices.shape[0]
    if bs > SGLANG_MAX_BS:
        raise ValueError(f"the single-program scan handles bs <= {SGLANG_MAX_BS}, got {bs}")
    lut = full_to_swa_index_mapping
    pool = req_to_verify_expected_tokens
    lut_t = lut if lut is not None else buffers.dummy_int64
    pool_t = pool if pool is not None else buffers.dummy_int32
    vlen_t = (
        req_to_verify_expected_tokens_valid_lens
        if req_to_verify_expected_tokens_valid_lens is not None
        else buffers.dummy_int64
    )
    cols = req_to_token.shape[1]
    buffers.write_offsets.zero_()  # the memset
    _sgl_offsets_kernel[(1,)](
        req_pool_indices,
        prefix_lens,
        extend_seq_lens,
        req_to_token,
        lut_t,
        buffers.write_offsets,
        buffers.write_seed_slot_indices,
        buffers.row_req_pool_indices,
        buffers.write_num_valid_reqs,
        buffers.verify_offsets,
        buffers.verify_num_valid,
        buffers.verify_enable,
        bs,
        buffers.verify_capacity,
        swa_window_size,
        cols,
        HAS_LUT=lut is not None,
        BLOCK=max(16, triton.next_power_of_2(bs)),
        num_warps=8,
    )
    # One persistent program per SM (a few in Triton's interpreter, which has no SMs).
    device = req_pool_indices.device
    sms = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else 2
    )
    _sgl_entries_kernel[(sms,)](
        req_pool_indices,
        prefix_lens,
        req_to_token,
        lut_t,
        pool_t,
        vlen_t,
        buffers.verify_offsets,
        buffers.verify_num_valid,
        buffers.verify_enable,
        buffers.verify_slot_indices,
        buffers.verify_expected_tokens,
        buffers.verify_expected_positions,
        buffers.verify_prev_slot_indices,
        bs,
        swa_window_size,
        kv_token_id_vs_position_offset,
        cols,
        pool.shape[1] if pool is not None else 0,
        max(1, bs).bit_length(),
        HAS_LUT=lut is not None,
        HAS_POOL=pool is not None,
        BLOCK=1024,
        num_warps=4,
    )


@triton.jit
def _traffic_kernel(
    table_ptr,
    lut_ptr,
    pool_ptr,
    slot_ptr,
    token_ptr,
    position_ptr,
    prev_ptr,
    n,
    HAS_LUT: tl.constexpr,
    HAS_POOL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    slot = tl.load(table_ptr + idx, mask=mask, other=0).to(tl.int64)
    if HAS_LUT:
        slot = tl.load(lut_ptr + slot, mask=mask, other=0)
    if HAS_POOL:
        token = tl.load(pool_ptr + idx, mask=mask, other=0).to(tl.int64)
    else:
        token = idx.to(tl.int64)
    tl.store(slot_ptr + idx, slot, mask=mask)
    tl.store(token_ptr + idx, token, mask=mask)
    tl.store(position_ptr + idx, idx.to(tl.int64), mask=mask)
    tl.store(prev_ptr + idx, slot - 1, mask=mask)


TRAFFIC_BLOCK = 128
TRAFFIC_WARPS = 4
"""Entries and warps per program of ``_traffic_kernel``: the fastest of the sweep in
``python -m benchmarks --stage plan --tune`` on the H200 (docs/performance.md)."""


def traffic_only_plan(
    buffers: PlanBuffers,
    entries: int,
    *,
    req_to_token: torch.Tensor,
    full_to_swa_index_mapping: torch.Tensor | None = None,
    req_to_verify_expected_tokens: torch.Tensor | None = None,
    **_unused,
) -> None:
    """The plan's per-entry memory traffic for ``entries`` entries, without its logic:
    the first ``entries`` slots of the table (and tokens of the pool), read in order, each
    slot looked up in the LUT when there is one, and the four outputs written.

    Takes ``plan_reference``'s keyword arguments (same shapes and dtypes: ``req_to_token``
    int32 ``[rows, cols]``, the LUT int64 ``[lut_len]``, the pool int32
    ``[pool_rows, pool_cols]``); the table and the pool must hold ``entries`` elements."""
    lut, pool = full_to_swa_index_mapping, req_to_verify_expected_tokens
    assert req_to_token.numel() >= entries and (pool is None or pool.numel() >= entries)
    _traffic_kernel[(triton.cdiv(entries, TRAFFIC_BLOCK),)](
        req_to_token,
        lut if lut is not None else buffers.dummy_int64,
        pool if pool is not None else buffers.dummy_int32,
        buffers.verify_slot_indices,
        buffers.verify_expected_tokens,
        buffers.verify_expected_positions,
        buffers.verify_prev_slot_indices,
        entries,
        HAS_LUT=lut is not None,
        HAS_POOL=pool is not None,
        BLOCK=TRAFFIC_BLOCK,
        num_warps=TRAFFIC_WARPS,
    )


def memset_outputs(scratch: torch.Tensor) -> None:
    """One ``zero_()`` of ``scratch`` (int64 ``[4 * entries]``: as many bytes as the four
    verify outputs of a plan of ``entries`` entries)."""
    scratch.zero_()


@triton.jit
def _empty_kernel(ptr):
    tl.store(ptr, 1)


def empty_launch(buffers: PlanBuffers) -> None:
    """One launch of a kernel that stores one word: the per-launch floor."""
    _empty_kernel[(1,)](buffers.status)

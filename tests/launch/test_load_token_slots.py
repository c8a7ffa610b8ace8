"""``launch_load_token_slots`` (the engines runtime's TokenSlots table load) against its
torch reference, byte for byte, on generated batches and on hostile data (int64 slots
outside int32, rows outside the table, negative or crossing starts, lists longer than
``max_len``, the table or ``slots``); its validation writes nothing on a rejection. Kernels
on CUDA, or in Triton's interpreter on the CPU (tests/conftest.py)."""

import pytest
import torch

from kv_canary_buffers import load_token_slots_reference
from kv_canary_kernels import launch_load_token_slots
from kv_canary_kernels.tables import BLOCK
from tests.helpers import DEVICE

POISON = -7  # every table entry before a load: what no lane writes stays it


def _both(table_shape, slots, rows, starts, max_len):
    out = []
    for load in (load_token_slots_reference, launch_load_token_slots):
        table = torch.full(table_shape, POISON, dtype=torch.int32, device=DEVICE)
        load(
            table,
            slots.to(DEVICE),
            torch.tensor(rows, dtype=torch.int64, device=DEVICE),
            torch.tensor(starts, dtype=torch.int64, device=DEVICE),
            max_len=max_len,
        )
        out.append(table.cpu())
    return out


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("seed", [0, 1])
def test_generated_batches_equal_the_reference(dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    bs = 5
    lengths = torch.randint(0, BLOCK + 40, (bs,), generator=gen).tolist()  # some span 2 blocks
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    slots = torch.randint(0, 10_000, (starts[-1] + 3,), generator=gen, dtype=torch.int64).to(dtype)
    rows = torch.randperm(8, generator=gen)[:bs].add(1).tolist()
    ref, ker = _both((9, max(lengths) + 4), slots, rows, starts, max(lengths))
    assert torch.equal(ref, ker)
    for b, row in enumerate(rows):  # and each row holds its list, the rest untouched
        n = lengths[b]
        assert torch.equal(ref[row, :n], slots[starts[b] : starts[b] + n].to(torch.int32))
        assert (ref[row, n:] == POISON).all()
    untouched = [r for r in range(9) if r not in rows]
    assert (ref[untouched] == POISON).all()


def test_hostile_data_equals_the_reference_and_stays_inside():
    big = [2**40, -(2**40), 2**31, -(2**31) - 1, 2**63 - 1, -(2**63), 5, 6]
    slots = torch.tensor(big * 4, dtype=torch.int64)
    rows = [1, 0, 3, -1, 2, 99, 2**62, 4, 5]
    # row 0 is a table row like any other; -1, 99 and 2**62 are outside the 6-row table.
    # The lists: row 1 [0, 8) longer than max_len; row 0 [8, 4) crossing; row 3 [4, -5)
    # crossing; row 2 [30, 40) past the slots' 32; row 4 [-3, 2) a negative start;
    # row 5 [1, -2**63) crossing so far that hi - lo would wrap
    starts = [0, 8, 4, -5, 30, 40, 2**63 - 1, -3, 1, -(2**63)]
    ref, ker = _both((6, 6), slots, rows, starts, 6)
    assert torch.equal(ref, ker)
    # row 1: 8 slots cut to max_len 6, saturated to int32
    want = torch.tensor(big[:6], dtype=torch.int64).clamp(-(2**31), 2**31 - 1).to(torch.int32)
    assert torch.equal(ref[1], want)
    assert (ref[0] == POISON).all()  # hi < lo: nothing
    assert torch.equal(ref[2, :2], slots[30:32].to(torch.int32))  # only 2 slots left
    assert (ref[2, 2:] == POISON).all()
    assert (ref[3] == POISON).all()  # its list crosses (4 -> -5)
    assert (ref[4] == POISON).all()  # its start is negative
    assert (ref[5] == POISON).all()  # its list crosses: no wrap onto slots[1:]


def test_a_max_len_below_the_lists_cuts_them():
    slots = torch.arange(1, 21, dtype=torch.int64)
    ref, ker = _both((3, 8), slots, [1, 2], [0, 10, 20], 3)
    assert torch.equal(ref, ker)
    assert ref[1, :3].tolist() == [1, 2, 3] and (ref[1, 3:] == POISON).all()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(table=torch.zeros(2, 4, dtype=torch.int64)), "req_to_token must have dtype"),
        (dict(slots=torch.zeros(4, dtype=torch.float32)), "slots must be an int32 or int64"),
        (dict(slots=[0, 1, 2, 3]), "slots must be a torch.Tensor, got list"),
        (dict(rows=torch.zeros(2, dtype=torch.int32)), "rows must have dtype"),
        (dict(starts=torch.zeros(2, dtype=torch.int64)), "starts must have bs \\+ 1 = 3"),
        (dict(max_len=5), "max_len must be an int in \\[0, req_to_token.shape\\[1\\] = 4\\]"),
        (dict(max_len=2.0), "max_len must be an int"),
    ],
)
def test_a_rejected_call_writes_nothing(change, message):
    args = dict(
        table=torch.full((2, 4), POISON, dtype=torch.int32),
        slots=torch.arange(4, dtype=torch.int64),
        rows=torch.tensor([0, 1]),
        starts=torch.tensor([0, 2, 4]),
        max_len=2,
    )
    args.update(change)
    args = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    for load in (load_token_slots_reference, launch_load_token_slots):
        with pytest.raises((TypeError, ValueError), match=message):
            load(
                args["table"], args["slots"], args["rows"], args["starts"], max_len=args["max_len"]
            )
        if args["table"].dtype == torch.int32:
            assert (args["table"] == POISON).all()


# --- the step's other parts on the same launch: the pool scatter and the widening --------
def _parts(seed, m, n, ids_dtype, pos_dtype, pool_shape=(5, 7)):
    gen = torch.Generator().manual_seed(seed)
    numel = pool_shape[0] * pool_shape[1]
    # distinct indices, some outside the pool on both sides (they write nothing)
    inside = torch.randperm(numel, generator=gen)[: max(m - 3, 0)]
    index = torch.cat([inside, torch.tensor([-1, numel, 2**62])])[:m]
    return dict(
        pool_index=index[torch.randperm(m, generator=gen)].to(torch.int64),
        pool_tokens=torch.randint(-(2**31), 2**31 - 1, (m,), generator=gen, dtype=torch.int32),
        input_ids=torch.randint(-(2**31), 2**31 - 1, (n,), generator=gen).to(ids_dtype),
        positions=torch.randint(0, 2**40, (n,), generator=gen).to(pos_dtype),
    )


GUARD = 64  # poisoned entries around the pool and the wide buffer: no lane may touch them


def _guarded(shape, dtype):
    """A poisoned contiguous ``shape`` tensor inside a poisoned buffer ``GUARD`` entries
    larger on each side (and the buffer, to check that its guards stayed poisoned)."""
    numel = shape[0] * shape[1]
    buffer = torch.full((numel + 2 * GUARD,), POISON, dtype=dtype, device=DEVICE)
    return buffer[GUARD : GUARD + numel].view(shape), buffer


def _guards_intact(buffer):
    return bool((buffer[:GUARD] == POISON).all() and (buffer[-GUARD:] == POISON).all())


def _both_parts(parts, *, table_rows=3, max_len=4, pool_shape=(5, 7), wide_width=None, lists=True):
    n = parts["input_ids"].shape[0] if "input_ids" in parts else 0
    starts = [0, 3, 5] if lists else [0, 0, 0]
    out = []
    for load in (load_token_slots_reference, launch_load_token_slots):
        table = torch.full((table_rows, 4), POISON, dtype=torch.int32, device=DEVICE)
        kwargs = {k: v.to(DEVICE) for k, v in parts.items()}
        pool = wide = None
        buffers = []
        if "pool_index" in parts:
            pool, buffer = _guarded(pool_shape, torch.int32)
            kwargs["pool"] = pool
            buffers.append(buffer)
        if "input_ids" in parts:
            width = n + 3 if wide_width is None else wide_width
            wide, buffer = _guarded((2, width), torch.int64)
            kwargs["wide"] = wide
            buffers.append(buffer)
        load(
            table,
            torch.arange(10, 20, dtype=torch.int64, device=DEVICE),
            torch.tensor([2, 0], dtype=torch.int64, device=DEVICE),
            torch.tensor(starts, dtype=torch.int64, device=DEVICE),
            max_len=max_len,
            **kwargs,
        )
        # nothing outside the pool and the wide buffer was written (an index one past the
        # pool, or the second row's stride, would land in a guard)
        assert all(_guards_intact(b) for b in buffers), load.__name__
        out.append([x.cpu() if x is not None else None for x in (table, pool, wide)])
    return out


@pytest.mark.parametrize(
    "ids_dtype, pos_dtype",
    [(torch.int32, torch.int32), (torch.int32, torch.int64), (torch.int64, torch.int64)],
)
@pytest.mark.parametrize("m, n", [(13, 13), (BLOCK + 5, 2), (3, BLOCK + 7)])
def test_the_pool_scatter_and_the_widening_equal_the_reference(ids_dtype, pos_dtype, m, n):
    pool_shape = (40, 40) if m > 100 else (5, 7)
    parts = _parts(m + n, m, n, ids_dtype, pos_dtype, pool_shape)
    (t_ref, p_ref, w_ref), (t_ker, p_ker, w_ker) = _both_parts(parts, pool_shape=pool_shape)
    assert torch.equal(t_ref, t_ker) and torch.equal(p_ref, p_ker) and torch.equal(w_ref, w_ker)
    # what each part writes, independently of both loads
    assert t_ref[2, :3].tolist() == [10, 11, 12] and t_ref[0, :2].tolist() == [13, 14]
    flat = p_ref.view(-1)
    index, tokens = parts["pool_index"], parts["pool_tokens"]
    hit = (index >= 0) & (index < flat.shape[0])
    assert torch.equal(flat[index[hit]], tokens[hit])
    assert int((flat != POISON).sum()) <= int(hit.sum())  # nothing written off the hits
    assert torch.equal(w_ref[0, :n], parts["input_ids"].to(torch.int64))
    assert torch.equal(w_ref[1, :n], parts["positions"].to(torch.int64))
    assert (w_ref[:, n:] == POISON).all()


@pytest.mark.parametrize("which", ["pool", "widen"])
def test_one_part_alone_and_without_any_list(which):
    parts = _parts(3, 6, 5, torch.int32, torch.int32)
    keep = ("pool_index", "pool_tokens") if which == "pool" else ("input_ids", "positions")
    parts = {k: parts[k] for k in keep}
    for lists, max_len in ((True, 4), (False, 0)):  # max_len 0: no slot program at all
        (t_ref, p_ref, w_ref), (t_ker, p_ker, w_ker) = _both_parts(
            parts, max_len=max_len, lists=lists
        )
        assert torch.equal(t_ref, t_ker)
        if which == "pool":
            assert w_ref is None and torch.equal(p_ref, p_ker) and (p_ref != POISON).any()
        else:
            assert p_ref is None and torch.equal(w_ref, w_ker)
            assert torch.equal(w_ref[0, :5], parts["input_ids"].to(torch.int64))
        if max_len == 0:
            assert (t_ref == POISON).all()


@pytest.mark.parametrize(
    "change, message",
    [
        (
            dict(pool=None),
            "pool, pool_index and pool_tokens must be given together, got pool_index, pool_tokens",
        ),
        (
            dict(pool_tokens=torch.zeros(3, dtype=torch.int32)),
            "pool_tokens must have pool_index's 2 entries, got 3",
        ),
        (
            dict(pool_index=torch.zeros(2, dtype=torch.int32)),
            "pool_index must have dtype torch.int64",
        ),
        (dict(pool=torch.zeros(2, 2, dtype=torch.int64)), "pool must have dtype torch.int32"),
        (
            dict(wide=None),
            "input_ids, positions and wide must be given together, got input_ids, positions",
        ),
        (
            dict(positions=torch.zeros(3, dtype=torch.int32)),
            "positions must have input_ids' 2 entries, got 3",
        ),
        (
            dict(input_ids=torch.zeros(2, dtype=torch.float32)),
            "input_ids must be an int32 or int64",
        ),
        (dict(input_ids=[1, 2]), "input_ids must be a torch.Tensor, got list"),
        (dict(wide=torch.zeros(2, 1, dtype=torch.int64)), "wide must be int64 \\[2, >= 2\\]"),
        (dict(wide=torch.zeros(3, 4, dtype=torch.int64)), "wide must be int64 \\[2, >= 2\\]"),
    ],
)
def test_a_rejected_part_writes_nothing(change, message):
    parts = dict(
        pool=torch.full((2, 2), POISON, dtype=torch.int32),
        pool_index=torch.tensor([0, 3]),
        pool_tokens=torch.tensor([5, 6], dtype=torch.int32),
        input_ids=torch.tensor([1, 2], dtype=torch.int32),
        positions=torch.tensor([3, 4], dtype=torch.int32),
        wide=torch.full((2, 2), POISON, dtype=torch.int64),
    )
    parts.update(change)
    parts = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in parts.items()}
    table = torch.full((2, 4), POISON, dtype=torch.int32, device=DEVICE)
    for load in (load_token_slots_reference, launch_load_token_slots):
        with pytest.raises((TypeError, ValueError), match=message):
            load(
                table,
                torch.arange(4, dtype=torch.int64, device=DEVICE),
                torch.tensor([0, 1], device=DEVICE),
                torch.tensor([0, 2, 4], device=DEVICE),
                max_len=2,
                **parts,
            )
        assert (table == POISON).all()
        for name in ("pool", "wide"):
            if name not in change:  # (the poisoned ones)
                assert (parts[name] == POISON).all()

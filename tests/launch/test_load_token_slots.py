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

"""The write kernel's split into side and chain programs, under other program orders.

On a GPU the side programs (pid < ceil(write_req_capacity / write_rows)) and the chain
programs run concurrently in any order; Triton's interpreter runs them in pid order (side
first). :func:`program_order` makes the interpreter run a launch's programs in another
order (reversed: chain programs first; or shuffled), so that a column written by one kind
and read by the other (the seed's record) would show. The cases hold only data the
contract defines (no slot in two rows, no row seeded from a slot another row writes), and
each is compared with the loop model under every order, with the interpreter's one chain
program per side program and with a GPU-like count (``write_chain_programs`` of 3, rows
strided differently from the side programs'). A self-test shows the harness does change
the order (two rows writing one slot: the unspecified case, whose last writer flips).

Also: ``slot_limit`` (the chain programs' one unsigned compare) against the side
programs' rule for int64 extremes, and the kernel's runtime ints all unspecialized."""

from __future__ import annotations

import contextlib
import inspect
import random

import pytest
import torch

from kv_canary_buffers import CanaryStatus, RealKV, RealKVMode
from kv_canary_kernels import launch_write
from kv_canary_kernels import write as W
from kv_canary_kernels.config import INTERPRETING, launch_config
from kv_canary_kernels.sources import SourceArgs
from tests.helpers.canary import (
    DEVICE,
    assert_store_matches_model,
    i64,
    make_source,
    model_state,
    model_write,
    new_plan,
    new_store,
    set_write_plan,
)

needs_interpreter = pytest.mark.skipif(
    not INTERPRETING, reason="reorders the programs of Triton's interpreter"
)

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


@contextlib.contextmanager
def program_order(kind: str, seed: int = 0):
    """Run each interpreted launch's programs in ``kind`` order: "natural", "reversed"
    or "shuffled" (a permutation drawn per launch from ``seed``)."""
    import triton.runtime.interpreter as interp

    builder = interp.interpreter_builder
    set_dim, set_idx = builder.set_grid_dim, builder.set_grid_idx
    rng = random.Random(seed)
    perm: list[int] = []

    def dim(x, y, z):
        perm[:] = range(x)
        if kind == "reversed":
            perm.reverse()
        elif kind == "shuffled":
            rng.shuffle(perm)
        return set_dim(x, y, z)

    def idx(x, y, z):
        return set_idx(perm[x], y, z)

    builder.set_grid_dim, builder.set_grid_idx = dim, idx
    try:
        yield
    finally:
        builder.set_grid_dim, builder.set_grid_idx = set_dim, set_idx


@contextlib.contextmanager
def chain_grid(gpu_like: bool):
    """The launch's chain programs: one per side program (the interpreter's), or as on a
    GPU, ``min(capacity, max(side programs, write_chain_programs))`` with 3 of them."""
    saved = W.INTERPRETING
    W.INTERPRETING = not gpu_like
    try:
        with launch_config(write_chain_programs=3):
            yield
    finally:
        W.INTERPRETING = saved


CAP = 40  # two side programs of 32 rows; 2 (interpreter) or 3 (GPU-like) chain programs
NUM_SLOTS = 160


def split_case(chain_tokens: int, *, expected: bool, num_rows: int | None, real_kv: bool):
    """Rows around ``chain_tokens`` with every kind of token, in both side programs.

    - row 0 (seed 5, long): its seed first, in the middle and last; a duplicate slot; a
      skipped token; a slot past the store; an input mismatch; a position jump
      (and slot 150, 146 in row 33, 144 in row 36: with sources, past the second one).
    - row 1 (seed 6): exactly ``chain_tokens`` tokens (a side row), its seed in the middle.
    - row 2 (no seed): ``chain_tokens + 1`` tokens (the shortest chain row), a duplicate.
    - row 3: busy with a seed past the store (skipped whole).
    - rows 4..32 idle; row 33 (seed 7, second side program): long, its seed last, a
      position jump; row 34 (seed 8): one token, its own seed; row 35 (seed -3): two
      tokens; row 36 (seed 9): long, its write range past ``n`` (the last row).
    """
    store = new_store(num_slots=NUM_SLOTS, violation_capacity=12)
    for s, pos in ((5, 10), (6, 20), (7, 30), (8, 40), (9, 50)):
        store.records[s, 1] = pos
    store.enable_chain_position_check()
    plan = new_plan(write_req_capacity=CAP)
    fresh = iter(range(20, 140))  # 140 on: placed by hand
    rows: list[tuple[int, list[int], list[int]]] = []  # (seed, slots, positions)

    def row(seed, slots, start):
        positions, p = [], start
        for _s in slots:
            p += 1
            positions.append(p)
        rows.append((seed, slots, positions))

    long_len = chain_tokens + 9
    r0 = [next(fresh) for _ in range(long_len)]
    r0[0] = r0[-3] = r0[-1] = 5
    r0[1] = -1
    r0[2] = NUM_SLOTS + 4
    r0[4] = r0[3]  # duplicate of a non-seed slot
    r0[5] = 150  # with sources: its page row lies past the second
    row(5, r0, 10)
    rows[-1][2][-2] += 3  # a position jump
    r1 = [next(fresh) for _ in range(chain_tokens)]
    if r1:
        r1[len(r1) // 2] = 6
    row(6, r1, 20)
    r2 = [next(fresh) for _ in range(chain_tokens + 1)]
    if len(r2) > 1:
        r2[-1] = r2[0]
    row(-1, r2, 0)
    row(NUM_SLOTS + 1, [next(fresh), next(fresh)], 0)
    for _ in range(29):
        row(-1, [], 0)
    r33 = [next(fresh) for _ in range(chain_tokens + 3)]
    r33[-1] = 7
    r33[2] = 146  # with sources: past the second
    row(7, r33, 30)
    rows[-1][2][1] -= 2
    row(8, [8], 40)
    row(-3, [next(fresh), next(fresh)], 0)
    r36 = [next(fresh) for _ in range(chain_tokens + 2)] + [9]
    r36[0], r36[1] = 143, 144  # with sources: the last slot inside both, the first past
    row(9, r36, 50)
    written = [{s for s in slots if 0 <= s < NUM_SLOTS} for _, slots, _ in rows]
    assert sum(map(len, written)) == len(set().union(*written))  # no slot in two rows

    ocl = [s for _, slots, _ in rows for s in slots]
    pos = [p for _, _, ps in rows for p in ps]
    ids = [1000 + i for i in range(len(ocl))]
    offsets = [0]
    for _, slots, _ in rows:
        offsets.append(offsets[-1] + len(slots))
    n = len(ocl) - 2  # row 36's last two tokens (its seed among them) lie past n
    offsets += [offsets[-1]] * (CAP - len(rows))
    set_write_plan(plan, offsets, [seed for seed, _, _ in rows], num_rows)
    kw = dict(
        input_ids=i64(ids[:n]),
        positions=i64(pos[:n]),
        out_cache_loc=i64(ocl[:n]),
        launch_tag=-4,
    )
    if expected:
        exp_ids, exp_pos = list(ids[:n]), list(pos[:n])
        exp_ids[3] += 1  # row 0
        exp_pos[offsets[33] + 2] -= 1  # row 33
        exp_ids[offsets[34]] = 0  # row 34's single token
        kw.update(expected_input_ids=i64(exp_ids), expected_positions=i64(exp_pos))
    if real_kv:
        g = torch.Generator().manual_seed(5)
        # page_size 4: 40 and 36 rows, so slots from 144 on lie past the second source
        src = (
            make_source(g, 40, 4 * 32, spare_rows=1, device=DEVICE),
            make_source(g, 36, 4 * 32, spare_rows=2, device=DEVICE),
        )
        kw["real_kv"] = RealKV(mode=RealKVMode.ALL, sources=src, page_size=4, bytes_per_token=32)
    return store, plan, kw


ORDERS = ["natural", "reversed", "shuffled"]


@needs_interpreter
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("gpu_like", [False, True])
@pytest.mark.parametrize(
    ("chain_tokens", "expected", "num_rows", "real_kv"),
    [
        (0, True, None, False),
        (2, False, CAP + 5, False),  # write_num_valid_reqs past the capacity: clamped
        (4, True, None, True),
        (16, True, None, False),
    ],
)
def test_split_equals_the_model_in_any_program_order(
    order, gpu_like, chain_tokens, expected, num_rows, real_kv
):
    store, plan, kw = split_case(
        chain_tokens, expected=expected, num_rows=num_rows, real_kv=real_kv
    )
    model = model_write(model_state(store), plan, **kw, chain_position_check=True)
    assert model.rows and model.status & CanaryStatus.WRITE_SLOT_OUT_OF_RANGE
    assert model.status & CanaryStatus.SEED_OUT_OF_RANGE
    assert model.status & CanaryStatus.WRITE_INDEX_OUT_OF_RANGE
    with (
        launch_config(write_chain_tokens=chain_tokens),
        chain_grid(gpu_like),
        program_order(order, seed=chain_tokens),
    ):
        launch_write(store, plan, **kw)
    assert_store_matches_model(store, model)


@needs_interpreter
@pytest.mark.parametrize("order", ORDERS)
def test_split_all_rows_short_and_a_negative_row_count(order):
    """A decode step (one token a row: the side programs' loop-free path), and a plan
    whose row count is negative (nothing written but the count and the status bit)."""
    for num_rows in (None, -2):
        store = new_store(num_slots=64)
        store.records[3, 1] = 7
        store.enable_chain_position_check()
        plan = new_plan(write_req_capacity=CAP)
        seeds = [3] + [-1] * 32 + [-1, 40]
        offsets = [0, 1] + [1] * 32 + [2, 3]
        set_write_plan(plan, offsets + [3] * (CAP + 1 - len(offsets)), seeds, num_rows)
        kw = dict(input_ids=i64([1, 2, 3]), positions=i64([9, 1, 2]), out_cache_loc=i64([3, 5, 40]))
        model = model_write(model_state(store), plan, **kw, chain_position_check=True)
        with chain_grid(True), program_order(order, seed=1):
            launch_write(store, plan, **kw)
        assert_store_matches_model(store, model)
        if num_rows is None:
            # row 0: 9 != 7 + 1; row 34 (seeded from the slot it writes): 2 != junk + 1
            assert len(model.rows) == 2 and model.processed == 3


@needs_interpreter
def test_the_harness_changes_the_order():
    """Two short rows in two side programs write one slot (unspecified: the last writer
    wins): natural order keeps row 33's record, reversed order row 0's."""
    got = {}
    for order in ("natural", "reversed"):
        store = new_store(num_slots=16)
        plan = new_plan(write_req_capacity=CAP)
        offsets = [0, 1] + [1] * 32 + [2] + [2] * (CAP - 34)
        set_write_plan(plan, offsets, [-1] * 34)
        with program_order(order):
            launch_write(
                store,
                plan,
                input_ids=i64([11, 22]),
                positions=i64([0, 0]),
                out_cache_loc=i64([4, 4]),
            )
        got[order] = int(store.records[4, 0])
    assert got == {"natural": 22, "reversed": 11}


# --- slot_limit ------------------------------------------------------------------------
def _side_ok(s: int, num_slots: int, page_size: int, rows: list[int]) -> bool:
    """The side programs' rule: in the store and, with sources, its page row in each."""
    return 0 <= s < num_slots and all(s // page_size < r for r in rows)


def _sources(rows: list[int], page_size: int) -> SourceArgs:
    pad = [0] * (4 - len(rows))
    ints = (*([1] * len(rows)), *pad, *rows, *pad)
    return SourceArgs((None,) * 4, ints, len(rows), 2, page_size, 2, 2, ())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("num_slots", "page_size", "rows"),
    [
        (100, 1, []),
        (100, 4, [25, 24, 30]),
        (100, 4, [26]),
        (101, 7, [15, 14, 0, 20]),
        (INT64_MAX, 1 << 40, [1 << 30, (1 << 22) + 1]),  # one product past int64
        (INT64_MAX - 5, 1 << 40, [1 << 30]),  # the product past int64: num_slots bounds
        (INT64_MAX, INT64_MAX, [1]),
        (1, 3, [1]),
        (5, 2, [0]),
    ],
)
def test_slot_limit_is_the_side_rule_for_any_int64(num_slots, page_size, rows):
    limit = W.slot_limit(num_slots, _sources(rows, page_size))
    assert 0 <= limit <= num_slots <= INT64_MAX  # passed as an int64
    probes = {INT64_MIN, INT64_MIN + 1, -2, -1, 0, 1, INT64_MAX - 1, INT64_MAX}
    probes |= {num_slots + d for d in (-1, 0, 1)}
    probes |= {r * page_size + d for r in rows for d in (-1, 0, 1)}
    probes |= {limit + d for d in (-1, 0, 1)}
    for s in sorted(p for p in probes if INT64_MIN <= p <= INT64_MAX):
        chain_ok = (s % (1 << 64)) < limit  # the kernel's bitcast to uint64
        assert chain_ok == _side_ok(s, num_slots, page_size, rows), s


def test_runtime_ints_are_not_specialized():
    """Every int64 argument of the write kernel is a runtime value (the launcher reuses
    one compiled variant for every store, plan and source): none may be specialized."""
    params = inspect.signature(W.canary_write_kernel.fn).parameters
    ints = [name for name, p in params.items() if "int64" in str(p.annotation)]
    assert {"slot_limit", "chain_programs", "chain_tokens"} <= set(ints)
    assert sorted(ints) == sorted(W._RUNTIME_INTS)

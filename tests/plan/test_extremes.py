"""Hostile data: every per-row input may hold any int64, the window any value in
[0, 2**63 - 1], the token offset any int64 (docs/contract.md, "Extreme values").

Property tests draw per-row values from the whole int64 range, weighted to the edges
(+-2**63, +-2**62, +-2**31 and their neighbours), on both plan paths and every kernel path
(the small path below SCAN_BLOCK rows; at and above it one launch or three). Every
example checks the contract's stated results against the loop oracle (Python integers,
which cannot wrap), that the paths agree, that the kernels finish and that nothing is
written outside the plan's outputs: the whole arena is poisoned first, and the alignment
gaps after every field, the seeds past bs and the entries past verify_num_valid must still
hold the poison afterwards. Then the issue's own examples, by hand.
"""

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kv_canary_buffers import PlanBuffers, PlanStatus, plan_reference
from kv_canary_buffers.layout import INT64_MAX, INT64_MIN, MAX_ROW_WRITES, SCAN_BLOCK
from kv_canary_kernels import launch_plan
from kv_canary_kernels.config import launch_config
from tests.helpers import DEVICE, LARGE_PATHS
from tests.helpers.oracle import loop_plan
from tests.helpers.plan import (
    arena_snapshot,
    assert_arena_unchanged,
    assert_buffers_equal,
    assert_in_bounds,
    assert_matches_oracle,
    poison_arena,
)

I64, I32 = torch.int64, torch.int32

EDGES = sorted(
    e
    for e in {s * v + d for v in (2**63, 2**62, 2**31) for s in (1, -1) for d in (-1, 0, 1)}
    | {-2, -1, 0, 1, 2}
    if INT64_MIN <= e <= INT64_MAX
)
"""+-2**63, +-2**62, +-2**31 and their int64 neighbours, and the values around 0."""


def int64s():
    return st.one_of(st.sampled_from(EDGES), st.integers(INT64_MIN, INT64_MAX))


@st.composite
def hostile(draw, *, large: bool = False) -> dict[str, Any]:
    """A batch whose per-row values and integer arguments come from the whole int64 range
    (and small, in-table values, so that some rows plan entries). ``large``: the drawn
    rows sit among SCAN_BLOCK padding rows that hold extreme garbage, so the batch takes
    the three-launch path."""
    rows = draw(st.integers(2, 5))
    cols = draw(st.integers(1, 12))
    n_slots = draw(st.integers(1, 30))
    pool_cols = draw(st.integers(0, 12))
    window = draw(
        st.one_of(
            st.sampled_from([0, 0, 0, 1, 3, 2**31 - 1, 2**31, 2**62, INT64_MAX]),
            st.integers(0, INT64_MAX),
        )
    )
    use_lut = window > 0 or draw(st.booleans())
    use_pool = draw(st.booleans())
    n = draw(st.integers(0, 10))
    in_table = st.integers(1, rows - 1)
    rp = [draw(st.one_of(st.just(0), in_table, in_table, int64s())) for _ in range(n)]
    # prefixes near 2**62 and 2**63 are drawn often: two of them overflow a sum
    huge = st.sampled_from([2**62 - 1, 2**62, 2**62 + 1, INT64_MAX - 1, INT64_MAX])
    P = [draw(st.one_of(st.integers(-2, cols + 2), int64s(), huge)) for _ in range(n)]
    E = [draw(st.one_of(st.integers(-2, 5), int64s())) for _ in range(n)]
    V = [draw(st.one_of(st.integers(-1, pool_cols + 2), int64s())) for _ in range(n)]
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    if large:
        bs = SCAN_BLOCK + draw(st.integers(0, 300))
        garbage = torch.tensor(EDGES)
        pick = lambda: garbage[torch.randint(0, len(EDGES), (bs,), generator=g)]  # noqa: E731
        cols_rp, cols_p, cols_e, cols_v = torch.zeros(bs, dtype=I64), pick(), pick(), pick()
        where = torch.randperm(bs, generator=g)[:n].tolist()
        for i, r in enumerate(where):
            cols_rp[r], cols_p[r], cols_e[r], cols_v[r] = rp[i], P[i], E[i], V[i]
        rp, P, E, V = (t.tolist() for t in (cols_rp, cols_p, cols_e, cols_v))
    else:
        bs = n
    kwargs: dict[str, Any] = dict(
        req_pool_indices=torch.tensor(rp, dtype=I64),
        prefix_lens=torch.tensor(P, dtype=I64),
        extend_seq_lens=torch.tensor(E, dtype=I64),
        req_to_token=torch.randint(-2, n_slots, (rows, cols), generator=g).to(I32),
        swa_window_size=window,
        kv_token_id_vs_position_offset=draw(st.one_of(st.integers(-3, 3), int64s())),
    )
    if draw(st.integers(0, 4)) == 0:  # a write-only plan
        kwargs["verify"] = False
    if use_lut:
        lut_len = max(0, n_slots - draw(st.integers(0, 2)))
        kwargs["full_to_swa_index_mapping"] = torch.randint(-1, 1000, (lut_len,), generator=g)
    if use_pool:
        kwargs["req_to_verify_expected_tokens"] = torch.randint(
            0, 1000, (rows - draw(st.integers(0, 1)), pool_cols), generator=g
        ).to(I32)
        kwargs["req_to_verify_expected_tokens_valid_lens"] = torch.tensor(V, dtype=I64)
    # The exact total (Python integers): capacities near it, when it is small, so that
    # exact fits and overflows by one both occur.
    total = sum(
        (min(p, window) if window > 0 else p) if r != 0 and p > 0 else 0 for r, p in zip(rp, P)
    )
    near = [total - 1, total, total + 1] if total <= 600 else []
    verify_capacity = max(1, draw(st.one_of(st.sampled_from(near or [1]), st.integers(1, 600))))
    write_capacity = max(1, bs + draw(st.integers(0, 3)))
    if write_capacity % 32 in (0, 31):  # keep an alignment gap (a sentinel) after the offsets
        write_capacity += 2
    caps = dict(write_req_capacity=write_capacity, verify_capacity=verify_capacity)
    return {"kwargs": kwargs, "caps": caps, "bs": bs}


def on_device(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_reference(case) -> None:
    buffers = PlanBuffers.allocate(device="cpu", **case["caps"])
    poison_arena(buffers)
    expected = loop_plan(**case["caps"], **case["kwargs"], pad_bad=True)
    if expected["data_flags"] != PlanStatus.OK:
        before = arena_snapshot(buffers)
        with pytest.raises(ValueError, match=r"kv-canary: .*(data outside the tables|negative)"):
            plan_reference(buffers, **case["kwargs"])
        assert_arena_unchanged(buffers, before)
        return
    plan_reference(buffers, **case["kwargs"])
    assert_matches_oracle(buffers, case["bs"], expected)
    assert_in_bounds(buffers, case["bs"])


def check_kernels(case) -> None:
    kwargs = on_device(case["kwargs"])
    out = PlanBuffers.allocate(device=DEVICE, **case["caps"])
    poison_arena(out)
    launch_plan(out, **kwargs)  # finishing is part of the property (no unbounded loop)
    expected = loop_plan(**case["caps"], **case["kwargs"], pad_bad=True)
    assert_matches_oracle(out, case["bs"], expected)
    assert out.take_status() == expected["flags"]
    assert_in_bounds(out, case["bs"])
    if expected["data_flags"] == PlanStatus.OK:  # the reference accepts it: the paths agree
        ref = PlanBuffers.allocate(device=DEVICE, **case["caps"])
        poison_arena(ref)
        plan_reference(ref, **kwargs)
        assert_buffers_equal(out, ref, case["bs"])


@settings(max_examples=250, **SETTINGS)
@given(hostile())
def test_reference_on_any_int64(case):
    check_reference(case)


@settings(max_examples=25, **SETTINGS)
@given(hostile(large=True))
def test_reference_on_any_int64_at_three_launch_sizes(case):
    check_reference(case)


@settings(max_examples=60, **SETTINGS)
@given(hostile())
def test_kernels_on_any_int64_one_launch_path(case):
    check_kernels(case)


@settings(max_examples=12, **SETTINGS)
@given(hostile(large=True))
@pytest.mark.parametrize("path", sorted(LARGE_PATHS))
def test_kernels_on_any_int64_large_paths(path, case):
    with launch_config(**LARGE_PATHS[path]):
        check_kernels(case)


# --- the examples, by hand ---------------------------------------------------
def table(rows=4, cols=8):
    return (torch.arange(rows * cols, dtype=I32) + 1).reshape(rows, cols)


def run_both(plan, caps, pad_rows=0, **kwargs):
    """Plan on ``plan``'s path (the kernels at both sizes with ``pad_rows``) and return
    the buffers, after checking them against the oracle and the sentinels."""
    if pad_rows:
        for name in ("req_pool_indices", "prefix_lens", "extend_seq_lens"):
            kwargs[name] = torch.cat([torch.zeros(pad_rows, dtype=I64), kwargs[name]])
        caps = dict(caps, write_req_capacity=caps["write_req_capacity"] + pad_rows)
    bs = kwargs["req_pool_indices"].shape[0]
    buffers = PlanBuffers.allocate(device=DEVICE, **caps)
    poison_arena(buffers)
    kwargs = on_device(kwargs)
    plan(buffers, **kwargs)
    expected = loop_plan(**caps, **kwargs, pad_bad=True)
    assert_matches_oracle(buffers, bs, expected)
    assert_in_bounds(buffers, bs)
    return buffers, bs


PATHS = pytest.mark.parametrize("pad_rows", [0, SCAN_BLOCK], ids=["small", "large"])


@PATHS
def test_prefix_sums_past_int64_overflow_instead_of_wrapping(plan, pad_rows, large_path):
    """Four rows of 2**62 entries sum to 2**64, which wrapped to 0 (verify_enable = 1
    with a garbage count); three of 2**62 - 1 plus 5 wrapped to a plausible 2."""
    caps = dict(write_req_capacity=4, verify_capacity=64)
    for prefixes in ([2**62] * 4, [2**62 - 1] * 3 + [5], [INT64_MAX, INT64_MAX, 3]):
        n = len(prefixes)
        kwargs = dict(
            req_pool_indices=torch.ones(n, dtype=I64),
            prefix_lens=torch.tensor(prefixes, dtype=I64),
            extend_seq_lens=torch.ones(n, dtype=I64),
            req_to_token=table(),
        )
        if plan is plan_reference:  # active prefixes past the width: the reference refuses
            with pytest.raises(ValueError, match="prefix_lens"):
                plan(PlanBuffers.allocate(device=DEVICE, **caps), **on_device(kwargs))
            continue
        buffers, _ = run_both(plan, caps, pad_rows, **kwargs)
        assert (int(buffers.verify_enable), int(buffers.verify_num_valid)) == (0, 64)
        assert buffers.take_status() == (
            PlanStatus.PREFIX_LEN_OUT_OF_RANGE | PlanStatus.VERIFY_OVERFLOW
        )


@PATHS
@pytest.mark.parametrize("busy", [False, True], ids=["padding", "busy"])
def test_windows_and_negative_prefixes_do_not_wrap(plan, pad_rows, large_path, busy):
    """P - W wrapped for very negative P (a window start past the table, read without a
    status bit) and for W = 2**63 - 1; a row with P < 0 has no entry whatever W is: as a
    padding row, or as a busy row (NEGATIVE_LENGTH: planned as padding, flagged by the
    kernels, refused by the reference)."""
    rp = [1, 2, 3, 1] if busy else [0, 0, 0, 1]
    for window in (1, 10, 2**31, 2**62, INT64_MAX):
        kwargs = dict(
            req_pool_indices=torch.tensor(rp, dtype=I64),
            prefix_lens=torch.tensor([INT64_MIN, INT64_MIN + 5, -1, 3], dtype=I64),
            extend_seq_lens=torch.tensor([1, 1, 1, 1], dtype=I64),
            req_to_token=table(),
            swa_window_size=window,
            full_to_swa_index_mapping=torch.arange(100, 140, dtype=I64),
        )
        if busy and plan is plan_reference:
            with pytest.raises(ValueError, match=r"prefix_lens\[0\] = -9223372036854775808 must"):
                plan(
                    PlanBuffers.allocate(device=DEVICE, write_req_capacity=4, verify_capacity=8),
                    **on_device(kwargs),
                )
            continue
        buffers, bs = run_both(
            plan, dict(write_req_capacity=4, verify_capacity=8), pad_rows, **kwargs
        )
        expected = min(3, window)
        assert (int(buffers.verify_enable), int(buffers.verify_num_valid)) == (1, expected)
        assert buffers.verify_expected_positions[:expected].tolist() == list(range(3 - expected, 3))
        # row 3 (rp 1, P 3): the seed is LUT[req_to_token[1, 2]] = LUT[8 + 2 + 1]
        assert buffers.write_seed_slot_indices[bs - 4 : bs].tolist() == [-1, -1, -1, 111]
        # the negative rows write nothing either (a busy one would have written 1 token)
        assert buffers.write_offsets[bs - 4 : bs + 1].tolist() == [0, 0, 0, 0, 1]
        status = PlanStatus.NEGATIVE_LENGTH if busy else PlanStatus.OK
        assert buffers.take_status() == status


@PATHS
def test_huge_extends_clamp_the_write_counts(plan, pad_rows, large_path):
    """Write counts are min(max(0, E), 2**32): the offsets cannot wrap into a plausible
    plan (2**62 * 4 + 5 wrapped to 5)."""
    E = [2**62, 2**62, 2**62, 2**62, 5, INT64_MIN, 7]
    n = len(E)
    kwargs = dict(
        # the INT64_MIN row is padding: on a busy row it is NEGATIVE_LENGTH (tested above)
        req_pool_indices=torch.tensor([1, 1, 1, 1, 1, 0, 1], dtype=I64),
        prefix_lens=torch.zeros(n, dtype=I64),
        extend_seq_lens=torch.tensor(E, dtype=I64),
        req_to_token=table(),
    )
    buffers, bs = run_both(
        plan, dict(write_req_capacity=n + 1, verify_capacity=4), pad_rows, **kwargs
    )
    counts = [min(max(0, e), MAX_ROW_WRITES) for e in E]
    sums = [sum(counts[:i]) for i in range(n + 1)]
    assert buffers.write_offsets[bs - n : bs + 1].tolist() == sums
    assert sums[-1] == 4 * 2**32 + 12


@PATHS
def test_token_offsets_at_the_int64_edges(plan, pad_rows, large_path):
    """pos + offset is saturated, never wrapped: an offset of 2**63 - 1 or -2**63 checks
    no token (on the kernels, also at positions near 2**63 from a prefix past the width)."""
    pool = torch.arange(40, dtype=I32).reshape(4, 10)
    cases = [
        (INT64_MAX, [-1, -1, -1]),
        (INT64_MAX - 1, [-1, -1, -1]),
        (INT64_MIN, [-1, -1, -1]),
        (2, [12, 13, 14]),
        (-1, [-1, 10, 11]),
    ]
    for offset, tokens in cases:
        kwargs = dict(
            req_pool_indices=torch.tensor([1], dtype=I64),
            prefix_lens=torch.tensor([3], dtype=I64),
            extend_seq_lens=torch.tensor([0], dtype=I64),
            req_to_token=table(4, 10),
            req_to_verify_expected_tokens=pool,
            req_to_verify_expected_tokens_valid_lens=torch.tensor([10], dtype=I64),
            kv_token_id_vs_position_offset=offset,
        )
        if pad_rows:
            kwargs["req_to_verify_expected_tokens_valid_lens"] = torch.cat(
                [
                    torch.zeros(pad_rows, dtype=I64),
                    kwargs["req_to_verify_expected_tokens_valid_lens"],
                ]
            )
        buffers, _ = run_both(
            plan, dict(write_req_capacity=1, verify_capacity=4), pad_rows, **kwargs
        )
        assert buffers.verify_expected_tokens[:3].tolist() == tokens
    if plan is plan_reference:
        return
    # positions near 2**63 (a prefix past the width, window 3): slots 0, tokens unchecked
    for offset in (1, 2, INT64_MAX, INT64_MIN):
        kwargs = dict(
            req_pool_indices=torch.tensor([1], dtype=I64),
            prefix_lens=torch.tensor([INT64_MAX], dtype=I64),
            extend_seq_lens=torch.tensor([1], dtype=I64),
            req_to_token=table(4, 10),
            swa_window_size=3,
            full_to_swa_index_mapping=torch.arange(100, 140, dtype=I64),
            req_to_verify_expected_tokens=pool,
            req_to_verify_expected_tokens_valid_lens=torch.tensor([INT64_MAX], dtype=I64),
            kv_token_id_vs_position_offset=offset,
        )
        if pad_rows:
            kwargs["req_to_verify_expected_tokens_valid_lens"] = torch.cat(
                [
                    torch.zeros(pad_rows, dtype=I64),
                    kwargs["req_to_verify_expected_tokens_valid_lens"],
                ]
            )
        buffers, _ = run_both(
            plan, dict(write_req_capacity=1, verify_capacity=4), pad_rows, **kwargs
        )
        assert buffers.verify_expected_positions[:3].tolist() == [
            INT64_MAX - 3 + i for i in range(3)
        ]
        assert buffers.verify_slot_indices[:3].tolist() == [0, 0, 0]
        assert buffers.verify_expected_tokens[:3].tolist() == [-1, -1, -1]
        assert buffers.take_status() == (
            PlanStatus.PREFIX_LEN_OUT_OF_RANGE | PlanStatus.VALID_LEN_OUT_OF_RANGE
        )


@pytest.mark.parametrize(
    "name, value, exc, match",
    [
        (
            "swa_window_size",
            2**63,
            ValueError,
            r"swa_window_size must be in \[0, 9223372036854775807\], got 9223372036854775808",
        ),
        ("swa_window_size", 2**64 - 1, ValueError, "swa_window_size must be in"),
        ("swa_window_size", -(2**63) - 1, ValueError, "swa_window_size must be in"),
        ("swa_window_size", True, TypeError, "swa_window_size must be an int, got bool"),
        ("swa_window_size", 3.0, TypeError, "swa_window_size must be an int, got float"),
        (
            "kv_token_id_vs_position_offset",
            2**63,
            ValueError,
            "kv_token_id_vs_position_offset must be in",
        ),
        (
            "kv_token_id_vs_position_offset",
            2**64 - 1,
            ValueError,
            "kv_token_id_vs_position_offset must be in",
        ),
        (
            "kv_token_id_vs_position_offset",
            -(2**63) - 1,
            ValueError,
            "kv_token_id_vs_position_offset must be in",
        ),
        (
            "kv_token_id_vs_position_offset",
            "1",
            TypeError,
            "kv_token_id_vs_position_offset must be an int, got str",
        ),
    ],
)
def test_integer_arguments_outside_int64_raise_before_writing(plan, name, value, exc, match):
    """2**63 reached Triton as uint64 (planning 0 entries where the reference planned 8),
    2**64 - 1 silently acted as -1, and values past the range raised raw errors."""
    buffers = PlanBuffers.allocate(write_req_capacity=2, verify_capacity=16, device=DEVICE)
    poison_arena(buffers)
    before = arena_snapshot(buffers)
    kwargs = on_device(
        dict(
            req_pool_indices=torch.tensor([1, 2], dtype=I64),
            prefix_lens=torch.tensor([4, 4], dtype=I64),
            extend_seq_lens=torch.tensor([1, 1], dtype=I64),
            req_to_token=table(),
            full_to_swa_index_mapping=torch.arange(100, 140, dtype=I64),
        )
    )
    kwargs[name] = value
    with pytest.raises(exc, match="kv-canary: " + match):
        plan(buffers, **kwargs)
    assert_arena_unchanged(buffers, before)


def test_numpy_integers_are_accepted_as_integer_arguments(plan):
    np = pytest.importorskip("numpy")
    buffers = PlanBuffers.allocate(write_req_capacity=1, verify_capacity=16, device=DEVICE)
    poison_arena(buffers)
    plan(
        buffers,
        **on_device(
            dict(
                req_pool_indices=torch.tensor([1], dtype=I64),
                prefix_lens=torch.tensor([8], dtype=I64),
                extend_seq_lens=torch.tensor([1], dtype=I64),
                req_to_token=table(),
                swa_window_size=np.int64(2**62),
                full_to_swa_index_mapping=torch.arange(40, dtype=I64),
                kv_token_id_vs_position_offset=np.int32(-1),
            )
        ),
    )
    assert int(buffers.verify_num_valid) == 8

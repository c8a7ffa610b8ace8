"""Host-side errors of the write and verify stages, on both paths (``canary`` fixture):
each raises before anything is written, with a message that starts with ``kv-canary:``
and names the argument; the store and the plan buffers are byte-identical after. Also
RealKV's own construction errors, and a RealKV whose source changed after construction."""

import types

import pytest
import torch

from kv_canary_buffers import CanaryStore, PlanBuffers, RealKV, RealKVMode
from kv_canary_buffers.devices import normalize_device
from tests.helpers.canary import (
    DEVICE,
    assert_plan_equal,
    assert_store_equal,
    i64,
    make_source,
    new_plan,
    new_store,
    set_verify_plan,
    set_write_plan,
    snapshot_plan,
    snapshot_store,
)

I32 = torch.int32
DEV = str(normalize_device(DEVICE))  # as messages spell it ("cuda:0", "cpu")
TENSOR_ARGS = (
    "input_ids",
    "positions",
    "out_cache_loc",
    "expected_input_ids",
    "expected_positions",
)


class StoreSubclass(CanaryStore):
    pass


class PlanSubclass(PlanBuffers):
    pass


class RealKVSubclass(RealKV):
    pass


def lookalike(obj, names):
    """An object with the same attributes as ``obj`` (and its check method)."""
    fake = types.SimpleNamespace(**{n: getattr(obj, n) for n in names})
    fake.check = lambda: None
    return fake


STORE_NAMES = (
    "arena",
    "generation",
    "records",
    "violations",
    "violation_count",
    "kernel_runs",
    "slots_processed",
    "chain_position_check",
    "status",
    "num_slots",
    "violation_capacity",
    "device",
)
PLAN_NAMES = (
    "write_req_capacity",
    "verify_capacity",
    "device",
    "write_offsets",
    "write_seed_slot_indices",
    "write_num_valid_reqs",
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
    "verify_num_valid",
    "verify_enable",
    "status",
)


@pytest.fixture
def setup():
    """A store, a plan (write and verify parts filled) and a valid real-KV, whose calls
    would all write records or append rows."""
    g = torch.Generator().manual_seed(0)
    store = new_store(num_slots=16, violation_capacity=4)
    plan = new_plan()
    set_write_plan(plan, [0, 2], [-1])
    set_verify_plan(plan, [3, 4], [-1, 3], [7, 7])
    kv = RealKV(
        mode=RealKVMode.ALL,
        sources=make_source(g, 16, 32, device=DEVICE),
        page_size=1,
        bytes_per_token=32,
    )
    return store, plan, kv


def write_kwargs(kv):
    return dict(
        input_ids=i64([1, 2]),
        positions=i64([0, 1]),
        out_cache_loc=i64([3, 4]),
        launch_tag=5,
        expected_input_ids=i64([1, 2]),
        expected_positions=i64([0, 1]),
        real_kv=kv,
    )


def run_refused(call, store, plan, error, pattern):
    """``call()`` raises ``error`` matching ``pattern`` (after ``^kv-canary: ``) and
    leaves every byte of the store and the plan as it was."""
    store_before = snapshot_store(store)
    plan_before = snapshot_plan(plan)
    with pytest.raises(error, match="^kv-canary: " + pattern):
        call()
    assert_store_equal(store, store_before)
    assert_plan_equal(plan, plan_before)


# --- tensor arguments of the write -----------------------------------------------------------
def _bad_tensor(kind, name, t):
    n = t.shape[0]
    if kind == "dtype":
        return t.to(I32), ValueError, f"{name} must have dtype torch.int64, got torch.int32"
    if kind == "rank":
        return t[None, :], ValueError, rf"{name} must be 1-D \[n\], got 2-D shape \(1, {n}\)"
    if kind == "meta":
        return t.to("meta"), ValueError, f"{name} must be on the buffers' device {DEV}, got meta"
    if kind == "strided":
        wide = torch.stack([t, t], 1).reshape(-1)[::2]
        assert not wide.is_contiguous() and torch.equal(wide, t)
        return wide, ValueError, rf"{name} must be contiguous, got strides \(2,\)"
    if kind == "list":
        return t.tolist(), TypeError, f"{name} must be a torch.Tensor, got list"
    if kind == "length":
        longer = torch.cat([t, t[:1]])
        if name == "out_cache_loc":  # n comes from it: the others then have the wrong length
            return (
                longer,
                ValueError,
                r"input_ids must have length n = len\(out_cache_loc\) = 3, got 2",
            )
        return longer, ValueError, rf"{name} must have length n = len\(out_cache_loc\) = 2, got 3"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["dtype", "rank", "meta", "strided", "list", "length"])
@pytest.mark.parametrize("name", TENSOR_ARGS)
def test_write_tensor_argument_errors(canary, setup, name, kind):
    store, plan, kv = setup
    kwargs = write_kwargs(kv)
    kwargs[name], error, pattern = _bad_tensor(kind, name, kwargs[name])
    run_refused(lambda: canary.write(store, plan, **kwargs), store, plan, error, pattern)


@pytest.mark.parametrize("given", ["expected_input_ids", "expected_positions"])
def test_expected_arrays_alone_are_refused(canary, setup, given):
    store, plan, kv = setup
    kwargs = write_kwargs(kv)
    other = ({"expected_input_ids", "expected_positions"} - {given}).pop()
    kwargs[other] = None
    run_refused(
        lambda: canary.write(store, plan, **kwargs),
        store,
        plan,
        ValueError,
        f"expected_input_ids and expected_positions must be given together, got only {given}",
    )


ALIASES = {
    # name: (argument, a tensor inside the store's arena, n)
    "count as out_cache_loc": ("out_cache_loc", lambda s: s.violation_count, 1),
    "records as input_ids": ("input_ids", lambda s: s.records.view(-1)[4:6], 2),
    "ring as positions": ("positions", lambda s: s.violations.view(-1)[:2], 2),
    "runs as expected_input_ids": ("expected_input_ids", lambda s: s.kernel_runs, 1),
    "processed as expected_positions": ("expected_positions", lambda s: s.slots_processed, 1),
}


@pytest.mark.parametrize("case", sorted(ALIASES))
def test_inputs_aliasing_the_store_are_refused(canary, setup, case):
    store, plan, _kv = setup
    name, alias, n = ALIASES[case]
    set_write_plan(plan, [0, n], [-1])
    kwargs = dict(
        input_ids=i64([1] * n),
        positions=i64([0] * n),
        out_cache_loc=i64([3] * n),
        expected_input_ids=i64([1] * n),
        expected_positions=i64([0] * n),
    )
    kwargs[name] = alias(store)
    assert kwargs[name].is_contiguous() and kwargs[name].shape == (n,)
    run_refused(
        lambda: canary.write(store, plan, **kwargs),
        store,
        plan,
        ValueError,
        f"{name} must not share memory with the CanaryStore it writes",
    )


def test_a_record_column_is_refused_as_not_contiguous(canary, setup):
    store, plan, kv = setup
    kwargs = write_kwargs(kv)
    kwargs["out_cache_loc"] = store.records[:2, 0]
    run_refused(
        lambda: canary.write(store, plan, **kwargs),
        store,
        plan,
        ValueError,
        r"out_cache_loc must be contiguous, got strides \(4,\)",
    )


# --- scalar arguments --------------------------------------------------------------------------
TAGS = {
    2**63: (
        ValueError,
        r"launch_tag must be in \[-9223372036854775808, 9223372036854775807\], "
        r"got 9223372036854775808",
    ),
    -(2**63) - 1: (ValueError, r"launch_tag must be in \[.*\], got -9223372036854775809"),
    1.5: (TypeError, "launch_tag must be an int, got float 1.5"),
    True: (TypeError, "launch_tag must be an int, got bool True"),
    "3": (TypeError, "launch_tag must be an int, got str '3'"),
    None: (TypeError, "launch_tag must be an int, got NoneType None"),
}


@pytest.mark.parametrize("stage", ["write", "verify"])
@pytest.mark.parametrize("tag", list(TAGS), ids=str)
def test_launch_tag_outside_int64_or_not_an_int(canary, setup, stage, tag):
    store, plan, kv = setup
    error, pattern = TAGS[tag]
    if stage == "write":
        kwargs = {**write_kwargs(kv), "launch_tag": tag}
        call = lambda: canary.write(store, plan, **kwargs)  # noqa: E731
    else:
        call = lambda: canary.verify(store, plan, launch_tag=tag, real_kv=kv)  # noqa: E731
    run_refused(call, store, plan, error, pattern)


def test_extreme_launch_tags_are_accepted(canary, setup):
    store, plan, _kv = setup
    for tag in (2**63 - 1, -(2**63)):
        canary.verify(store, plan, launch_tag=tag)
    tags = {r[0] for r in store.violations[: int(store.violation_count)].tolist()}
    assert tags == {2**63 - 1, -(2**63)}


@pytest.mark.parametrize("value", [1, 0, None, "yes", torch.tensor(True)], ids=repr)
def test_check_expected_tokens_must_be_a_bool(canary, setup, value):
    store, plan, _kv = setup
    run_refused(
        lambda: canary.verify(store, plan, check_expected_tokens=value),
        store,
        plan,
        TypeError,
        "check_expected_tokens must be a bool, got ",
    )


# --- the store and the plan buffers ------------------------------------------------------------
def _wrong_stores(store, plan):
    sub = StoreSubclass.allocate(num_slots=16, violation_capacity=4, device=DEVICE)
    return {
        "None": (None, "NoneType"),
        "subclass": (sub, "StoreSubclass"),
        "lookalike": (lookalike(store, STORE_NAMES), "SimpleNamespace"),
        "plan buffers": (plan, "PlanBuffers"),
    }


def _wrong_plans(store, plan):
    sub = PlanSubclass.allocate(write_req_capacity=4, verify_capacity=16, device=DEVICE)
    return {
        "None": (None, "NoneType"),
        "subclass": (sub, "PlanSubclass"),
        "lookalike": (lookalike(plan, PLAN_NAMES), "SimpleNamespace"),
        "store": (store, "CanaryStore"),
    }


@pytest.mark.parametrize("stage", ["write", "verify"])
@pytest.mark.parametrize("case", ["None", "subclass", "lookalike", "plan buffers"])
def test_store_of_the_wrong_type(canary, setup, stage, case):
    store, plan, kv = setup
    wrong, type_name = _wrong_stores(store, plan)[case]
    if stage == "write":
        call = lambda: canary.write(wrong, plan, **write_kwargs(kv))  # noqa: E731
    else:
        call = lambda: canary.verify(wrong, plan)  # noqa: E731
    pattern = rf"store must be a kv_canary_buffers.CanaryStore .*got {type_name}$"
    run_refused(call, store, plan, TypeError, pattern)


@pytest.mark.parametrize("stage", ["write", "verify"])
@pytest.mark.parametrize("case", ["None", "subclass", "lookalike", "store"])
def test_plan_buffers_of_the_wrong_type(canary, setup, stage, case):
    store, plan, kv = setup
    wrong, type_name = _wrong_plans(store, plan)[case]
    if stage == "write":
        call = lambda: canary.write(store, wrong, **write_kwargs(kv))  # noqa: E731
    else:
        call = lambda: canary.verify(store, wrong)  # noqa: E731
    pattern = rf"plan_buffers must be a kv_canary_buffers.PlanBuffers .*got {type_name}$"
    run_refused(call, store, plan, TypeError, pattern)


@pytest.mark.gpu
@pytest.mark.parametrize("stage", ["write", "verify"])
def test_plan_buffers_on_another_device(canary, setup, stage):
    """A store on the CPU with plan buffers on the GPU (a machine has no second device
    without CUDA: a meta store, which this test once used, is refused at allocation)."""
    _store, plan, _kv = setup
    other = CanaryStore.allocate(num_slots=16, violation_capacity=4, device="cpu")
    if stage == "write":
        kwargs = {
            k: v.to("cpu")
            for k, v in write_kwargs(None).items()
            if k not in ("launch_tag", "real_kv")
        }
        call = lambda: canary.write(other, plan, **kwargs)  # noqa: E731
    else:
        call = lambda: canary.verify(other, plan)  # noqa: E731
    run_refused(
        call,
        other,
        plan,
        ValueError,
        f"plan_buffers must be on the store's device cpu, got {plan.device}",
    )


@pytest.mark.parametrize("stage", ["write", "verify"])
def test_tampered_plan_buffers_are_refused(canary, setup, stage):
    # The plan's private views reached past its public fields: refused wherever they are
    # used as tensors (the references; the kernels' launches under the interpreter).
    store, plan, kv = setup
    if stage == "write":
        object.__setattr__(plan, "_write_offsets", plan.write_offsets[:-1].clone())
        call = lambda: canary.write(store, plan, **write_kwargs(kv))  # noqa: E731
        match = "write_offsets_len must equal write_req_capacity \\+ 1"
    else:
        object.__setattr__(plan, "_verify_slot_indices", plan.verify_slot_indices.clone())
        call = lambda: canary.verify(store, plan)  # noqa: E731
        match = "PlanBuffers.verify_slot_indices is not the memory it was built with"
    run_refused(call, store, plan, ValueError, match)


@pytest.mark.parametrize("stage", ["write", "verify"])
def test_a_plan_arena_resized_under_the_buffers_is_refused_by_every_stage(canary, setup, stage):
    store, plan, kv = setup
    plan.verify_enable.untyped_storage().resize_(0)
    if stage == "write":
        call = lambda: canary.write(store, plan, **write_kwargs(kv))  # noqa: E731
    else:
        call = lambda: canary.verify(store, plan)  # noqa: E731
    with pytest.raises(ValueError, match="kv-canary: the PlanBuffers arena's storage"):
        call()
    assert int(store.kernel_runs) == 0


# --- real-KV at the launch ---------------------------------------------------------------------
def _call(canary, stage, store, plan, real_kv):
    if stage == "write":
        return lambda: canary.write(store, plan, **write_kwargs(real_kv))
    return lambda: canary.verify(store, plan, real_kv=real_kv)


@pytest.mark.parametrize("stage", ["write", "verify"])
@pytest.mark.parametrize("case", ["tensor", "subclass", "lookalike"])
def test_real_kv_of_the_wrong_type(canary, setup, stage, case):
    store, plan, kv = setup
    if case == "tensor":
        wrong, name = kv.sources[0], "Tensor"
    elif case == "subclass":
        wrong = RealKVSubclass(mode=kv.mode, sources=kv.sources, page_size=1, bytes_per_token=32)
        name = "RealKVSubclass"
    else:
        wrong = lookalike(
            kv,
            (
                "mode",
                "sources",
                "page_size",
                "bytes_per_token",
                "read_bytes",
                "hashed_bytes",
                "device",
            ),
        )
        name = "SimpleNamespace"
    run_refused(
        _call(canary, stage, store, plan, wrong),
        store,
        plan,
        TypeError,
        f"real_kv must be a kv_canary_buffers.RealKV or None, got {name}$",
    )


@pytest.mark.parametrize("stage", ["write", "verify"])
def test_real_kv_on_another_device(canary, setup, stage):
    store, plan, _kv = setup
    meta = torch.zeros(16, 32, dtype=torch.uint8, device="meta")
    kv = RealKV(mode=RealKVMode.PARTIAL, sources=meta, page_size=1, bytes_per_token=32)
    run_refused(
        _call(canary, stage, store, plan, kv),
        store,
        plan,
        ValueError,
        f"real_kv sources must be on the store's device {DEV}, got meta",
    )


@pytest.mark.parametrize("stage", ["write", "verify"])
def test_real_kv_source_aliasing_the_store(canary, setup, stage):
    store, plan, kv = setup
    alias = RealKV(
        mode=RealKVMode.ALL,
        sources=(kv.sources[0], store.records.view(16, 4)),
        page_size=1,
        bytes_per_token=32,
    )
    run_refused(
        _call(canary, stage, store, plan, alias),
        store,
        plan,
        ValueError,
        r"real_kv.sources\[1\] must not share memory with the CanaryStore",
    )


@pytest.mark.parametrize("mode", list(RealKVMode))
@pytest.mark.parametrize("stage", ["write", "verify"])
def test_real_kv_source_resized_after_construction(canary, setup, stage, mode):
    store, plan, _kv = setup
    g = torch.Generator().manual_seed(1)
    sources = [make_source(g, 16, 32, device=DEVICE) for _ in range(2)]
    kv = RealKV(mode=mode, sources=sources, page_size=1, bytes_per_token=32)
    sources[1].untyped_storage().resize_(0)
    run_refused(
        _call(canary, stage, store, plan, kv),
        store,
        plan,
        ValueError,
        r"RealKV.sources\[1\] changed since the RealKV was built",
    )


@pytest.mark.parametrize("stage", ["write", "verify"])
def test_real_kv_source_swapped_after_construction(canary, setup, stage):
    store, plan, kv = setup
    kv.sources[0].set_(torch.zeros(16, 32, dtype=torch.uint8, device=DEVICE))
    run_refused(
        _call(canary, stage, store, plan, kv),
        store,
        plan,
        ValueError,
        r"RealKV.sources\[0\] changed since the RealKV was built",
    )


@pytest.mark.parametrize("stage", ["write", "verify"])
def test_real_kv_source_dtype_swapped_after_construction(canary, setup, stage):
    """Same address, shape, strides and storage, another dtype (a wider element, which
    moves every row's bytes): refused (the storage has room for it, so only the dtype
    tells)."""
    store, plan, _kv = setup
    src = torch.zeros(32, 32, dtype=torch.uint8, device=DEVICE)[:16]
    kv = RealKV(mode=RealKVMode.PARTIAL, sources=(src,), page_size=1, bytes_per_token=32)
    wide = torch.empty(0, dtype=torch.int16, device=DEVICE)
    wide.set_(src.untyped_storage(), src.storage_offset(), src.shape, src.stride())
    src.data = wide
    run_refused(
        _call(canary, stage, store, plan, kv),
        store,
        plan,
        ValueError,
        r"RealKV.sources\[0\] changed since the RealKV was built",
    )


# --- RealKV construction -----------------------------------------------------------------------
def _src(rows=8, cols=64, dtype=torch.uint8, device=DEVICE):
    return torch.zeros(rows, cols, dtype=dtype, device=device)


def _misaligned():
    return _src(8, 96)[:, 8:72]


REALKV_ERRORS = {
    "five sources": (
        dict(sources=[_src() for _ in range(5)]),
        ValueError,
        "RealKV.sources must hold at most 4 tensors, got 5",
    ),
    "page_size 0": (dict(page_size=0), ValueError, "RealKV.page_size must be >= 1, got 0"),
    "page_size float": (dict(page_size=1.0), TypeError, "RealKV.page_size must be an int"),
    "page_size bool": (dict(page_size=True), TypeError, "RealKV.page_size must be an int"),
    "page_size tensor": (
        dict(page_size=torch.tensor(2)),
        TypeError,
        "RealKV.page_size must be an int, got Tensor .*a tensor would sync",
    ),
    "bytes_per_token 24": (
        dict(bytes_per_token=24),
        ValueError,
        "RealKV.bytes_per_token must be a positive multiple of 16, got 24",
    ),
    "bytes_per_token 0": (dict(bytes_per_token=0), ValueError, "RealKV.bytes_per_token must be"),
    "read_bytes over": (
        dict(read_bytes=48),
        ValueError,
        "RealKV.read_bytes must be <= bytes_per_token = 32, got 48",
    ),
    "read_bytes 8": (
        dict(read_bytes=8),
        ValueError,
        "RealKV.read_bytes must be a positive multiple",
    ),
    "1-D source": (dict(sources=_src(1, 64)[0]), ValueError, r"RealKV.sources\[0\] must be 2-D"),
    "3-D source": (
        dict(sources=_src(8, 64).view(8, 4, 16)),
        ValueError,
        r"RealKV.sources\[0\] must be 2-D",
    ),
    "misaligned view": (
        dict(sources=_misaligned()),
        ValueError,
        r"RealKV.sources\[0\] must start 16-byte aligned .* data_ptr % 16 = 8",
    ),
    "row stride not a multiple of 16": (
        dict(sources=_src(8, 72)),
        ValueError,
        r"RealKV.sources\[0\] must start 16-byte aligned .*a row stride of 72 bytes$",
    ),
    "strided rows": (
        dict(sources=_src(64, 8).t()),
        ValueError,
        r"RealKV.sources\[0\] must have contiguous rows",
    ),
    "rows too short": (
        dict(sources=_src(8, 48), page_size=2, bytes_per_token=32),
        ValueError,
        r"RealKV.sources\[0\] rows must hold page_size \* bytes_per_token = 64 bytes, got 48$",
    ),
    "two devices": (
        dict(sources=[_src(), _src(device="meta")]),
        ValueError,
        rf"RealKV.sources\[1\] must be on {DEV} like sources\[0\], got meta",
    ),
    "not a tuple": (dict(sources=iter([_src()])), TypeError, "RealKV.sources must be a tuple"),
    "not a tensor": (
        dict(sources=[_src(), "kv"]),
        TypeError,
        r"RealKV.sources\[1\] must be a torch.Tensor, got str",
    ),
}


@pytest.mark.parametrize("case", sorted(REALKV_ERRORS))
def test_real_kv_construction_errors(case):
    change, error, pattern = REALKV_ERRORS[case]
    kwargs = dict(mode=RealKVMode.ALL, sources=_src(), page_size=2, bytes_per_token=32)
    kwargs.update(change)
    with pytest.raises(error, match="^kv-canary: " + pattern):
        RealKV(**kwargs)


def test_real_kv_rows_too_short_names_the_sizes():
    with pytest.raises(
        ValueError,
        match=(
            r"^kv-canary: RealKV.sources\[0\] rows must hold page_size \* bytes_per_token = 64 "
            r"bytes, got 48$"
        ),
    ):
        RealKV(
            mode=RealKVMode.ALL, sources=_src(8, 24, torch.float16), page_size=2, bytes_per_token=32
        )


def test_real_kv_accepts_the_documented_shapes():
    src = _src(8, 96)[:, 16:80]  # a view into a wider buffer
    kv = RealKV(
        mode=1,
        sources=[src, _src(9, 32, torch.bfloat16)],
        page_size=2,
        bytes_per_token=32,
        read_bytes=16,
    )
    assert kv.mode is RealKVMode.PARTIAL and kv.hashed_bytes == 16
    assert kv.source_rows() == (8, 9) and kv.read_bytes == 16
    assert RealKV(mode=2, sources=src, page_size=1, bytes_per_token=64).read_bytes == 64
    assert RealKV(mode=0, sources=src, page_size=1, bytes_per_token=64).hashed_bytes == 0
    assert RealKV(mode=2, sources=(), page_size=1, bytes_per_token=64).hashed_bytes == 0


@pytest.mark.parametrize(
    "mode, error",
    [
        (5, ValueError),
        (-1, ValueError),
        (None, TypeError),
        ("ALL", TypeError),
        (1.0, TypeError),
        (True, TypeError),
    ],
    ids=repr,
)
def test_real_kv_mode_must_be_a_mode(mode, error):
    with pytest.raises(error, match=r"^kv-canary: RealKV\.mode must be"):
        RealKV(mode=mode, sources=_src(), page_size=1, bytes_per_token=32)


def test_real_kv_mode_accepts_ints_and_members():
    import numpy as np

    for mode in (1, np.int64(1), RealKVMode.PARTIAL):
        kv = RealKV(mode=mode, sources=_src(), page_size=1, bytes_per_token=32)
        assert kv.mode is RealKVMode.PARTIAL

"""One rule for errors at every public entry point: a value of the wrong type raises
``TypeError``, a wrong value ``ValueError``; every message starts with ``kv-canary:`` and
names the argument. Sizes and integer arguments accept anything ``operator.index`` takes
(numpy integers, an object with ``__index__``), never a bool or a tensor. A device torch
cannot allocate on here (CUDA on a CPU-only torch, ``mps``, ``xpu``, a name torch does not
know) is a ``ValueError`` with a ``kv-canary:`` message, not torch's own
``AssertionError`` / ``NotImplementedError`` / ``RuntimeError``.

The walk: every entry point, every argument, a few wrong types and wrong values each, on
both paths where there are two (the torch reference and the Triton launcher)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from kv_canary_buffers import (
    CanaryStore,
    GraphInputs,
    PlanBuffers,
    RealKV,
    RealKVMode,
    ViolationReport,
    gather_violation_reports,
    plan_reference,
    plans_equal,
    verify_entries_needed,
    verify_reference,
    write_reference,
)
from kv_canary_kernels import launch_plan, launch_verify, launch_write

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CUDA = torch.cuda.is_available()
BIG = 2**31  # past every capacity (counters are int32)
I64_PAST = 2**63  # past int64


class Index:
    """Not an int, but ``operator.index`` takes it."""

    def __init__(self, value: int):
        self.value = value

    def __index__(self) -> int:
        return self.value


def i64(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=DEVICE)


def plan_buffers() -> PlanBuffers:
    return PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=DEVICE)


def store() -> CanaryStore:
    return CanaryStore.allocate(num_slots=64, violation_capacity=4, device=DEVICE)


def source(rows: int = 8, width: int = 32) -> torch.Tensor:
    return torch.zeros(rows, width, dtype=torch.uint8, device=DEVICE)


def plan_kwargs(**changes: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        req_pool_indices=i64(1),
        prefix_lens=i64(2),
        extend_seq_lens=i64(1),
        req_to_token=torch.arange(16, dtype=torch.int32, device=DEVICE).view(2, 8),
        full_to_swa_index_mapping=torch.arange(16, device=DEVICE),
    )
    kwargs.update(changes)
    return kwargs


def write_kwargs(**changes: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(input_ids=i64(5), positions=i64(0), out_cache_loc=i64(3))
    kwargs.update(changes)
    return kwargs


def real_kv(**changes: Any) -> RealKV:
    kwargs: dict[str, Any] = dict(
        mode=RealKVMode.PARTIAL, sources=source(), page_size=1, bytes_per_token=32
    )
    kwargs.update(changes)
    return RealKV(**kwargs)


# --- the walk ---------------------------------------------------------------------------
class Arg(NamedTuple):
    """One argument of one entry point: ``call(value)`` passes ``value`` as ``name``."""

    entry: str
    name: str
    call: Callable[[Any], object]
    wrong_types: tuple[Any, ...]
    wrong_values: tuple[Any, ...]
    integer: bool = False
    """An integer argument: numpy integers and ``__index__`` objects are accepted."""


INT_TYPES = (1.5, True, "4", torch.tensor(4), [4])
"""Wrong types for an integer argument (a float, a bool, a string, a tensor, a list)."""
DEVICE_TYPES = (1.5, None, True, ["cpu"])
DEVICE_VALUES = ("foo", "cuda:x", -1) + (() if CUDA else ("cuda", "cuda:0", 0))


def _plan_paths() -> list[tuple[str, Callable[..., None]]]:
    return [("plan_reference", plan_reference), ("launch_plan", launch_plan)]


def _write_paths() -> list[tuple[str, Callable[..., None]]]:
    return [("write_reference", write_reference), ("launch_write", launch_write)]


def _verify_paths() -> list[tuple[str, Callable[..., None]]]:
    return [("verify_reference", verify_reference), ("launch_verify", launch_verify)]


def _args() -> list[Arg]:
    args = []
    for cls, sizes, grow in (
        (PlanBuffers, ("write_req_capacity", "verify_capacity"), ("write_reqs", "verify_entries")),
        (CanaryStore, ("num_slots", "violation_capacity"), ("num_slots",)),
    ):
        make = plan_buffers if cls is PlanBuffers else store
        defaults = {sizes[0]: 4, sizes[1]: 16}
        for size in sizes:
            args += [
                Arg(
                    f"{cls.__name__}.allocate",
                    size,
                    lambda v, cls=cls, size=size, d=defaults: cls.allocate(
                        **dict(d, **{size: v}), device=DEVICE
                    ),
                    INT_TYPES + (None,),
                    (0, -1, BIG),
                    integer=True,
                ),
                Arg(
                    f"{cls.__name__}.allocation_bytes",
                    size,
                    lambda v, cls=cls, size=size, d=defaults: cls.allocation_bytes(
                        **dict(d, **{size: v})
                    ),
                    INT_TYPES + (None,),
                    (0, -1, BIG),
                    integer=True,
                ),
                Arg(
                    f"{cls.__name__}.resize",
                    size,
                    lambda v, make=make, size=size: make().resize(**{size: v}),
                    INT_TYPES,  # None keeps the size
                    (0, -1, BIG),
                    integer=True,
                ),
            ]
        for need in grow:
            args.append(
                Arg(
                    f"{cls.__name__}.ensure_capacity",
                    need,
                    lambda v, make=make, need=need: make().ensure_capacity(**{need: v}),
                    INT_TYPES + (None,),
                    (-1, BIG),
                    integer=True,
                )
            )
        args.append(
            Arg(
                f"{cls.__name__}.allocate",
                "device",
                lambda v, cls=cls, d=defaults: cls.allocate(**d, device=v),
                DEVICE_TYPES,
                DEVICE_VALUES,
            )
        )
    args += [
        Arg(
            "GraphInputs.allocate",
            "capacity",
            lambda v: GraphInputs.allocate(capacity=v, device=DEVICE),
            INT_TYPES + (None,),
            (0, -1, BIG),
            integer=True,
        ),
        Arg(
            "GraphInputs.allocate",
            "device",
            lambda v: GraphInputs.allocate(capacity=4, device=v),
            DEVICE_TYPES,
            DEVICE_VALUES,
        ),
        Arg(
            "GraphInputs.for_buffers",
            "buffers",
            GraphInputs.for_buffers,
            (None, store(), "buffers"),
            (),
        ),
        Arg(
            "GraphInputs.fill",
            "req_pool_indices",
            lambda v: GraphInputs.allocate(capacity=4, device=DEVICE).fill(
                req_pool_indices=v, prefix_lens=i64(1), extend_seq_lens=i64(1)
            ),
            ([1], None, np.array([1])),
            (i64(1).int(), i64(1, 2).view(1, 2), i64(1, 2, 3, 4, 5)),
        ),
        Arg(
            "GraphInputs.fill",
            "prefix_lens",
            lambda v: GraphInputs.allocate(capacity=4, device=DEVICE).fill(
                req_pool_indices=i64(1), prefix_lens=v, extend_seq_lens=i64(1)
            ),
            ([1], 1),
            (i64(1, 2), i64(1).float()),
        ),
        Arg(
            "GraphInputs.plan_kwargs",
            "with_valid_lens",
            lambda v: GraphInputs.allocate(capacity=4, device=DEVICE).plan_kwargs(
                with_valid_lens=v
            ),
            (1, "yes", None, np.bool_(True)),
            (),
        ),
        Arg(
            "RealKV",
            "mode",
            lambda v: real_kv(mode=v),
            ("PARTIAL", 1.0, True, None, torch.tensor(1)),
            (3, -1),
            integer=True,
        ),
        Arg(
            "RealKV",
            "sources",
            lambda v: real_kv(sources=v),
            ("kv", 5, None, (source(), "kv")),
            (source().view(-1), (source(),) * 5, source(width=16), source()[:, 1:]),
        ),
        Arg(
            "RealKV",
            "page_size",
            lambda v: real_kv(page_size=v),
            INT_TYPES + (None,),
            (0, -1, 2),
            integer=True,
        ),
        Arg(
            "RealKV",
            "bytes_per_token",
            lambda v: real_kv(bytes_per_token=v),
            INT_TYPES + (None,),
            (0, 17, 64),
            integer=True,
        ),
        Arg(
            "RealKV",
            "read_bytes",
            lambda v: real_kv(read_bytes=v),
            INT_TYPES,  # None: bytes_per_token
            (0, 8, 48),
            integer=True,
        ),
    ]
    for entry, plan in _plan_paths():
        args += [
            Arg(
                entry, "buffers", lambda v, plan=plan: plan(v, **plan_kwargs()), (None, store()), ()
            ),
            Arg(
                entry,
                "swa_window_size",
                lambda v, plan=plan: plan(plan_buffers(), **plan_kwargs(swa_window_size=v)),
                INT_TYPES + (None,),
                (-1, I64_PAST),
                integer=True,
            ),
            Arg(
                entry,
                "kv_token_id_vs_position_offset",
                lambda v, plan=plan: plan(
                    plan_buffers(), **plan_kwargs(kv_token_id_vs_position_offset=v)
                ),
                INT_TYPES + (None,),
                (I64_PAST, -I64_PAST - 1),
                integer=True,
            ),
            Arg(
                entry,
                "req_pool_indices",
                lambda v, plan=plan: plan(plan_buffers(), **plan_kwargs(req_pool_indices=v)),
                ([1], None, np.array([1])),
                (i64(1).int(), i64(1).view(1, 1), i64(1, 1, 1, 1, 1)),
            ),
            Arg(
                entry,
                "full_to_swa_index_mapping",
                lambda v, plan=plan: plan(
                    plan_buffers(), **plan_kwargs(swa_window_size=2, full_to_swa_index_mapping=v)
                ),
                ([0, 1], "lut"),
                (None, i64(0, 1).int()),
            ),
        ]
    for entry, write in _write_paths():
        args += [
            Arg(
                entry,
                "store",
                lambda v, w=write: w(v, plan_buffers(), **write_kwargs()),
                (None, plan_buffers()),
                (),
            ),
            Arg(
                entry,
                "plan_buffers",
                lambda v, w=write: w(store(), v, **write_kwargs()),
                (None, store()),
                (),
            ),
            Arg(
                entry,
                "launch_tag",
                lambda v, w=write: w(store(), plan_buffers(), launch_tag=v, **write_kwargs()),
                INT_TYPES + (None,),
                (I64_PAST,),
                integer=True,
            ),
            Arg(
                entry,
                "input_ids",
                lambda v, w=write: w(store(), plan_buffers(), **write_kwargs(input_ids=v)),
                ([5], None),
                (i64(5).int(), i64(5, 6)),
            ),
            Arg(
                entry,
                "real_kv",
                lambda v, w=write: w(store(), plan_buffers(), real_kv=v, **write_kwargs()),
                (source(), "kv", RealKVMode.PARTIAL),
                (),
            ),
        ]
    for entry, verify in _verify_paths():
        args += [
            Arg(
                entry, "store", lambda v, f=verify: f(v, plan_buffers()), (None, plan_buffers()), ()
            ),
            Arg(
                entry,
                "launch_tag",
                lambda v, f=verify: f(store(), plan_buffers(), launch_tag=v),
                INT_TYPES + (None,),
                (I64_PAST, -I64_PAST - 1),
                integer=True,
            ),
            Arg(
                entry,
                "check_expected_tokens",
                lambda v, f=verify: f(store(), plan_buffers(), check_expected_tokens=v),
                (1, None, "yes", np.bool_(True)),
                (),
            ),
            Arg(
                entry,
                "real_kv",
                lambda v, f=verify: f(store(), plan_buffers(), real_kv=v),
                (source(), "kv"),
                (),
            ),
        ]
    args += [
        Arg("plans_equal", "a", lambda v: plans_equal(v, plan_buffers(), 1), (None, store()), ()),
        Arg("plans_equal", "b", lambda v: plans_equal(plan_buffers(), v, 1), (None, store()), ()),
        Arg(
            "plans_equal",
            "bs",
            lambda v: plans_equal(plan_buffers(), plan_buffers(), v),
            INT_TYPES + (None,),
            (-1, 5),
            integer=True,
        ),
        Arg(
            "PlanBuffers.check_fields",
            "names",
            lambda v: plan_buffers().check_fields(v),
            (["status"], "status", None, ("status", 1)),
            (("nope",), ("status", "nope"), ()),
        ),
    ]
    report = ViolationReport(violations=(), appended=0, dropped=0, kernel_runs=0, slots_processed=0)
    args += [
        Arg(
            "gather_violation_reports",
            "report",
            gather_violation_reports,
            (None, store(), [report]),
            (),
        ),
        Arg(
            "gather_violation_reports",
            "dst",
            lambda v: gather_violation_reports(report, dst=v),
            (1.5, "0", True, torch.tensor(0)),
            (-1,),
        ),
        Arg(
            "verify_entries_needed",
            "prefix_lens",
            verify_entries_needed,
            (5, "12", None, [1.5], [True], {1: 2}),
            (
                torch.tensor([1.5]),
                torch.tensor([[1]]),
                np.array([1.5]),
                [I64_PAST],
                torch.tensor([1], device="meta"),
            ),
        ),
        Arg(
            "verify_entries_needed",
            "req_pool_indices",
            lambda v: verify_entries_needed([1, 2], req_pool_indices=v),
            (1, "12", [None, 1]),
            ([1], torch.tensor([1.0, 1.0]), np.ones((2, 1), dtype=np.int64)),
        ),
        Arg(
            "verify_entries_needed",
            "swa_window_size",
            lambda v: verify_entries_needed([1, 2], swa_window_size=v),
            INT_TYPES + (None,),
            (-1, I64_PAST),
            integer=True,
        ),
    ]
    return args


ARGS = _args()


def _cases(kind: str) -> list[Any]:
    out = []
    for arg in ARGS:
        values = arg.wrong_types if kind == "type" else arg.wrong_values
        for i, value in enumerate(values):
            out.append(pytest.param(arg, value, id=f"{arg.entry}-{arg.name}-{i}"))
    return out


def _check(arg: Arg, value: Any, expected: type[Exception]) -> None:
    with pytest.raises(Exception) as info:  # the exact type is asserted below
        arg.call(value)
    err = info.value
    assert type(err) is expected, f"{arg.entry}({arg.name}={value!r}): {type(err).__name__}: {err}"
    text = str(err)
    assert text.startswith("kv-canary:"), text
    assert arg.name in text, f"{arg.name!r} not named: {text}"


@pytest.mark.parametrize("arg, value", _cases("type"))
def test_a_wrong_type_is_a_type_error(arg, value):
    _check(arg, value, TypeError)


@pytest.mark.parametrize("arg, value", _cases("value"))
def test_a_wrong_value_is_a_value_error(arg, value):
    _check(arg, value, ValueError)


def test_the_walk_covers_every_entry_point():
    entries = {arg.entry for arg in ARGS}
    assert entries >= {
        "PlanBuffers.allocate",
        "PlanBuffers.allocation_bytes",
        "PlanBuffers.resize",
        "PlanBuffers.ensure_capacity",
        "CanaryStore.allocate",
        "CanaryStore.allocation_bytes",
        "CanaryStore.resize",
        "CanaryStore.ensure_capacity",
        "GraphInputs.allocate",
        "GraphInputs.for_buffers",
        "GraphInputs.fill",
        "GraphInputs.plan_kwargs",
        "RealKV",
        "plan_reference",
        "launch_plan",
        "write_reference",
        "launch_write",
        "verify_reference",
        "launch_verify",
        "gather_violation_reports",
        "verify_entries_needed",
        "plans_equal",
        "PlanBuffers.check_fields",
    }


# --- integers: numpy and __index__ accepted ----------------------------------------------
GOOD = {
    "write_req_capacity": 4,
    "verify_capacity": 16,
    "write_reqs": 8,
    "verify_entries": 32,
    "num_slots": 64,
    "violation_capacity": 4,
    "capacity": 4,
    "mode": 1,
    "page_size": 1,
    "bytes_per_token": 32,
    "read_bytes": 16,
    "swa_window_size": 3,
    "kv_token_id_vs_position_offset": 1,
    "launch_tag": 7,
    "bs": 2,
}


def _summary(result: object) -> object:
    """What a call's result is, in comparable form."""
    if isinstance(result, (PlanBuffers, CanaryStore, GraphInputs)):
        return repr(result)
    if isinstance(result, RealKV):
        return (result.mode, result.page_size, result.bytes_per_token, result.read_bytes)
    return result


@pytest.mark.parametrize("arg", [a for a in ARGS if a.integer], ids=lambda a: f"{a.entry}-{a.name}")
@pytest.mark.parametrize("wrap", [np.int64, np.int32, np.uint16, Index], ids=lambda w: w.__name__)
def test_integers_of_any_kind_are_accepted(arg, wrap):
    value = GOOD[arg.name]
    expected = _summary(arg.call(value))
    assert _summary(arg.call(wrap(value))) == expected


def test_sizes_are_stored_as_python_ints():
    b = PlanBuffers.allocate(
        write_req_capacity=np.int64(4), verify_capacity=Index(16), device=DEVICE
    )
    assert type(b.write_req_capacity) is int and type(b.verify_capacity) is int
    s = CanaryStore.allocate(num_slots=np.int32(64), violation_capacity=np.uint8(4), device=DEVICE)
    assert (s.num_slots, s.violation_capacity) == (64, 4)
    assert s.ensure_capacity(num_slots=np.int64(128)).num_slots == 128
    kv = real_kv(page_size=np.int64(1), bytes_per_token=np.int16(32), read_bytes=np.int64(16))
    assert type(kv.page_size) is int and type(kv.read_bytes) is int


# --- devices torch cannot allocate on here -------------------------------------------------
ALLOCATORS = {
    "PlanBuffers": lambda d: PlanBuffers.allocate(
        write_req_capacity=4, verify_capacity=16, device=d
    ),
    "CanaryStore": lambda d: CanaryStore.allocate(num_slots=64, violation_capacity=4, device=d),
    "GraphInputs": lambda d: GraphInputs.allocate(capacity=4, device=d),
}


@pytest.mark.skipif(CUDA, reason="CUDA is available here")
@pytest.mark.parametrize("which", sorted(ALLOCATORS))
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1", 0, torch.device("cuda")])
def test_cuda_on_a_cpu_only_torch_is_a_kv_canary_error(which, device):
    """torch's own error here is ``AssertionError: Torch not compiled with CUDA enabled``
    (or a ``RuntimeError`` for an int): the library says what works instead."""
    with pytest.raises(ValueError) as info:
        ALLOCATORS[which](device)
    text = str(info.value)
    assert text.startswith("kv-canary: device must be a device this process can allocate on ")
    assert "(here: cpu)" in text and "cuda" in text
    assert "built without CUDA" in text or "CUDA is not available" in text


@pytest.mark.parametrize("which", sorted(ALLOCATORS))
@pytest.mark.parametrize("device", ["mps", "xpu", "fpga"])
def test_a_backend_torch_cannot_allocate_on_is_a_kv_canary_error(which, device):
    backend = getattr(torch, device, None)
    if backend is not None and getattr(backend, "is_available", lambda: False)():
        pytest.skip(f"{device} is available here")
    with pytest.raises(
        ValueError,
        match=rf"^kv-canary: device must be a device this process "
        rf"can allocate on \(here: cpu.*\), got '{device}': torch cannot "
        "allocate there",
    ):
        ALLOCATORS[which](device)


@pytest.mark.parametrize("which", sorted(ALLOCATORS))
def test_cpu_allocates_and_meta_is_refused_at_allocation(which):
    """A meta tensor has no memory: refused at once with a ``kv-canary:`` error, not later
    by an aliasing check or by torch when a report is read back."""
    assert ALLOCATORS[which](torch.device("cpu")).device == torch.device("cpu")
    for meta in ("meta", torch.device("meta")):
        with pytest.raises(
            ValueError,
            match=r"^kv-canary: device must be a device with memory \(here: cpu.*\), got "
            r"'meta': a meta tensor holds no data",
        ):
            ALLOCATORS[which](meta)


@pytest.mark.gpu
def test_a_cuda_index_past_the_last_is_a_kv_canary_error():
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"this machine has {count} CUDA device"):
        PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=f"cuda:{count}")
    assert PlanBuffers.allocate(write_req_capacity=4, verify_capacity=16, device=0).device == (
        torch.device("cuda", 0)
    )


# --- gather: dst past the world --------------------------------------------------------------
def test_gather_refuses_a_dst_past_the_world():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    report = ViolationReport(violations=(), appended=0, dropped=0, kernel_runs=0, slots_processed=0)
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
        try:
            with pytest.raises(
                ValueError,
                match=r"^kv-canary: dst must be a rank of the default group, in "
                r"\[0, 1\), or None, got 1$",
            ):
                gather_violation_reports(report, dst=1)
            assert gather_violation_reports(report, dst=np.int64(0)) is not None
        finally:
            dist.destroy_process_group()

"""The three launchers inside ``torch.compile``: custom operators with declared writes.

``launch_plan``, ``launch_write`` and ``launch_verify`` test
``torch.compiler.is_compiling()`` first (about 0.07 us on the CPU; dynamo folds it to a
constant while it traces). Traced by dynamo they call one operator each instead of their
eager body, so a compiled function that launches them has no graph break:

- ``kv_canary::plan``: writes the ``PlanBuffers``' arena;
- ``kv_canary::write``, ``kv_canary::verify``: write the ``CanaryStore``'s arena and read
  the plan's;
- ``kv_canary::write_chain``, ``kv_canary::write_stamp`` (the split write): write the
  ``CanaryStore``'s and the ``WriteWorkspace``'s arenas and read the plan's.

An operator takes tensors and integers only, so each object is passed as its arena (the
one ``uint8`` allocation every field is a view of, ``Arena.tensor``: what the kernels
write, declared mutated: ``Tensor(a!)``) and its handle (``Arena.handle``); a
``RealKV`` as its source tensors (read: a forward that writes the KV cache earlier in the
same graph is ordered before the hash) and its handle. When the compiled graph runs, the
operator finds the live objects again (:mod:`kv_canary_buffers.live`), runs the eager
validation on them (a rejected call raises its ``kv-canary:`` error from inside the
compiled function, before any kernel of that call), then launches the kernels through the
same ``dispatch_*`` functions as the eager launchers.

Functionalization may hand an operator a copy of an arena or of a real-KV source instead
of the tensor itself (``backend="aot_eager"`` always does; inductor writes in place): the
kernels then write and read the tensors the operator was given, laid out as the object's
fields, and the compiled function copies the result back. :data:`CALLS` counts both cases.

Why the arena and not the fields: the fields are int64 and int32 views of one ``uint8``
allocation, and AOTAutograd refuses a graph in which a mutated input shares its storage
with another input of another dtype ("aot_autograd() does not yet handle input mutations
on views with different dtypes"; its overlap test also compares views' offsets in
elements, not bytes, so disjoint fields of different dtypes count as overlapping). One
``uint8`` input per object avoids both. The same rule means that a compiled function that
launches on an object reads that object's fields through :func:`field` (a view of the
arena traced in the graph), not as attributes: ``buffers.write_offsets`` there would be a
second graph input sharing the arena's storage (docs/user-guide.md, "torch.compile").
"""

from __future__ import annotations

import collections
import inspect
import weakref
from collections.abc import Sequence
from typing import Any, NoReturn, TypeVar, cast, get_type_hints

import torch
from typing_extensions import Unpack

from kv_canary_buffers.buffers import PlanBuffers
from kv_canary_buffers.live import find_arena, find_real_kv
from kv_canary_buffers.plan import PlanInputs, validate_plan_args
from kv_canary_buffers.real_kv import RealKV
from kv_canary_buffers.store import CanaryStore
from kv_canary_buffers.verify import VerifyArgs, VerifyInputs, validate_verify_args
from kv_canary_buffers.workspace import WriteWorkspace
from kv_canary_buffers.write import (
    WriteArgs,
    WriteChainInputs,
    WriteInputs,
    WriteStampArgs,
    WriteStampInputs,
    record_chain,
    record_stamp,
    validate_write_args,
    validate_write_chain_args,
    validate_write_stamp_args,
)

from .plan import dispatch_plan
from .verify import dispatch_verify
from .write import dispatch_write
from .write_split import dispatch_write_chain, dispatch_write_stamp

_T = TypeVar("_T", PlanBuffers, CanaryStore, WriteWorkspace)

CALLS: collections.Counter[str] = collections.Counter()
"""Operator calls when compiled graphs ran, by ``"<op> in place"`` (the kernels wrote the
object's own arena) and ``"<op> on a copy"`` (functionalization passed a copy, copied
back after the call). For tests and diagnostics."""

# --- the operators -------------------------------------------------------------------
# Each operator's schema and argument order come from its stage's inputs TypedDict
# (PlanInputs, WriteInputs, VerifyInputs: the one definition of the keywords), after the
# objects' arenas and handles; a RealKV becomes its handle and its source tensors.
_Kind = str
"""How one keyword crosses the operator: ``tensor``, ``optional tensor``, ``int``, ``bool``
or ``real_kv`` (two operator arguments: the handle and the sources)."""

_SCHEMA_OF_KIND = {
    "tensor": "Tensor {}",
    "optional tensor": "Tensor? {}",
    "int": "SymInt {}",
    "bool": "bool {}",
    "real_kv": "SymInt real_kv_handle, Tensor[] sources",
}


def _kinds(inputs: type) -> dict[str, _Kind]:
    """Each keyword of a stage's inputs TypedDict and its kind, in definition order."""
    kinds = {}
    for name, hint in get_type_hints(inputs).items():
        if hint is torch.Tensor:
            kinds[name] = "tensor"
        elif hint == torch.Tensor | None:
            kinds[name] = "optional tensor"
        elif hint == RealKV | None:
            kinds[name] = "real_kv"
        elif hint is bool:
            kinds[name] = "bool"
        elif hint is int:
            kinds[name] = "int"
        else:  # pragma: no cover - a new kind of input needs a line here
            raise TypeError(f"kv-canary: internal error: no operator kind for {name}: {hint}")
    return kinds


def _schema(head: str, kinds: dict[str, _Kind]) -> str:
    body = ", ".join(_SCHEMA_OF_KIND[kind].format(name) for name, kind in kinds.items())
    return f"({head}, {body}) -> ()"


def _defaults(validate: Any, kinds: dict[str, _Kind]) -> dict[str, Any]:
    """The validation's default of each optional keyword (one source: its signature)."""
    params = inspect.signature(validate).parameters
    return {n: params[n].default for n in kinds if params[n].default is not params[n].empty}


_PLAN = _kinds(PlanInputs)
_WRITE = _kinds(WriteInputs)
_VERIFY = _kinds(VerifyInputs)
_PLAN_DEFAULTS = _defaults(validate_plan_args, _PLAN)
_WRITE_DEFAULTS = _defaults(validate_write_args, _WRITE)
_VERIFY_DEFAULTS = _defaults(validate_verify_args, _VERIFY)
# The sources are the operators' last argument (_write_impl, _verify_impl read them there).
assert list(_WRITE)[-1] == list(_VERIFY)[-1] == "real_kv"
_WRITE_CHAIN = _kinds(WriteChainInputs)
_WRITE_STAMP = _kinds(WriteStampInputs)
_WRITE_CHAIN_DEFAULTS = _defaults(validate_write_chain_args, _WRITE_CHAIN)
_WRITE_STAMP_DEFAULTS = _defaults(validate_write_stamp_args, _WRITE_STAMP)
assert list(_WRITE_STAMP)[-1] == "real_kv"
_PAIR = "Tensor(a!) store_arena, Tensor plan_arena, SymInt store_handle, SymInt plan_handle"
_TRIPLE = (
    "Tensor(a!) store_arena, Tensor plan_arena, Tensor(b!) workspace_arena, "
    "SymInt store_handle, SymInt plan_handle, SymInt workspace_handle"
)
PLAN_SCHEMA = _schema("Tensor(a!) arena, SymInt handle", _PLAN)
WRITE_SCHEMA = _schema(_PAIR, _WRITE)
VERIFY_SCHEMA = _schema(_PAIR, _VERIFY)
WRITE_CHAIN_SCHEMA = _schema(_TRIPLE, _WRITE_CHAIN)
WRITE_STAMP_SCHEMA = _schema(_TRIPLE, _WRITE_STAMP)
"""The operators' schemas (``torch.ops.kv_canary.plan`` / ``write`` / ``verify`` /
``write_chain`` / ``write_stamp``)."""


def _as_inputs(kinds: dict[str, _Kind], values: Sequence[Any]) -> dict[str, Any]:
    """The operator's trailing arguments as the stage's keywords (a RealKV found again)."""
    out: dict[str, Any] = {}
    i = 0
    for name, kind in kinds.items():
        if kind == "real_kv":
            out[name] = _real_kv(values[i])
            i += 2  # the handle, then the sources (read back by _with_sources)
        else:
            out[name] = values[i]
            i += 1
    return out


def _plan_impl(arena: torch.Tensor, handle: int, *values: Any) -> None:
    buffers = _owner(handle, PlanBuffers, "buffers")
    args = validate_plan_args(buffers, **_as_inputs(_PLAN, values))
    dispatch_plan(_laid_over("plan", buffers, arena, "buffers"), args)


def _write_impl(
    store_arena: torch.Tensor,
    plan_arena: torch.Tensor,
    store_handle: int,
    plan_handle: int,
    *values: Any,
) -> None:
    store = _owner(store_handle, CanaryStore, "store")
    plan_buffers = _owner(plan_handle, PlanBuffers, "plan_buffers")
    args = validate_write_args(store, plan_buffers, **_as_inputs(_WRITE, values))
    args = cast(WriteArgs, _with_sources(args, values[-1]))
    dispatch_write(
        _laid_over("write", store, store_arena, "store"),
        _laid_over(None, plan_buffers, plan_arena, "plan_buffers"),
        args,
    )


def _verify_impl(
    store_arena: torch.Tensor,
    plan_arena: torch.Tensor,
    store_handle: int,
    plan_handle: int,
    *values: Any,
) -> None:
    store = _owner(store_handle, CanaryStore, "store")
    plan_buffers = _owner(plan_handle, PlanBuffers, "plan_buffers")
    args = validate_verify_args(store, plan_buffers, **_as_inputs(_VERIFY, values))
    args = cast(VerifyArgs, _with_sources(args, values[-1]))
    dispatch_verify(
        _laid_over("verify", store, store_arena, "store"),
        _laid_over(None, plan_buffers, plan_arena, "plan_buffers"),
        args,
    )


def _write_chain_impl(
    store_arena: torch.Tensor,
    plan_arena: torch.Tensor,
    workspace_arena: torch.Tensor,
    store_handle: int,
    plan_handle: int,
    workspace_handle: int,
    *values: Any,
) -> None:
    store = _owner(store_handle, CanaryStore, "store")
    plan_buffers = _owner(plan_handle, PlanBuffers, "plan_buffers")
    workspace = _owner(workspace_handle, WriteWorkspace, "workspace")
    args = validate_write_chain_args(
        store, plan_buffers, workspace, **_as_inputs(_WRITE_CHAIN, values)
    )
    launch = record_chain(store, plan_buffers, args)
    dispatch_write_chain(
        _laid_over("write_chain", store, store_arena, "store"),
        _laid_over(None, plan_buffers, plan_arena, "plan_buffers"),
        _laid_over(None, workspace, workspace_arena, "workspace"),
        args.write,
        launch,
    )


def _write_stamp_impl(
    store_arena: torch.Tensor,
    plan_arena: torch.Tensor,
    workspace_arena: torch.Tensor,
    store_handle: int,
    plan_handle: int,
    workspace_handle: int,
    *values: Any,
) -> None:
    store = _owner(store_handle, CanaryStore, "store")
    plan_buffers = _owner(plan_handle, PlanBuffers, "plan_buffers")
    workspace = _owner(workspace_handle, WriteWorkspace, "workspace")
    args = validate_write_stamp_args(
        store, plan_buffers, workspace, **_as_inputs(_WRITE_STAMP, values)
    )
    args = cast(WriteStampArgs, _with_sources(args, values[-1]))
    record_stamp(workspace)
    dispatch_write_stamp(
        _laid_over("write_stamp", store, store_arena, "store"),
        _laid_over(None, workspace, workspace_arena, "workspace"),
        args,
    )


def _no_output(*_args: Any, **_kwargs: Any) -> None:
    """The fake (meta) implementation of every operator: they return nothing."""
    return None


_LIB = torch.library.Library("kv_canary", "DEF")
"""The operators' namespace. Defined with the low-level ``Library`` API rather than
``torch.library.custom_op``: the latter wraps every call in Python autograd and
version-counter layers (about 50 us of host time per call on the development CPU, against
a few for the dispatcher's own C++ fallbacks, which bump the mutated arena's version
counter the same way)."""


def _define(name: str, schema: str, impl: Any) -> Any:
    _LIB.define(name + schema)
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"kv_canary::{name}", _no_output, lib=_LIB)
    return getattr(torch.ops.kv_canary, name).default


plan_op = _define("plan", PLAN_SCHEMA, _plan_impl)
write_op = _define("write", WRITE_SCHEMA, _write_impl)
verify_op = _define("verify", VERIFY_SCHEMA, _verify_impl)
write_chain_op = _define("write_chain", WRITE_CHAIN_SCHEMA, _write_chain_impl)
write_stamp_op = _define("write_stamp", WRITE_STAMP_SCHEMA, _write_stamp_impl)


# --- what the launchers call while dynamo traces them ---------------------------------
# Plain loops: older dynamo releases trace generator expressions less reliably.
def _op_values(
    kinds: dict[str, _Kind], defaults: dict[str, Any], inputs: dict[str, Any]
) -> list[Any] | None:
    """The operator's trailing arguments for the stage's keywords ``inputs``, or None when
    one is missing, unknown or of the wrong type: the launcher's eager checks then raise
    their error while dynamo traces (and the operator is not added to the graph)."""
    for name in inputs:
        if name not in kinds:
            return None
    values: list[Any] = []
    for name, kind in kinds.items():
        if name in inputs:
            value = inputs[name]
        elif name in defaults:
            value = defaults[name]
        else:
            return None
        if kind == "tensor":
            ok = isinstance(value, torch.Tensor)
        elif kind == "optional tensor":
            ok = value is None or isinstance(value, torch.Tensor)
        elif kind == "int":
            ok = type(value) is int
        elif kind == "bool":
            ok = type(value) is bool
        else:  # real_kv
            ok = value is None or type(value) is RealKV
            if ok:
                values.extend(_real_kv_args(value))
                continue
        if not ok:
            return None
        values.append(value)
    return values


def plan(buffers: PlanBuffers, **inputs: Unpack[PlanInputs]) -> bool:
    """``launch_plan`` traced: the ``kv_canary::plan`` operator. Returns False (and adds
    nothing to the graph) when an argument's type is wrong, so that the launcher's eager
    checks raise their error while dynamo traces."""
    values = _op_values(_PLAN, _PLAN_DEFAULTS, dict(inputs))
    if type(buffers) is not PlanBuffers or values is None:
        return False
    arena = buffers.arena
    plan_op(arena.tensor, arena.handle, *values)
    return True


def write(store: CanaryStore, plan_buffers: PlanBuffers, **inputs: Unpack[WriteInputs]) -> bool:
    """``launch_write`` traced: the ``kv_canary::write`` operator (False: see :func:`plan`)."""
    values = _op_values(_WRITE, _WRITE_DEFAULTS, dict(inputs))
    if not _objects_ok(store, plan_buffers) or values is None:
        return False
    write_op(
        store.arena.tensor,
        plan_buffers.arena.tensor,
        store.arena.handle,
        plan_buffers.arena.handle,
        *values,
    )
    return True


def verify(store: CanaryStore, plan_buffers: PlanBuffers, **inputs: Unpack[VerifyInputs]) -> bool:
    """``launch_verify`` traced: the ``kv_canary::verify`` operator (False: see :func:`plan`)."""
    values = _op_values(_VERIFY, _VERIFY_DEFAULTS, dict(inputs))
    if not _objects_ok(store, plan_buffers) or values is None:
        return False
    verify_op(
        store.arena.tensor,
        plan_buffers.arena.tensor,
        store.arena.handle,
        plan_buffers.arena.handle,
        *values,
    )
    return True


def _split_write(
    spec: Any,
    defaults: Any,
    op: Any,
    store: CanaryStore,
    plan_buffers: PlanBuffers,
    workspace: WriteWorkspace,
    inputs: dict[str, Any],
) -> bool:
    """Both split-write stages traced: one operator call over the three owners' arenas."""
    values = _op_values(spec, defaults, inputs)
    if not _objects_ok(store, plan_buffers) or type(workspace) is not WriteWorkspace:
        return False
    if values is None:
        return False
    op(
        store.arena.tensor,
        plan_buffers.arena.tensor,
        workspace.arena.tensor,
        store.arena.handle,
        plan_buffers.arena.handle,
        workspace.arena.handle,
        *values,
    )
    return True


def write_chain(
    store: CanaryStore,
    plan_buffers: PlanBuffers,
    workspace: WriteWorkspace,
    **inputs: Unpack[WriteChainInputs],
) -> bool:
    """``launch_write_chain`` traced: the ``kv_canary::write_chain`` operator (False: see
    :func:`plan`)."""
    return _split_write(
        _WRITE_CHAIN, _WRITE_CHAIN_DEFAULTS, write_chain_op, store, plan_buffers, workspace,
        dict(inputs),
    )  # fmt: skip


def write_stamp(
    store: CanaryStore,
    plan_buffers: PlanBuffers,
    workspace: WriteWorkspace,
    **inputs: Unpack[WriteStampInputs],
) -> bool:
    """``launch_write_stamp`` traced: the ``kv_canary::write_stamp`` operator (False: see
    :func:`plan`)."""
    return _split_write(
        _WRITE_STAMP, _WRITE_STAMP_DEFAULTS, write_stamp_op, store, plan_buffers, workspace,
        dict(inputs),
    )  # fmt: skip


def _objects_ok(store: object, plan_buffers: object) -> bool:
    return type(store) is CanaryStore and type(plan_buffers) is PlanBuffers


def _real_kv_args(real_kv: RealKV | None) -> tuple[int, list[torch.Tensor]]:
    if real_kv is None:
        return 0, []
    return real_kv._handle, list(real_kv.tensors)


def field(obj: PlanBuffers | CanaryStore | WriteWorkspace, name: str) -> torch.Tensor:
    """Field ``name`` of ``obj`` as a view of its arena tensor (``obj.arena.tensor``).

    Inside a compiled function that launches on ``obj``, read its fields this way: the
    view is traced in the graph from the arena the launches declare they write, so the
    read sees their writes. (``obj.<name>`` there would be a second graph input sharing
    the arena's storage, which AOTAutograd refuses.) Outside compiled code it equals
    ``getattr(obj, name)`` (another view of the same memory)."""
    arena = obj.arena
    for f in arena.fields:
        if f.name == name:
            # Checked outside compiled code only (dynamo cannot trace an address test);
            # inside it, the launches' own check refuses a rebound arena tensor.
            own = (
                arena.tensor
                if torch.compiler.is_compiling()
                else _own_tensor(arena, type(obj).__name__)
            )
            return own[f.offset : f.offset + f.nbytes].view(f.dtype).view(f.shape)
    names = ", ".join(f.name for f in arena.fields)
    raise ValueError(
        f"kv-canary: name must be a field of {type(obj).__name__} ({names}), got {name!r}"
    )


# --- run time: the objects again, and where the kernels write --------------------------
def _owner(handle: int, cls: type[_T], name: str) -> _T:
    arena = find_arena(handle)
    owner = arena.owner() if arena is not None else None
    if type(owner) is not cls or owner.arena is not arena:
        _raise_gone(name, cls)
    return owner


def _raise_gone(name: str, cls: type) -> NoReturn:
    raise ValueError(
        f"kv-canary: {name} must be a live {cls.__name__}, got none with the arena handle the "
        "compiled function was called with (the object was freed or tampered with)"
    )


def _real_kv(handle: int) -> RealKV | None:
    if handle == 0:
        return None
    real_kv = find_real_kv(handle)
    if type(real_kv) is not RealKV:
        raise ValueError(
            "kv-canary: real_kv must be a live RealKV, got none with the handle the compiled "
            "function was called with (the object was freed)"
        )
    return real_kv


def _own_tensor(arena: Any, name: str) -> torch.Tensor:
    """``arena.tensor``, checked to still be the arena's allocation."""
    own = arena.tensor
    if not (
        type(own) is torch.Tensor
        and own.data_ptr() == arena.base
        and own.dtype is torch.uint8
        and own.shape == (arena.nbytes,)
    ):
        raise ValueError(
            f"kv-canary: {name}.arena.tensor is no longer the arena's allocation (it was "
            "rebound or swapped); build objects with allocate() and change them only through "
            "their own methods"
        )
    return own


def _laid_over(op: str | None, obj: _T, given: torch.Tensor, name: str) -> _T:
    """``obj`` when the operator was given ``obj``'s own arena; otherwise ``obj``'s fields
    laid over ``given`` (a copy made by functionalization), for the kernels to use."""
    arena = obj.arena
    _own_tensor(arena, name)
    if given.data_ptr() == arena.base:
        if op is not None:
            CALLS[f"{op} in place"] += 1
        return obj
    if not (
        given.dtype is torch.uint8
        and given.shape == (arena.nbytes,)
        and given.is_contiguous()
        and given.device == arena.device
        # the compiled variants were keyed on the arena's alignment (256 bytes)
        and given.data_ptr() % 16 == 0
    ):
        raise ValueError(
            f"kv-canary: the compiled function passed a copy of {name}'s arena that is not "
            f"laid out like it: expected uint8 [{arena.nbytes}] contiguous and 16-byte aligned on "
            f"{arena.device}, got {given.dtype} {list(given.shape)} strides {given.stride()} "
            f"at address {given.data_ptr():#x} on {given.device}"
        )
    if op is not None:
        CALLS[f"{op} on a copy"] += 1
    return cast(_T, _Fields(obj, given))


class _Fields:
    """The attributes the ``dispatch_*`` functions read, with every field a view of
    another tensor of the arena's layout."""

    def __init__(self, obj: PlanBuffers | CanaryStore | WriteWorkspace, tensor: torch.Tensor):
        self.device = obj.device
        # The object's own arena, for its launch numbers (Arena.launches: the plan's eager
        # one-launch path): the copy holds the object's bytes and is copied back to it,
        # so its launches continue the object's sequence. No field is read from it.
        self.arena = obj.arena
        if isinstance(obj, PlanBuffers):
            self.write_req_capacity = obj.write_req_capacity
            self.verify_capacity = obj.verify_capacity
        elif isinstance(obj, WriteWorkspace):
            self.token_capacity = obj.token_capacity
            self.slot_capacity = obj.slot_capacity
        else:
            self.num_slots = obj.num_slots
            self.violation_capacity = obj.violation_capacity
        for f in obj.arena.fields:
            view = tensor[f.offset : f.offset + f.nbytes].view(f.dtype).view(f.shape)
            setattr(self, f.name, view)


def _with_sources(
    args: WriteArgs | VerifyArgs | WriteStampArgs, given: Sequence[torch.Tensor]
) -> Any:
    """``args`` whose real-KV sources are the tensors the operator was given: the
    validated ones, or copies of them made by functionalization (same shapes, dtypes and
    strides but perhaps the row stride), which must meet the kernels' layout rules too;
    the kernels then read a source table over the copies (built once per set of copies'
    addresses, :data:`_COPY_TABLES`)."""
    real_kv = args.real_kv
    if real_kv is None:
        return args
    own = real_kv.tensors
    if len(given) != len(own):
        raise ValueError(
            f"kv-canary: real_kv.sources must hold the {len(own)} tensors the RealKV was "
            f"built with, got {len(given)} in the compiled call"
        )
    if all(g.data_ptr() == s.data_ptr() and g.stride() == s.stride() for g, s in zip(given, own)):
        return args
    for i, (g, s) in enumerate(zip(given, own)):
        if not (
            g.shape == s.shape
            and g.dtype == s.dtype
            and g.device == s.device
            and _strides_but_rows(g) == _strides_but_rows(s)
            and g.data_ptr() % 16 == 0
            and (g.stride(0) * g.element_size()) % 16 == 0
        ):
            raise ValueError(
                f"kv-canary: the compiled function passed a copy of real_kv.sources[{i}] that "
                f"the kernels cannot read: expected shape {tuple(s.shape)} {s.dtype} on "
                f"{s.device} with strides {s.stride()} (but the first), 16-byte aligned, got "
                f"{tuple(g.shape)} {g.dtype} on {g.device} with strides {g.stride()}"
            )
    copies = tuple(given)
    key = tuple((g.data_ptr(), g.stride(0)) for g in copies)
    tables = _COPY_TABLES.setdefault(real_kv, {})
    table = tables.get(key)
    if table is None:
        if len(tables) >= _COPY_TABLES_PER_REAL_KV:
            tables.clear()
        table = tables[key] = real_kv._table_over(copies)
    return args._replace(real_kv=cast(RealKV, _SourcesOver(real_kv, table)))


def _strides_but_rows(t: torch.Tensor) -> tuple[int, ...]:
    """The strides of ``t``'s dimensions past the first, 0 for those of size 1 (whose
    stride nothing reads)."""
    return tuple(st if n > 1 else 0 for n, st in zip(t.shape[1:], t.stride()[1:]))


_COPY_TABLES: weakref.WeakKeyDictionary[RealKV, dict[tuple[tuple[int, int], ...], torch.Tensor]]
_COPY_TABLES = weakref.WeakKeyDictionary()
"""Per ``RealKV``, source tables over copies of its sources, by the copies' addresses and
row strides (what a table holds beyond the ``RealKV``'s own geometry): functionalization
copies a source at every call, usually to the same addresses (the caching allocator), so
a table is built (allocated and copied to the device) once per distinct set. Never inside
a CUDA-graph capture, then: a compiled function captured in a graph must keep its sources
in place (inductor does, unless a KV write before the launch cannot be done in place)."""
_COPY_TABLES_PER_REAL_KV = 8


class _SourcesOver:
    """A ``RealKV`` whose kernels' source table is over other tensors of the same layout
    (what ``kv_canary_kernels.sources.source_args`` reads)."""

    def __init__(self, real_kv: RealKV, table: torch.Tensor):
        self.mode = real_kv.mode
        self._source_table = table
        self._covers = real_kv._covers

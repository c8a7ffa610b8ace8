"""Live library objects by an integer handle: how a launch traced by ``torch.compile``
finds its objects again when the compiled graph runs.

A custom operator takes only tensors, integers, booleans and None, so the compiled launch
(``kv_canary_kernels.compiled``) passes an arena's or a ``RealKV``'s handle (a number drawn
at construction, never reused in the process) and looks the object up here when the graph
runs, then runs the same validation as an eager call on it. Both are plain integer
attributes, which dynamo first guards on and then, once a second value is seen, passes as
dynamic integers, so new objects stop recompiling a function after the second. Every
:class:`~kv_canary_buffers.arena.Arena` and every :class:`~kv_canary_buffers.RealKV`
registers itself at construction under its own handle; the maps hold weak references, so
they never keep an object alive. Handles rather than addresses: a second ``Arena`` object
over the same allocation (``attrs.evolve``), an allocation at a freed one's address, or
meta tensors (address 0) can never take over or remove another object's entry.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

_ARENAS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_REAL_KVS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)


def register_arena(arena: Any) -> None:
    """Record ``arena`` under its handle (``arena.handle``)."""
    _ARENAS[arena.handle] = arena


def find_arena(handle: int) -> Any | None:
    """The live arena with this handle, or None."""
    return _ARENAS.get(handle)


def next_handle() -> int:
    """A handle never given before in this process (0 stands for "no object")."""
    return next(_HANDLES)


def register_real_kv(real_kv: Any) -> None:
    """Record ``real_kv`` under its handle (``real_kv._handle``)."""
    _REAL_KVS[real_kv._handle] = real_kv


def find_real_kv(handle: int) -> Any | None:
    """The live ``RealKV`` with this handle, or None."""
    return _REAL_KVS.get(handle)

"""The three launchers, the package's only doors to its kernels.

Each accepts nothing but the library's own buffer classes and takes the same keyword
arguments as its torch reference in ``kv_canary_buffers``; each runs that stage's
host-side validation first (a rejected call writes nothing), then the stage's dispatch.
Traced by ``torch.compile`` (``is_compiling()``), each calls its custom operator in
:mod:`.compiled` instead, which validates and dispatches when the graph runs.

=============  ==========================  =====================================
launcher       torch reference             kernels (dispatch)
=============  ==========================  =====================================
launch_plan    ``plan_reference``          :mod:`.plan` (``dispatch_plan``)
launch_write   ``write_reference``         :mod:`.write` (``dispatch_write``)
launch_verify  ``verify_reference``        :mod:`.verify` (``dispatch_verify``)
=============  ==========================  =====================================

The split write (the write as two launches: the chain before the forward, the stamp after
it) has two more, over a :class:`~kv_canary_buffers.WriteWorkspace`:
``launch_write_chain`` (``write_chain_reference``) and ``launch_write_stamp``
(``write_stamp_reference``), both in :mod:`.write_split`. ``launch_write_pair``
(``write_pair_reference``) is the write of two stores (a step's HEAD and TAIL) in one
launch; traced, it is two ``launch_write`` operators.
"""

from __future__ import annotations

from torch.compiler import is_compiling
from typing_extensions import Unpack

from kv_canary_buffers.buffers import PlanBuffers
from kv_canary_buffers.plan import PlanInputs, validate_plan_args
from kv_canary_buffers.store import CanaryStore
from kv_canary_buffers.verify import VerifyInputs, validate_verify_args
from kv_canary_buffers.workspace import WriteWorkspace
from kv_canary_buffers.write import (
    WriteChainInputs,
    WriteInputs,
    WriteStampInputs,
    check_two_stores,
    record_chain,
    record_stamp,
    validate_write_args,
    validate_write_chain_args,
    validate_write_pair_args,
    validate_write_stamp_args,
)

from . import compiled
from .plan import dispatch_plan
from .verify import dispatch_verify
from .write import dispatch_write, dispatch_write_pair
from .write_split import dispatch_write_chain, dispatch_write_stamp


def launch_plan(buffers: PlanBuffers, **inputs: Unpack[PlanInputs]) -> None:
    """Fill ``buffers`` with the plan of one batch on the GPU, byte for byte equal to
    :func:`kv_canary_buffers.plan_reference` (same arguments, shapes and dtypes).

    Runs the shared host-side validation and ``buffers.check()`` first, so a rejected
    call writes nothing; then one kernel launch on the current stream (``bs < 1024``, and
    eager batches below ``LaunchConfig.one_launch_max_rows``) or three (in a CUDA graph
    capture, and larger batches). It never allocates device memory, never syncs and is
    safe to capture in a CUDA graph (see :class:`kv_canary_buffers.GraphInputs`). Input
    data outside the tables is not read: the affected values become padding values and a
    :class:`PlanStatus` bit is set in ``buffers.status`` (read it with
    ``buffers.take_status()``).

    Raises:
        TypeError: ``buffers`` is not a :class:`PlanBuffers`, or an argument has the
            wrong type.
        ValueError: a host-side check failed (the message names the argument).
        RuntimeError: Triton cannot run on ``buffers.device`` (a CPU tensor without
            ``TRITON_INTERPRET=1``): use ``plan_reference`` there.
    """
    # traced by torch.compile: one custom operator
    if is_compiling() and compiled.plan(buffers, **inputs):
        return
    args = validate_plan_args(buffers, **inputs)
    dispatch_plan(buffers, args)


def launch_write(
    store: CanaryStore, plan_buffers: PlanBuffers, **inputs: Unpack[WriteInputs]
) -> None:
    """Stamp the records of the slots a step wrote, on the GPU, byte for byte equal to
    :func:`kv_canary_buffers.write_reference` (same arguments, shapes and dtypes; violation
    rows of one call in unspecified order).

    Runs the shared validation first (a rejected call writes nothing), then one kernel
    launch on the current stream. Never allocates, never syncs, never recompiles for a new
    ``n`` or capacity, and is safe to capture in a CUDA graph. Data outside the store or
    the inputs is skipped with a :class:`CanaryStatus` bit in ``store.status``.
    """
    # traced by torch.compile: one custom operator
    if is_compiling() and compiled.write(store, plan_buffers, **inputs):
        return
    args = validate_write_args(store, plan_buffers, **inputs)
    dispatch_write(store, plan_buffers, args)


def launch_write_pair(
    head: CanaryStore,
    tail: CanaryStore,
    plan_buffers: PlanBuffers,
    *,
    tail_launch_tag: int = 0,
    **inputs: Unpack[WriteInputs],
) -> None:
    """A step's HEAD and TAIL writes in one launch: :func:`launch_write` of ``head`` with
    ``inputs`` and of ``tail`` with the same ``input_ids``, ``positions``,
    ``out_cache_loc`` and ``real_kv``, ``tail_launch_tag`` and no expected inputs; byte
    for byte :func:`kv_canary_buffers.write_pair_reference` (violation rows of one store
    in unspecified order). One launch instead of two: an engine that keeps both stores
    pays one launch's host time a step.

    Validates both first (:func:`kv_canary_buffers.write.validate_write_pair_args`: a
    rejected call writes neither store), then one kernel launch on the current stream of
    twice :func:`launch_write`'s programs. Never allocates, never syncs, never recompiles
    for a new ``n`` or capacity, safe to capture in a CUDA graph.

    Args:
        head, tail: two distinct :class:`CanaryStore` objects on one device.
        plan_buffers: the step's :class:`PlanBuffers` (its write part), that device.
        tail_launch_tag: int64, written into the TAIL store's violation rows.
        **inputs: :class:`WriteInputs`: ``input_ids``, ``positions``, ``out_cache_loc``
            int64 ``[n]`` contiguous (both stores'), the HEAD's ``launch_tag`` (int64) and
            optional ``expected_input_ids`` / ``expected_positions`` int64 ``[n]``, and
            ``real_kv`` (a :class:`RealKV` covering both stores, or None).

    Under ``torch.compile``
    it is the two writes' operators, one after the other, each refusing its own call (the
    same store twice is refused as it is traced; a refusal of the tail's write then
    follows the head's, not before it).
    """
    if is_compiling():
        check_two_stores(head, tail)
        launch_write(head, plan_buffers, **inputs)
        plain = {k: inputs[k] for k in ("input_ids", "positions", "out_cache_loc")}
        launch_write(
            tail, plan_buffers, launch_tag=tail_launch_tag, real_kv=inputs.get("real_kv"), **plain
        )
        return
    args = validate_write_pair_args(
        head, tail, plan_buffers, tail_launch_tag=tail_launch_tag, **inputs
    )
    dispatch_write_pair(head, tail, plan_buffers, args)


def launch_verify(
    store: CanaryStore, plan_buffers: PlanBuffers, **inputs: Unpack[VerifyInputs]
) -> None:
    """Check the records of every verify entry of a plan on the GPU, equal to
    :func:`kv_canary_buffers.verify_reference` (same arguments; violation rows of one call
    in unspecified order).

    Runs the shared validation first (a rejected call writes nothing), then one kernel
    launch on the current stream. Never allocates, never syncs, never recompiles for a new
    plan size or capacity, and is safe to capture in a CUDA graph. Entries whose slot,
    predecessor or real-KV row lies outside the store are skipped with a
    :class:`CanaryStatus` bit in ``store.status``.
    """
    # traced by torch.compile: one custom operator
    if is_compiling() and compiled.verify(store, plan_buffers, **inputs):
        return
    args = validate_verify_args(store, plan_buffers, **inputs)
    dispatch_verify(store, plan_buffers, args)


def launch_write_chain(
    store: CanaryStore,
    plan_buffers: PlanBuffers,
    workspace: WriteWorkspace,
    **inputs: Unpack[WriteChainInputs],
) -> None:
    """The split write's first stage, before the forward, equal to
    :func:`kv_canary_buffers.write_chain_reference` (violation rows of one call in
    unspecified order): each row's hash chain and the write checks that need no KV bytes,
    their violation rows appended to ``store``'s ring, and per stamped token its entry in
    ``workspace``. Writes no record: :func:`launch_write_stamp` does, after the forward.

    Launch it on a side stream that waits for an event the main stream recorded after the
    step's plan (and the previous step's stamp), so that it runs beside the forward; the
    stamp's stream waits for an event recorded after it (docs/user-guide.md, "The split
    write"). Runs the shared validation first (a rejected call writes nothing), then one
    kernel launch on the current stream. Never allocates, never syncs, never recompiles for
    a new ``n`` or capacity, and is safe to capture in a CUDA graph. Data outside the store
    or the inputs is skipped with a :class:`CanaryStatus` bit in ``store.status``.
    """
    if is_compiling() and compiled.write_chain(store, plan_buffers, workspace, **inputs):
        return
    args = validate_write_chain_args(store, plan_buffers, workspace, **inputs)
    launch = record_chain(store, plan_buffers, args)
    dispatch_write_chain(store, plan_buffers, args.workspace, args.write, launch)


def launch_write_stamp(
    store: CanaryStore,
    plan_buffers: PlanBuffers,
    workspace: WriteWorkspace,
    **inputs: Unpack[WriteStampInputs],
) -> None:
    """The split write's second stage, after the forward, equal to
    :func:`kv_canary_buffers.write_stamp_reference`: each record the chain prepared in
    ``workspace`` with the hash of the KV bytes the forward wrote (``real_kv``), and its
    owner, one lane a token (its time does not depend on row length). After
    :func:`launch_write_chain` on the same inputs, the store holds exactly what one
    :func:`launch_write` leaves.

    The host-side check refuses a workspace whose last chain ran with another store, plan
    buffers or generation, or was already stamped (``ValueError``, nothing written). On
    the device, a stamp that finds no fresh chain (a CUDA-graph replay of the stamp
    without its chain) stamps nothing and raises ``CanaryStatus.WRITE_CHAIN_STALE``.
    Never allocates, never syncs, safe to capture in a CUDA graph.
    """
    if is_compiling() and compiled.write_stamp(store, plan_buffers, workspace, **inputs):
        return
    args = validate_write_stamp_args(store, plan_buffers, workspace, **inputs)
    record_stamp(workspace)
    dispatch_write_stamp(store, workspace, args)

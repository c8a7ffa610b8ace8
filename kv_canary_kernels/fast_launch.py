"""Launch a ``@triton.jit`` kernel on a given device with little host work.

Triton's ``kernel[grid](...)`` binds and specializes every argument, hashes a cache key
and checks globals at each call: tens of microseconds per launch on a serving host, where
the launchers' budget is 30 us. The launchers here know what a compiled variant depends on
(their constexprs, each pointer's dtype and 16-byte alignment; every runtime integer is
annotated ``tl.int64`` and not specialized), so after a variant is compiled (by its first
launch through Triton, or by :meth:`Launcher.programs_per_sm`, which the verify stage
calls to size its grid) they call the compiled kernel directly. Under the interpreter
every launch goes through Triton.

The launch also runs on the device the buffers live on, whatever the current device is
(a process that touches two GPUs), on that device's current stream.

Two more host costs are avoidable. Triton's launcher turns each tensor argument into its
address with a ``data_ptr()`` call and a ``cuPointerGetAttribute`` driver query (0.25 us a
tensor on the H200 host, 16 to 19 tensors a launch), and accepts a plain ``int`` as an
address instead. And the Python that assembles a launch's arguments costs about as much
as the launch itself. So each stage keeps a :class:`FastPath`: after the first launch of
a (store, plan buffers, real-KV sources, config) combination, which goes the whole way,
every argument that combination fixes is kept as a tuple of ints (addresses in the
objects' arenas, taken from their views after ``check(views=True)``; the validation's
``check()`` proves at each call that those arenas are still in place and the objects'),
and later calls hand the compiled kernel that tuple and the few values of their own.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from triton.runtime import driver

from kv_canary_buffers.buffers import PlanBuffers
from kv_canary_buffers.real_kv import RealKV
from kv_canary_buffers.store import CanaryStore

from .config import INTERPRETING


def _raw_stream(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


# The raw calls Triton itself uses, where this torch build has them (CUDA builds): a
# fraction of a microsecond instead of a Stream object or a device query through Python.
stream_of = getattr(torch._C, "_cuda_getCurrentRawStream", _raw_stream)
current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
_capturing = getattr(
    torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing
)


def capturing(device: torch.device) -> bool:
    """Whether ``device``'s current stream, where a launch for buffers on ``device`` goes,
    is capturing a CUDA graph (False under the interpreter and off CUDA)."""
    if INTERPRETING or device.type != "cuda":
        return False
    if device.index == current_device():
        return bool(_capturing())
    with torch.cuda.device(device.index):  # rare: buffers on a device that is not current
        return bool(_capturing())


_OUTSIDE_KERNEL = "outside of the scope of a kernel"
"""What Triton's interpreter raises (an ``InterpreterError``) when a kernel calls one of
Triton's own ``@triton.jit`` functions that was built for the GPU: ``triton`` was imported
before ``TRITON_INTERPRET=1`` was set."""

INTERPRETER_TOO_LATE = (
    "kv-canary: Triton's interpreter cannot run the kernels: triton was imported before "
    "TRITON_INTERPRET=1 was set, so its own @triton.jit functions were built for the GPU "
    "(Triton said: Cannot call @triton.jit'd outside of the scope of a kernel); set "
    "TRITON_INTERPRET=1 before anything imports triton (in the environment of the "
    "process, or first thing in the program)"
)


Go = Callable[..., None]
"""``go(programs, stream, *args)``: launch one compiled variant on a grid of ``programs``
(one axis); ``args`` are its runtime arguments in order (addresses as ints or tensors),
its constexprs are bound."""

_LAUNCHER_CALL = ("self", "gridX", "gridY", "gridZ", "stream", "function", "args")
"""The parameters of Triton 3.6's ``CudaLauncher.__call__``, whose C ``launch`` it calls
with the same arguments in a known order after allocating scratch memory (none for these
kernels). Other Triton versions lay the call out differently: they go through ``run``."""


def _calls_c_launch_directly(run: Any) -> bool:
    try:
        params = tuple(inspect.signature(type(run).__call__).parameters)
        return (
            params == _LAUNCHER_CALL
            and callable(run.launch)
            and run.global_scratch_size == 0
            and run.profile_scratch_size == 0
            and isinstance(run.launch_cooperative_grid, (bool, int))
            and isinstance(run.launch_pdl, (bool, int))
        )
    except (AttributeError, TypeError, ValueError):
        return False


def direct(kernel: Any, constexprs: tuple[Any, ...]) -> Go:
    """The cheapest call that launches compiled ``kernel``: its C launcher itself where
    this Triton's is known (:data:`_LAUNCHER_CALL`), else ``kernel.run``. Launch hooks
    (Triton's profiling knobs) are not called, as before."""
    run = kernel.run
    function, metadata = kernel.function, kernel.packed_metadata
    if _calls_c_launch_directly(run):
        launch = run.launch
        coop, pdl = run.launch_cooperative_grid, run.launch_pdl

        def go(programs: int, stream: int, *args: Any) -> None:
            launch(
                programs, 1, 1, stream, function, coop, pdl, None, None,
                metadata, None, None, None, *args, *constexprs,
            )  # fmt: skip

        return go

    def go_run(programs: int, stream: int, *args: Any) -> None:
        run(programs, 1, 1, stream, function, metadata, None, None, None, *args, *constexprs)

    return go_run


def addresses(args: Sequence[Any]) -> tuple[Any, ...]:
    """``args`` with each tensor replaced by its address (what Triton's launcher would
    compute at every call)."""
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)


FAST_PATH = not INTERPRETING
"""Whether launches may take the fast path: never under the interpreter, which reads
tensors, not addresses (a test turns it on to run the fast-path code on the CPU)."""


def stage_key(
    store: object, buffers: object, real_kv: object, *flags: Hashable
) -> tuple[Hashable, ...] | None:
    """The :class:`FastPath` key of a write or verify launch: the arenas' keys (handle and
    base as at construction, ``Arena._key``), the sources' handle and ``flags``; None
    where the full path must run (under the interpreter; a ``torch.compile`` copy of an
    arena or of the sources, whose addresses are not the objects')."""
    if (
        not FAST_PATH
        or type(store) is not CanaryStore
        or type(buffers) is not PlanBuffers
        or not (real_kv is None or type(real_kv) is RealKV)
    ):
        return None
    return (
        store.arena._key,
        buffers.arena._key,
        0 if real_kv is None else real_kv._handle,
        *flags,
    )


def check_views(*objects: object) -> None:
    """``check(views=True)`` of each :class:`PlanBuffers` and :class:`CanaryStore` in
    ``objects`` (a ``torch.compile`` copy of one has no private views): what a launch runs
    before it hands the objects' views to Triton as tensors, that is, when it is not
    repeated from a :class:`FastPath` (the first launch of a variant, every launch under the
    interpreter). A repeated launch passes the addresses that check proved."""
    for obj in objects:
        if type(obj) is PlanBuffers or type(obj) is CanaryStore:
            obj.check(views=True)


class FastPath(dict[Hashable, Any]):
    """A stage's launches ready to repeat, keyed by what fixes their arguments (the
    construction-time handles and bases of the arenas and the handles of the sources
    involved, never reused together in a process, and the config's number). Entries hold
    ints and compiled kernels, never a tensor: a cached launch keeps no memory alive.
    Emptied when it reaches :attr:`LIMIT` entries (those of objects since freed are never
    looked up again)."""

    LIMIT = 256

    def remember(self, key: Hashable, value: Any) -> None:
        if len(self) >= self.LIMIT:
            self.clear()
        self[key] = value


class Launcher:
    """A cache of compiled variants of one ``@triton.jit`` function.

    ``launch(device, grid, key, args, constexprs, options)``: ``args`` are the kernel's
    runtime arguments in order, ``constexprs`` its ``tl.constexpr`` keywords, ``options``
    Triton's launch options (``num_warps`` ...). ``key`` must identify the compiled variant
    together with :func:`alignment_key` of the tensor arguments (the caller passes it so
    that it computes no more than it needs). Grids have one axis. Returns the variant's
    :data:`Go` once the variant is compiled (None under the interpreter and at a first
    launch that goes through Triton to compile it), for the caller's :class:`FastPath`."""

    def __init__(self, fn: Any):
        self.fn = fn
        self.variants: dict[Hashable, Any] = {}
        self.direct: dict[Hashable, Go] = {}
        self.fixed = FastPath()
        self.resident: dict[Hashable, int] = {}

    def programs_per_sm(
        self,
        device: torch.device,
        key: Hashable,
        args: Sequence[Any],
        constexprs: dict[str, Any],
        options: dict[str, Any],
    ) -> int | None:
        """How many programs of this variant one multiprocessor of ``device`` runs at once
        (its registers, shared memory and warps), for a persistent grid of one wave;
        compiles the variant first where it is not yet compiled (its first launch then
        goes straight to the compiled kernel). None under the interpreter. Arguments as
        :meth:`launch`'s; ``device`` a CUDA device."""
        if INTERPRETING:
            return None
        full_key = (device.index, key)
        fits = self.resident.get(full_key)
        if fits is None:
            with torch.cuda.device(device.index):
                kernel = self.variants.get(full_key)
                if kernel is None:
                    kernel = self.fn.warmup(*args, grid=(1,), **constexprs, **options)
                    if not hasattr(kernel, "_init_handles"):
                        # No compiled kernel back (a Triton compile hook took it): the
                        # first launch compiles it, and the config's bound applies. 0
                        # remembers that, so that later launches do not warm up again.
                        self.resident[full_key] = 0
                        return None
                    self.variants[full_key] = kernel
                kernel._init_handles()  # loads the binary: its register count
                fits = self.resident[full_key] = resident_programs(kernel, device.index)
        return fits or None

    def launch(
        self,
        device: torch.device,
        grid: tuple[int, int, int],
        key: Hashable,
        args: Sequence[Any],
        constexprs: dict[str, Any],
        options: dict[str, Any],
    ) -> Go | None:
        if INTERPRETING:
            try:
                self.fn[grid](*args, **constexprs, **options)
            except Exception as err:
                if _OUTSIDE_KERNEL in str(err):
                    raise RuntimeError(INTERPRETER_TOO_LATE) from err
                raise
            return None
        if device.type != "cuda":
            raise RuntimeError(
                f"kv-canary: the Triton kernels need a CUDA device, got buffers on {device}; on "
                "the CPU use the torch references (plan_reference, write_reference, "
                "verify_reference), or set TRITON_INTERPRET=1 before triton is first "
                "imported to run the kernels in Triton's interpreter"
            )
        index = device.index
        current = current_device()
        if current != index:
            if _capturing():
                # The launch would go to the buffers' device's own stream, outside the graph
                # (torch's ops on that device's tensors do the same); the graph would replay
                # without it.
                raise RuntimeError(
                    f"kv-canary: a CUDA graph is being captured on a stream of cuda:{current} "
                    f"but the buffers are on {device}, so the launch would run outside the "
                    f"graph; capture on a stream of {device}: torch.cuda.graph(g, "
                    f"stream=torch.cuda.Stream({device.index})) (torch.cuda.graph's default "
                    "capture stream belongs to the device that was current when the process "
                    "first used torch.cuda.graph)"
                )
            with torch.cuda.device(index):
                return self._launch(index, grid, key, args, constexprs, options)
        return self._launch(index, grid, key, args, constexprs, options)

    def launch_fixed(
        self,
        owner: object,
        device: torch.device,
        grid: tuple[int, int, int],
        key: Hashable,
        head_addresses: tuple[int, ...] | None,
        tail: tuple[Any, ...],
        build: Callable[
            [], tuple[tuple[Any, ...], tuple[Any, ...], dict[str, Any], dict[str, Any]]
        ],
    ) -> None:
        """:meth:`launch` with the runtime arguments ``(*head, *fixed, *tail)``, where
        ``fixed`` are tensors of ``owner`` (a ``PlanBuffers``, or None when there is no
        such object: a ``torch.compile`` copy) that every launch of this variant for
        ``owner`` passes alike, and ``head`` the caller's input tensors, whose addresses
        (read by the validation) are ``head_addresses``. ``build()`` returns ``(head,
        fixed, constexprs, options)``; it is called only when the launch is not repeated
        from the cache, after ``owner.check(views=True)`` (the views are then handed to
        Triton as tensors). After such a launch for ``owner`` its fixed tensors' addresses
        are kept, keyed by the arena's construction-time key: a repeated launch passes
        them and ``head_addresses``, and relies on the validation's ``owner.check()`` (the
        arena in place, the owner's) instead of building anything."""
        fast_key = (
            None if owner is None or head_addresses is None else (owner.arena._key, key)  # type: ignore[attr-defined]
        )
        if fast_key is not None:
            hit = self.fixed.get(fast_key)
            if hit is not None:
                index, go, addrs = hit
                if index == current_device():
                    go(grid[0], stream_of(index), *head_addresses, *addrs, *tail)  # type: ignore[misc]
                    return
        check_views(owner)
        head, fixed, constexprs, options = build()
        go = self.launch(device, grid, key, (*head, *fixed, *tail), constexprs, options)
        if go is not None and fast_key is not None:
            self.fixed.remember(fast_key, (device.index, go, addresses(fixed)))

    def _launch(
        self,
        index: int,
        grid: tuple[int, int, int],
        key: Hashable,
        args: Sequence[Any],
        constexprs: dict[str, Any],
        options: dict[str, Any],
    ) -> Go | None:
        assert grid[1] == 1 and grid[2] == 1, grid  # Go launches one axis
        full_key = (index, key)
        go = self.direct.get(full_key)
        if go is None:
            kernel = self.variants.get(full_key)
            if kernel is None:
                # First launch of this variant: Triton binds, compiles and launches it.
                self.variants[full_key] = self.fn[grid](*args, **constexprs, **options)
                return None
            go = self.direct[full_key] = direct(kernel, tuple(constexprs.values()))
        go(grid[0], stream_of(index), *args)
        return go


def resident_programs(kernel: Any, index: int) -> int:
    """Programs of compiled ``kernel`` that one multiprocessor of CUDA device ``index``
    holds at once: the occupancy calculator's rule (registers are given to a warp in
    units of 256) over the register file, the shared memory and the resident threads."""
    registers, shared_bytes, threads = device_limits(index)
    warps, shared = int(kernel.metadata.num_warps), int(kernel.metadata.shared)
    warp_regs = -(-int(kernel.n_regs) * 32 // 256) * 256
    by_regs = registers // max(warp_regs, 1) // warps
    by_shared = shared_bytes // shared if shared else by_regs
    return max(1, min(by_regs, by_shared, threads // (32 * warps)))


def device_limits(index: int) -> tuple[int, int, int]:
    """The registers, shared memory (bytes) and threads of one multiprocessor of CUDA
    device ``index`` (a block may use the whole register file on NVIDIA GPUs)."""
    props = driver.active.utils.get_device_properties(index)
    threads = torch.cuda.get_device_properties(index).max_threads_per_multi_processor
    return int(props["max_num_regs"]), int(props["max_shared_mem"]), int(threads)


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for a host grid size. ``triton.cdiv`` is a constexpr function whose
    call unwraps its arguments: about a microsecond per call on the host."""
    return -(-a // b)


def alignment_key(tensors: Sequence[torch.Tensor]) -> tuple[bool, ...]:
    """Per tensor argument, whether Triton may assume it 16-byte aligned."""
    return tuple(t.data_ptr() % 16 == 0 for t in tensors)

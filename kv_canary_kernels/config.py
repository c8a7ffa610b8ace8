"""The kernels' launch constants, one frozen :class:`LaunchConfig` replaced as a whole,
and the per-device settings derived from it (read once per device and config)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple, TypeVar

import attrs
import torch

from kv_canary_buffers.layout import ROW_HINT_STRIDE, SCAN_BLOCK
from kv_canary_buffers.layout_docs import markdown_table

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"
"""Read once at import, as Triton does: the interpreter can't be switched on later."""

_T = TypeVar("_T")


def _constant(default: _T, doc: str) -> _T:
    return attrs.field(default=default, metadata={"doc": doc})


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@attrs.frozen(kw_only=True)
class LaunchConfig:
    """Block sizes, warps and grid caps of every kernel: the defaults were chosen by the
    launch-constant sweeps on an H200 (``docs/performance.md``). Launchers read the active
    one (:func:`launch_config` swaps it); the fields are documented in ``docs/api.md``'s
    generated table."""

    small_row_tiles: tuple[int, ...] = _constant(
        (256, 512),
        "row tiles of the one-launch plan kernel below `SCAN_BLOCK`: a batch takes the "
        "smallest that holds it (`SCAN_BLOCK` past them), since each program scans its whole "
        "tile; one compiled variant each",
    )
    small_entry_block: int = _constant(256, "verify entries per block of the one-launch plan")
    small_entry_warps: int = _constant(8, "warps per program of the one-launch plan")
    small_programs_per_sm: int = _constant(
        2,
        "one-launch plan: at most this many entry programs per multiprocessor (one wave: "
        "each program first scans all the rows, so few that loop beat many that repeat it)",
    )
    entry_block: int = _constant(
        1024,
        "verify entries per block of the large path's entries kernel without a LUT (a "
        "multiple of `ROW_HINT_STRIDE`)",
    )
    entry_warps: int = _constant(8, "warps per program of that kernel")
    lut_entry_block: int = _constant(
        256, "the same with a LUT, where the random LUT reads favour smaller blocks"
    )
    lut_entry_warps: int = _constant(8, "warps per program of that kernel")
    entry_programs_per_sm: int = _constant(
        32, "large path: at most this many entry programs per multiprocessor, each looping"
    )
    row_window: int = _constant(
        32,
        "rows the large path loads at once from a block's first row; a block spanning more "
        "rows binary-searches memory",
    )
    entries_options: tuple[tuple[str, int], ...] = _constant(
        (), "extra Triton options of the plan's entry kernels (the sweep's `maxnreg`, `num_stages`)"
    )
    one_launch_max_rows: int = _constant(
        6144,
        "large path, eager launches: batches of `SCAN_BLOCK` to this many rows (excluded) "
        "take one launch (scanner and worker programs that wait for each other on the "
        "device); larger ones, and launches being captured in a CUDA graph, three. Past "
        "about 6000 rows (SWA off) the one launch's GPU time exceeds the three launches' "
        "host time on the H200 in its faster host mode (docs/performance.md)",
    )
    one_launch_programs_per_sm: int = _constant(
        4,
        "one-launch large path: at most this many worker programs per multiprocessor (each "
        "waits for the scan, then loops over entry blocks)",
    )
    one_launch_max_polls: int = _constant(
        1 << 20,
        "one-launch large path: polls after which a program stops waiting for another "
        "(`PLAN_SYNC_LOST`: two plans on the same buffers at once), so that no misuse hangs "
        "the GPU; 1 under the interpreter, which runs programs one after another",
    )
    scan_warps: int = _constant(8, "warps per program of the large path's two scan kernels")
    sum_chunk: int = _constant(1024, "block sums the offsets kernel reads at once")
    write_rows: int = _constant(32, "plan rows per write program, one per lane")
    write_warps: int = _constant(1, "warps per write program (`write_rows / 32`)")
    write_chain_tokens: int = _constant(
        16,
        "write: rows of more tokens than this have their hash chain walked by a chain program "
        "(which stores only the chain column); shorter rows' chains are walked with their "
        "records",
    )
    write_chain_programs: int = _constant(
        128,
        "write: at least this many chain programs (one warp each, rows strided across them), "
        "so that as many long rows each walk in a warp of their own",
    )
    write_chain_sleep_ns: int = _constant(
        0,
        "split write: nanoseconds the chain's walk sleeps after each token (`nanosleep`; 0: "
        "never, the walk at full speed). The chain runs beside the forward; sleeping leaves "
        "the issue slots of its multiprocessor to the forward's kernels there (on the H200 it did "
        "not lower a cuBLAS GEMM's slowdown beside the chain: docs/performance.md, Write)",
    )
    write_chain_maxnreg: int = _constant(
        0,
        "split write: registers per thread the chain is compiled to (ptxas `maxnreg`, the "
        "rest spilled; 0: the compiler's choice). Few enough let its one-warp program share a "
        "multiprocessor with a forward's kernel that leaves few registers free (on the H200, 32 "
        "and 40 did not lower a cuBLAS GEMM's slowdown beside the chain: docs/performance.md, "
        "Write)",
    )
    write_stamp_block: int = _constant(
        32,
        "split write: tokens per stamp program, one per lane (a power of two). One warp of "
        "32 rather than 4 of 128: on the H200 decode 4096 x 1 2.48 against 2.80 us, the "
        "prefill stamps at most 0.62 us slower (docs/performance.md, Write)",
    )
    write_stamp_warps: int = _constant(1, "warps per stamp program")
    verify_block: int = _constant(128, "verify entries per block, one per lane (a multiple of 32)")
    verify_warps: int = _constant(4, "warps per verify program")
    verify_programs_per_sm: int = _constant(
        16,
        "persistent verify grid: at most this many programs per multiprocessor, and no more "
        "than it holds at once (the compiled variant's registers), each looping",
    )
    real_kv_chunk: int = _constant(
        16,
        "words (8 bytes) of a slot that real-KV mode `ALL` reads at once per source: 8, 16 or 32",
    )
    interpreter_programs: int = _constant(
        2,
        "under the Triton interpreter (where each program costs host time): the stand-in "
        "multiprocessor count, and the plan's entry programs",
    )

    def __attrs_post_init__(self) -> None:
        ints = {
            f.name: getattr(self, f.name)
            for f in attrs.fields(LaunchConfig)
            if f.name not in ("small_row_tiles", "entries_options")
        }
        ints.update({f"small_row_tiles[{i}]": t for i, t in enumerate(self.small_row_tiles)})
        not_ints = [name for name, v in ints.items() if type(v) is not int]
        if not_ints:
            raise TypeError(
                f"kv-canary: invalid LaunchConfig: {', '.join(not_ints)} must be int, got "
                + ", ".join(type(ints[n]).__name__ for n in not_ints)
            )
        # tl.arange takes powers of two, and so does Triton's num_warps; the entries
        # kernels start a block at a row hint; the verify kernel trades values within
        # 32-lane groups; a grid cap of 0 would launch nothing (verify skipped silently).
        arange = (*self.small_row_tiles, self.small_entry_block, self.entry_block)
        arange += (self.lut_entry_block, self.row_window, self.sum_chunk, self.write_rows)
        arange += (self.verify_block, self.write_stamp_block)
        warps: tuple[int, ...] = (
            self.small_entry_warps,
            self.entry_warps,
            self.lut_entry_warps,
            self.scan_warps,
        )
        warps += (self.write_warps, self.verify_warps, self.write_stamp_warps)
        caps: tuple[int, ...] = (
            self.small_programs_per_sm,
            self.entry_programs_per_sm,
            self.verify_programs_per_sm,
            self.one_launch_programs_per_sm,
        )
        caps += (self.interpreter_programs, self.one_launch_max_polls, self.write_chain_programs)
        rules = {
            "a warp count is not a power of two": not all(map(_power_of_two, warps)),
            "a programs-per-SM cap, interpreter_programs, one_launch_max_polls or "
            "write_chain_programs is below 1": (min(caps) < 1),
            # 2**31: the side programs' loop over chained steps stays short by design.
            "write_chain_tokens must lie in [0, 2**31)": not 0 <= self.write_chain_tokens < 1 << 31,
            # nanosleep's operand is a u32; a sleep needs the GPU (no interpreter support)
            "write_chain_sleep_ns must lie in [0, 2**20], and be 0 under the interpreter": not (
                0 <= self.write_chain_sleep_ns <= 1 << 20
            )
            or (INTERPRETING and self.write_chain_sleep_ns != 0),
            "write_chain_maxnreg must be 0 or lie in [16, 255], and be 0 under the interpreter": (
                self.write_chain_maxnreg != 0
                and (not 16 <= self.write_chain_maxnreg <= 255 or INTERPRETING)
            ),
            "write_rows must be at least 32 * write_warps": self.write_rows < 32 * self.write_warps,
            "a block or tile is not a power of two": not all(map(_power_of_two, arange)),
            "small_row_tiles must ascend below SCAN_BLOCK": list(self.small_row_tiles)
            != sorted(t for t in set(self.small_row_tiles) if t < SCAN_BLOCK),
            "entry blocks must be multiples of ROW_HINT_STRIDE": self.entry_block % ROW_HINT_STRIDE
            or self.lut_entry_block % ROW_HINT_STRIDE,
            "verify_block must be a multiple of 32": self.verify_block % 32,
            "real_kv_chunk must be 8, 16 or 32": self.real_kv_chunk not in (8, 16, 32),
        }
        broken = [rule for rule, bad in rules.items() if bad]
        if broken:
            raise ValueError(f"kv-canary: invalid LaunchConfig: {'; '.join(broken)}")


class Active(NamedTuple):
    """The active config and its number, part of every compiled variant's key (equal
    configs share a number): a variant compiled under one config is never launched under
    another."""

    variant: int
    launch: LaunchConfig


DEFAULT_LAUNCH_CONFIG = LaunchConfig()
_variants: dict[LaunchConfig, int] = {DEFAULT_LAUNCH_CONFIG: 0}
active = Active(0, DEFAULT_LAUNCH_CONFIG)
"""What the launchers read: ``config.active`` (one attribute read) where they need no
device settings, :func:`device_config` where they do. Rebound, never mutated, by
:func:`launch_config`."""


def active_launch_config() -> LaunchConfig:
    """The config the launchers use now."""
    return active.launch


@contextlib.contextmanager
def launch_config(config: LaunchConfig | None = None, **changes: Any) -> Iterator[LaunchConfig]:
    """Launch with ``config`` (default: the active one) with ``changes`` inside the
    ``with`` block, then with the previous one again. For sweeps and tests; process-wide,
    not per thread: a module global is the cheapest thing a launch can read.

        with launch_config(entry_block=512): ...
    """
    new = attrs.evolve(active.launch if config is None else config, **changes)
    previous = active.launch
    _activate(new)
    try:
        yield new
    finally:
        _activate(previous)


_LOCK = threading.Lock()
"""Held while a config is activated or a device's settings derived: two threads must not
give two configs one variant number, nor cache settings of a config no longer active."""


def _activate(config: LaunchConfig) -> None:
    global active
    with _LOCK:
        active = Active(_variants.setdefault(config, len(_variants)), config)
        _devices.clear()


class DeviceConfig(NamedTuple):
    """What a launch on one device needs from the active :class:`LaunchConfig`."""

    launch: LaunchConfig
    variant: int
    """The config's number in compiled-variant keys."""
    multiprocessors: int
    """Streaming multiprocessors (a stand-in under the interpreter)."""
    plan_programs: int
    """Most entry programs of the plan's three-launch large path."""
    small_plan_programs: int
    """Most entry programs of the plan's small-batch path."""
    verify_programs: int
    """Most programs of the persistent verify grid."""
    one_launch_programs: int
    """Most worker programs of the one-launch large path."""
    use_pdl: bool
    """Programmatic dependent launch (sm_90+): the plan's offsets and entries kernels
    start while their predecessor finishes and wait for it on the device."""
    pdl_options: dict[str, bool]
    entries_options: dict[str, int]


class _DeviceConfigs(dict[torch.device, DeviceConfig]):
    """Each device's settings under the active config, derived at the first launch there
    (``_activate`` empties it)."""

    def __missing__(self, device: torch.device) -> DeviceConfig:
        with _LOCK:
            config = self[device] = _derive(device, active)
        return config


_devices = _DeviceConfigs()
device_config = _devices.__getitem__
"""``device_config(device)``: the device's :class:`DeviceConfig` under the active config,
or the ``kv-canary:`` ``RuntimeError`` where Triton cannot run. A dict lookup in C at every
launch (a miss derives the entry)."""


def _derive(device: torch.device, now: Active) -> DeviceConfig:
    variant, launch = now
    options = dict(launch.entries_options)
    if INTERPRETING:
        n = launch.interpreter_programs
        return DeviceConfig(
            launch, variant, n, n, n, n * launch.verify_programs_per_sm, n, False, {}, options
        )
    if device.type != "cuda":
        raise RuntimeError(
            f"kv-canary: the Triton kernels need a CUDA device, got {device}; on the CPU use "
            "the torch references (plan_reference, write_reference, verify_reference), or "
            "set TRITON_INTERPRET=1 before triton is first imported to run the kernels "
            "in Triton's interpreter"
        )
    props = torch.cuda.get_device_properties(device)
    sms = props.multi_processor_count
    use_pdl = props.major >= 9
    return DeviceConfig(
        launch,
        variant,
        sms,
        sms * launch.entry_programs_per_sm,
        sms * launch.small_programs_per_sm,
        sms * launch.verify_programs_per_sm,
        sms * launch.one_launch_programs_per_sm,
        use_pdl,
        {"launch_pdl": True} if use_pdl else {},
        options,
    )


def launch_config_table() -> str:
    """The Markdown table of docs/api.md: every field, its default and its meaning."""
    rows = [
        (f"`{f.name}`", f"`{f.default!r}`", f.metadata["doc"]) for f in attrs.fields(LaunchConfig)
    ]
    return markdown_table(("field", "default", "meaning"), rows)

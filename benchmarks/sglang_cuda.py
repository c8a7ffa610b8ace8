"""SGLang 0.5.23's kv-canary ops beside this project's: loading them and calling them on the
same inputs, for ``python -m benchmarks`` (its ``sglang_cuda`` column) and
``benchmarks/sglang/run_cuda_differential.py``.

- :func:`load_installed_sglang`: SGLang's three CUDA launchers from an installed wheel
  (``PYTHONPATH``), without SGLang's runtime; :func:`resolve` decides what the entry
  point's ``--sglang {auto,off,require}`` gets.
- :class:`SglangSide` and :class:`OurSide`: one store and plan of each, with the same
  methods (plan, write, verify, counters, rows, clear), so that one comparison serves both.
- :func:`plan_differences`, :func:`fill_and_compare`, :func:`write_and_compare`,
  :func:`verify_and_compare`: what must be equal before anything is timed: SGLang's plan
  fields against this project's, records byte for byte, the violation rows (SGLang's 8
  columns, as multisets: the row order of one call is unspecified on both sides) and the
  counters. Each returns the list of what differs (empty: equal).

SGLang's own limits (:func:`plan_limit`): its plan takes at most ``plan_max_bs`` rows (a
single-program scan) and its verify and write at most ``consts.MAX_REAL_KV_SOURCES``
real-KV sources; a case beyond them is not an error but a cell without a value.

Importing this module imports no Triton kernel of this project before it is used (the
entry point's ``--smoke`` chooses the interpreter first).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

I64, I32, U8 = torch.int64, torch.int32, torch.uint8
POISON = -7777
"""What SGLang's plan outputs hold before its plan runs: an output it does not write shows."""
FLIPPED = 64
"""Verified slots whose records are corrupted in the verify comparison."""


# --- SGLang's ops -----------------------------------------------------------------------------
@dataclass(frozen=True)
class SglangOps:
    """What is used of SGLang's kv-canary: its classes, its three launchers
    (``launch_canary_plan_kernels``, ``launch_canary_write_kernel``,
    ``launch_canary_verify_kernel``), or anything with their signatures (its torch
    references, in the CPU smoke tests), and its plan's row limit."""

    consts: Any
    VerifyPlan: Any
    WritePlan: Any
    VerifyOrWriteContext: Any
    RealKvSource: Any
    CanaryLaunchTag: Any
    plan: Callable[..., None]
    write: Callable[..., None]
    verify: Callable[..., None]
    plan_max_bs: int
    """``_PLAN_BS_BLOCK_SIZE``: the most rows SGLang's plan takes in one launch."""
    source: str = "SGLang 0.5.23 CUDA kernels"
    """What the ops are, for the report (the stand-ins say so)."""


class SglangUnavailable(RuntimeError):
    """SGLang's kv-canary ops cannot be loaded here (no wheel on the path, or its import
    failed)."""


INSTALL_HINT = (
    "install the wheels of scripts/download-sglang-wheels.sh with `pip install --no-index "
    "--no-deps --target DIR .whl/*.whl` and set PYTHONPATH=DIR:."
)


def _stub(name: str, path: Path | None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)] if path is not None else []
    return module


def load_installed_sglang() -> SglangOps:
    """SGLang's CUDA launchers from an installed wheel (``PYTHONPATH``), without running
    ``sglang/__init__.py`` (SGLang's whole runtime and its dependencies) or the kernel
    registry: the parent packages are stand-ins whose ``__path__`` is the wheel's, and
    ``sglang.srt.utils.common`` (imported by the JIT loader for two helpers) is replaced by
    those two helpers. Raises :class:`SglangUnavailable`."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SglangUnavailable(f"no sglang package on the path; {INSTALL_HINT}")
    base = Path(next(iter(spec.submodule_search_locations)))
    if not (base / "kernels" / "ops" / "kv_canary").is_dir():
        raise SglangUnavailable(f"{base} has no kernels/ops/kv_canary (SGLang 0.5.23's)")
    for name, path in {
        "sglang": base,
        "sglang.kernels": base / "kernels",
        "sglang.kernels.ops": base / "kernels" / "ops",
        "sglang.kernels.ops.kv_canary": base / "kernels" / "ops" / "kv_canary",
        "sglang.srt": base / "srt",
        "sglang.srt.utils": base / "srt" / "utils",
    }.items():
        sys.modules[name] = _stub(name, path)
    common = _stub("sglang.srt.utils.common", None)
    common.is_cuda = torch.cuda.is_available  # type: ignore[attr-defined]
    common.get_cuda_version = lambda: tuple(  # type: ignore[attr-defined]
        int(x) for x in (torch.version.cuda or "0.0").split(".")
    )
    sys.modules["sglang.srt.utils.common"] = common
    utils = _stub("sglang.utils", None)
    utils.is_in_ci = lambda: False  # type: ignore[attr-defined]
    sys.modules["sglang.utils"] = utils
    pkg = "sglang.kernels.ops.kv_canary"
    try:
        consts = importlib.import_module(f"{pkg}.consts")
        verify = importlib.import_module(f"{pkg}.verify")
        write = importlib.import_module(f"{pkg}.write")
        plan = importlib.import_module(f"{pkg}.plan.api")
        offsets = importlib.import_module(f"{pkg}.plan.offsets_kernel")
    except Exception as err:  # any import failure of SGLang's modules: not loadable here
        raise SglangUnavailable(f"importing {pkg} from {base} failed: {err!r}") from err
    return SglangOps(
        consts=consts,
        VerifyPlan=verify.VerifyPlan,
        WritePlan=write.WritePlan,
        VerifyOrWriteContext=verify.VerifyOrWriteContext,
        RealKvSource=verify.RealKvSource,
        CanaryLaunchTag=verify.CanaryLaunchTag,
        plan=plan.launch_canary_plan_kernels,
        write=write.launch_canary_write_kernel,
        verify=verify.launch_canary_verify_kernel,
        plan_max_bs=int(offsets._PLAN_BS_BLOCK_SIZE),
    )


SGLANG_MODES = ("auto", "off", "require")


def resolve(mode: str, device: str) -> tuple[SglangOps | None, str]:
    """The ops ``python -m benchmarks --sglang MODE`` runs, and a line saying why.

    ``off``: none. ``auto`` (the default): SGLang's CUDA kernels when the device is CUDA and
    :func:`load_installed_sglang` succeeds, otherwise none. ``require``: whatever
    :func:`load_installed_sglang` returns, on any device (the CPU smoke tests put SGLang's
    torch references there), or ``SystemExit`` with the reason."""
    if mode not in SGLANG_MODES:
        raise ValueError(f"kv-canary: --sglang must be one of {SGLANG_MODES}, got {mode!r}")
    if mode == "off":
        return None, "sglang_cuda: off (--sglang off)"
    if mode == "auto" and device != "cuda":
        return None, "sglang_cuda: off (SGLang's kernels need CUDA; --sglang require forces it)"
    try:
        ops = load_installed_sglang()
    except SglangUnavailable as err:
        if mode == "require":
            raise SystemExit(f"kv-canary: --sglang require: {err}") from err
        return None, f"sglang_cuda: off ({err})"
    return ops, f"sglang_cuda: {ops.source}"


def plan_limit(sg: SglangOps, bs: int) -> str | None:
    """Why SGLang's plan cannot run a batch of ``bs`` rows, or None when it can."""
    if bs > sg.plan_max_bs:
        return f"SGLang's plan takes at most {sg.plan_max_bs} rows (one-program scan)"
    return None


def sources_limit(sg: SglangOps, count: int) -> str | None:
    """Why SGLang's verify and write cannot take ``count`` real-KV sources, or None."""
    most = int(sg.consts.MAX_REAL_KV_SOURCES)
    if count > most:
        return f"SGLang's verify and write take at most {most} real-KV sources"
    return None


PLAN_DEFAULTS: dict[str, Any] = dict(
    swa_window_size=0,
    full_to_swa_index_mapping=None,
    req_to_verify_expected_tokens=None,
    req_to_verify_expected_tokens_valid_lens=None,
    kv_token_id_vs_position_offset=0,
)
"""SGLang's plan takes every argument by keyword, without defaults; this project's plan
has these defaults."""


# --- one side each ---------------------------------------------------------------------------
class SglangSide:
    """SGLang's plan (``VerifyPlan``, ``WritePlan``) and store (a ``canary_buf``, its ring
    and counters), the chain-position check on, for ``bs`` rows and ``verify_capacity``
    entries. ``real_kv``: this project's ``RealKV`` whose sources SGLang's
    ``RealKvSource`` objects describe (the same tensors), or None (mode NONE)."""

    def __init__(
        self,
        sg: SglangOps,
        *,
        bs: int,
        verify_capacity: int,
        device: str,
        num_slots: int = 1,
        real_kv: Any = None,
        launch_tag: int = 2,
        ring: int = 1024,
    ):
        self.sg = sg
        self.verify_plan = sg.VerifyPlan.allocate(verify_capacity=verify_capacity, device=device)
        self.write_plan = sg.WritePlan.allocate(write_req_capacity=bs, device=device)
        self.buf = torch.zeros(num_slots, 32, dtype=U8, device=device)
        self.ring = torch.zeros(ring, 8, dtype=I64, device=device)
        self.index = torch.zeros(1, dtype=I32, device=device)
        self.slot_runs = torch.zeros(1, dtype=I64, device=device)
        self.kernel_runs = torch.zeros(1, dtype=I64, device=device)
        self.chain = torch.ones(1, dtype=I32, device=device)
        sources: tuple[Any, ...] = ()
        mode = "NONE"
        if real_kv is not None:
            mode = real_kv.mode.name
            sources = tuple(
                sg.RealKvSource(
                    tensor=s.tensor,
                    page_size=s.page_size,
                    num_bytes_per_token=s.bytes_per_token,
                    read_bytes=s.read_bytes,
                )
                for s in real_kv.sources
            )
        self.context = sg.VerifyOrWriteContext(
            canary_buf=self.buf,
            kernel_kind=sg.CanaryLaunchTag(launch_tag),
            violation_ring=self.ring,
            violation_write_index=self.index,
            slot_run_counter=self.slot_runs,
            kernel_run_counter=self.kernel_runs,
            real_kv_sources=sources,
            real_kv_hash_mode=sg.consts.RealKvHashMode[mode],
            enable_chain_position_assert=self.chain,
        )
        self.poison_plan()

    def poison_plan(self) -> None:
        for t in (
            self.verify_plan.verify_slot_indices,
            self.verify_plan.verify_expected_tokens,
            self.verify_plan.verify_expected_positions,
            self.verify_plan.verify_prev_slot_indices,
            self.verify_plan.verify_num_valid,
            self.verify_plan.enable,
            self.write_plan.write_offsets,
            self.write_plan.write_seed_slot_indices,
            self.write_plan.write_num_valid_reqs,
        ):
            t.fill_(POISON)

    def plan(self, kw: dict[str, Any]) -> None:
        self.sg.plan(
            verify_plan_out=self.verify_plan,
            write_plan_out=self.write_plan,
            verify_capacity=int(self.verify_plan.verify_slot_indices.shape[0]),
            **{**PLAN_DEFAULTS, **kw},
        )

    def write(self, tokens: dict[str, torch.Tensor]) -> None:
        self.sg.write(
            context=self.context,
            plan=self.write_plan,
            enable_write_input_assert=False,
            expected_input_tokens=None,
            expected_input_positions=None,
            **tokens,
        )

    def verify(self) -> None:
        self.sg.verify(
            context=self.context, plan=self.verify_plan, check_verify_expected_token=True
        )

    def records(self) -> torch.Tensor:
        """The records as int64 ``[num_slots, 4]`` (a view)."""
        return self.buf.view(I64)

    def counters(self) -> tuple[int, int, int]:
        """(violations appended, kernel runs, slots processed)."""
        return int(self.index), int(self.kernel_runs), int(self.slot_runs)

    def rows(self) -> Counter[tuple[int, ...]]:
        n = min(int(self.index), self.ring.shape[0])
        return Counter(tuple(r) for r in self.ring[:n].tolist())

    def clear(self) -> None:
        self.ring.zero_()
        self.index.zero_()


class OurSide:
    """This project's ``CanaryStore`` and ``PlanBuffers`` with :class:`SglangSide`'s methods
    (``launch_plan``, ``launch_write``, ``launch_verify``)."""

    def __init__(self, store: Any, plan_buffers: Any, *, real_kv: Any = None, launch_tag: int = 2):
        self.store, self.plan_buffers = store, plan_buffers
        self.real_kv, self.launch_tag = real_kv, launch_tag

    @classmethod
    def allocate(
        cls, *, bs: int, verify_capacity: int, num_slots: int, device: str, **kw: Any
    ) -> OurSide:
        """Fresh buffers and a fresh store (the chain-position check on)."""
        from kv_canary_buffers import CanaryStore, PlanBuffers

        store = CanaryStore.allocate(num_slots=num_slots, violation_capacity=1024, device=device)
        store.enable_chain_position_check()
        buffers = PlanBuffers.allocate(
            write_req_capacity=bs, verify_capacity=verify_capacity, device=device
        )
        return cls(store, buffers, **kw)

    def plan(self, kw: dict[str, Any]) -> None:
        from kv_canary_kernels import launch_plan

        launch_plan(self.plan_buffers, **{k: v for k, v in kw.items() if v is not None})

    def write(self, tokens: dict[str, torch.Tensor]) -> None:
        from kv_canary_kernels import launch_write

        launch_write(
            self.store,
            self.plan_buffers,
            launch_tag=self.launch_tag,
            real_kv=self.real_kv,
            **tokens,
        )

    def verify(self) -> None:
        from kv_canary_kernels import launch_verify

        launch_verify(
            self.store, self.plan_buffers, launch_tag=self.launch_tag, real_kv=self.real_kv
        )

    def records(self) -> torch.Tensor:
        return self.store.records

    def counters(self) -> tuple[int, int, int]:
        s = self.store
        return int(s.violation_count), int(s.kernel_runs), int(s.slots_processed)

    def rows(self) -> Counter[tuple[int, ...]]:
        n = min(int(self.store.violation_count), self.store.violation_capacity)
        # SGLang's 8 columns (this project keeps more beside them).
        return Counter(tuple(r) for r in self.store.violations[:n, :8].tolist())

    def clear(self) -> None:
        self.store.take_violations()


# --- the comparisons ---------------------------------------------------------------------------
def plan_differences(buffers: Any, theirs: SglangSide, bs: int) -> list[str]:
    """SGLang's plan fields that differ from this project's ``PlanBuffers`` of the same
    batch: ``write_offsets``, the first ``bs`` seeds, both counts, ``enable`` and, when
    enabled, the first ``verify_num_valid`` entries. SGLang's plan has no
    ``row_req_pool_indices`` and no ``verify_offsets`` output (its offsets are scratch):
    those are this project's alone and are not compared here."""
    b, vp, wp = buffers, theirs.verify_plan, theirs.write_plan
    bad = []
    if not torch.equal(b.write_offsets, wp.write_offsets):
        bad.append("write_offsets")
    if not torch.equal(b.write_seed_slot_indices[:bs], wp.write_seed_slot_indices[:bs]):
        bad.append("write_seed_slot_indices")
    if int(b.write_num_valid_reqs) != int(wp.write_num_valid_reqs):
        bad.append("write_num_valid_reqs")
    if int(b.verify_num_valid) != int(vp.verify_num_valid):
        bad.append("verify_num_valid")
    if int(b.verify_enable) != int(vp.enable):
        bad.append("verify_enable")
    n = int(vp.verify_num_valid)
    if int(vp.enable) and not bad:
        for f in ("slot_indices", "expected_tokens", "expected_positions", "prev_slot_indices"):
            if not torch.equal(getattr(b, f"verify_{f}")[:n], getattr(vp, f"verify_{f}")[:n]):
                bad.append(f"verify_{f}")
    return bad


Side = OurSide | SglangSide


def _delta(side: Side, before: tuple[int, int, int]) -> tuple[int, ...]:
    return tuple(a - b for a, b in zip(side.counters(), before))


def _run_both(ours: Side, theirs: Side, call: Callable[[Side], None], what: str) -> list[str]:
    """``call`` on each side; the counters' changes must agree, with no violation."""
    before = ours.counters(), theirs.counters()
    for side in (ours, theirs):
        call(side)
    got = _delta(ours, before[0]), _delta(theirs, before[1])
    if got[0] != got[1] or got[0][0] or got[1][0]:
        return [f"{what} counters (violations, runs, slots) {got[0]} vs SGLang {got[1]}"]
    return []


def fill_and_compare(
    ours: Side, theirs: Side, fill_kwargs: dict[str, Any], fill_inputs: dict[str, Any], bs: int
) -> list[str]:
    """The prefill of every prefix, each side from its own plan: the plans, the records
    byte for byte and the counters. ``theirs`` may be either kind (SGLang's is the usual)."""
    bad = []
    for side in (ours, theirs):
        side.plan(fill_kwargs)
    if isinstance(theirs, SglangSide):
        assert isinstance(ours, OurSide)
        bad += [f"fill plan: {f}" for f in plan_differences(ours.plan_buffers, theirs, bs)]
    bad += _run_both(ours, theirs, lambda s: s.write(fill_inputs), "fill")
    if not torch.equal(ours.records(), theirs.records()):
        bad.append("fill records")
    return bad


def sglang_beside(
    sg: SglangOps, ours: OurSide, world: Any, *, fill: bool
) -> tuple[SglangSide, list[str]]:
    """SGLang's side of a case beside ``ours``: a fresh :class:`SglangSide` of the same
    sizes, launch tag, ring and real-KV sources; then, when ``fill``, the prefill of every
    prefix on each side from its own plan (:func:`fill_and_compare`), and the step's plan
    (:func:`plan_and_compare`). ``world``: the case (``fill_kwargs``, ``fill_inputs``,
    ``plan_kwargs``, ``bs``, as both benchmarks' worlds have them). Returns SGLang's side and
    what differs."""
    buffers, store = ours.plan_buffers, ours.store
    theirs = SglangSide(
        sg,
        bs=buffers.write_req_capacity,
        verify_capacity=buffers.verify_capacity,
        device=str(store.device),
        num_slots=store.num_slots,
        real_kv=ours.real_kv,
        launch_tag=ours.launch_tag,
        ring=store.violation_capacity,
    )
    bad = []
    if fill:
        bad += fill_and_compare(ours, theirs, world.fill_kwargs, world.fill_inputs, world.bs)
    bad += plan_and_compare(ours, theirs, world.plan_kwargs, world.bs)
    return theirs, bad


def plan_and_compare(ours: OurSide, theirs: SglangSide, kw: dict[str, Any], bs: int) -> list[str]:
    """The step's plan on each side, SGLang's poisoned first: the fields that differ."""
    theirs.poison_plan()
    for side in (ours, theirs):
        side.plan(kw)
    return [f"plan: {f}" for f in plan_differences(ours.plan_buffers, theirs, bs)]


def write_and_compare(ours: Side, theirs: Side, step_inputs: dict[str, Any]) -> list[str]:
    """The step's write on each side: records byte for byte, counters, no violation."""
    bad = _run_both(ours, theirs, lambda s: s.write(step_inputs), "write")
    if not torch.equal(ours.records(), theirs.records()):
        bad.append("write records")
    return bad


def verify_and_compare(ours: OurSide, theirs: Side, seed: int) -> list[str]:
    """The step's verify on each side: nothing reported on the clean records, the same
    counters; then the positions of up to :data:`FLIPPED` verified slots flipped in both
    stores: the same violation rows (as multisets). The clean records are put back and
    both rings cleared afterwards."""
    bad = _run_both(ours, theirs, lambda s: s.verify(), "verify")
    clean = ours.records().clone()
    n = int(ours.plan_buffers.verify_num_valid)
    device = clean.device
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(n, generator=g)[:FLIPPED].to(device)
    slots = ours.plan_buffers.verify_slot_indices[pick].unique()
    flip = torch.zeros_like(clean)
    flip[slots, 1] = 1 << 20
    for side in (ours, theirs):
        side.records().copy_(clean ^ flip)
        side.clear()
        side.verify()
    rows, their_rows = ours.rows(), theirs.rows()
    if rows != their_rows or not rows:
        bad.append(
            f"corrupted verify: {sum(rows.values())} rows vs SGLang {sum(their_rows.values())}"
            + ("" if rows else " (none found)")
        )
    for side in (ours, theirs):
        side.clear()
        side.records().copy_(clean)
    return bad

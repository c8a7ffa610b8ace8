"""What share of a transformers continuous-batching step does the canary take on a
Llama-shaped model, beside what the engine's own step costs?

    python -m benchmarks.probes.engine_share                    # CUDA: the 1B and 8B shapes
    python -m benchmarks.probes.engine_share --shapes 8b --pairs 2 --requests 64
    python -m benchmarks.probes.engine_share --profile 20       # + where the canary's host goes
    python -m benchmarks.probes.engine_share --compare-split    # split write against one write
    python -m benchmarks.probes.engine_share --split-write off  # the write in one call only
    python -m benchmarks.probes.engine_share --smoke            # CPU: a tiny Llama, interpreter

For each shape, in one process: a Llama of that shape with random weights (no hub: a
``LlamaConfig`` of Llama-3.2-1B's or Llama-3.1-8B's shape, bf16, built on the device) runs
``--requests`` prompts of ``--prompt`` random tokens, ``--generate`` greedy tokens each,
through ``init_continuous_batching`` (eager, synchronous: no CUDA graphs, no compile, no
async batching; ``paged|sdpa`` attention; ``--attn flash`` lets transformers switch to
flash attention where it is installed, and with it to its decode fast path, whose
``block_table`` the adapter's tests have not exercised), driven as
``tests/engines/test_transformers.py`` drives it, first without the canary, then with it
(``kv_canary_engines.transformers.install``: ``CanaryConfig(timing=True,
real_kv=PARTIAL, tail=True, stages="kernels", verify_every=..., poll_every=...,
split_write=...)``, ``--verify-every`` 1 by default: HEAD and TAIL, layers 0 and the
last hashed), then without again (``--pairs N``: N such pairs after the first run), so
that both see the same machine state. A short warm-up run of each
(``--warmup-generate`` tokens) comes first: the Triton kernels compile there.

Per step kind (``prefill``: a step where some row writes more than one token, mixed steps
included; ``decode``: every row writes one), medians over the steps of every run of a
mode, the first step of each run left out (the runtime is built there):

- ``engine step ms``: the engine's own step without the canary, host wall time from one
  forward's start to the next (scheduling, inputs, forward, sampling, the sync that reads
  the tokens back); ``forward GPU ms``: the model's forward alone (CUDA events around it);
- ``canary host us`` and ``canary GPU us``: ``begin_step`` plus ``end_step`` from
  ``runtime.timing`` (``kv_canary_engines.timing.StepTiming``: host seconds, and CUDA
  events at their start and end: the canary's launches and any gap the GPU waits for the
  host), and each of the two apart (``begin host us``, ``end host us``, ``begin GPU us``,
  ``end GPU us``: before the forward the GPU waits for the host's launches, so there the
  GPU time follows the host's; after it the launches queue behind the forward);
  ``chain GPU us``: with the split write on CUDA, its chains on the side stream, beside
  the forward (off the step's critical path: not in the canary's GPU time or share);
  ``share``: the canary's GPU time over the step's (before + forward + after), per step
  as ``StepTiming.summary()`` computes it (``mean share``: its mean over the steps, which
  with ``--verify-every N`` weighs the verify steps in);
- ``step ms with``, ``delta``: the engine's step with the canary against without, end to
  end (the adapter's own hook work around ``begin_step`` included; the poll, a sync every
  ``--poll-every`` steps, falls mostly outside a median: each run's wall time is printed).

``--split-write {auto,on,off}``: ``CanaryConfig(split_write=None, True, False)``; ``auto``
(the probe's default and the runtime's) is the split write on CUDA with the kernels (each
store's chain in ``begin_step`` on the runtime's side stream, beside the forward; its stamp
in ``end_step``). ``--compare-split``: both in one process, each pair of runs becoming
(split, off, one write, off), so the table has a row per step kind and write (the
``write`` column: ``split`` or ``one``) against the same runs without the canary: the
end-to-end effect of the split write on prefill steps (``end GPU us``, ``step ms with``).

``--overlap-begin {auto,on,off}``: ``CanaryConfig(overlap_begin=None, True, False)``
(``auto``, the runtime's default: the prefill steps only; ``on``: every step):
``begin_step``'s launches from ``end_step`` on the side stream, after an event recorded
before the forward, so that their host time runs beside the forward's GPU time (the
``write`` column gains ``+overlap`` on the step kinds that overlapped).
``--compare-overlap``: every step overlapped against the begin before the forward, in one
process, each pair of runs becoming (overlapped, off, before the forward, off).

``--phases``: after a shape's measured runs, one more run with the canary whose runtime
methods, launcher halves and adapter hooks are timed by ``perf_counter`` wrappers
(:mod:`benchmarks.phases`): host us a step per phase, per step kind.

``--profile N``: after a shape's measured runs, one more run with the canary (at most 16
generated tokens) whose ``begin_step`` and ``end_step`` run under cProfile and a
``torch.profiler`` each: cProfile's top N functions by own time, and per method the torch
ops and CUDA runtime calls made inside it (calls and self host us per step), with every
call that waits for the device or the driver named (``cudaStreamSynchronize``,
``cudaMemcpy``, ``aten::_local_scalar_dense``, ``cudaMalloc``, ...; ``end_step``'s polls
read back by design). The table's figures come from the runs before it, unprofiled.

Target (issue 25): the share at most 1% of decode steps and of prefill steps. Also
printed: whether every request generated the same tokens with and without the canary (and
in the two runs without it), and the canary's violations over the run (a poll after the
run's last step included; 0 expected), with its health and status words. A markdown table
on stdout (kept in ``benchmarks/out/engine_share-<UTC time>.txt``) and a CSV,
``benchmarks/out/engine_share-<device>-<UTC time>.csv``, one row per shape and kind.

Needs transformers 5.17 or 5.19 (the adapter's ``SUPPORTED_VERSIONS``; the engines'
environment here, ``scripts/setup-engines.sh``). ``--smoke`` runs the same code on the CPU
(a 2-layer Llama, hidden 128, head_dim 32, vocab 512, fp32, a few steps) with the kernels
under ``TRITON_INTERPRET=1`` (set when the flag is given): the figures mean nothing there
and there are no GPU columns.

Last answer (H200, 2026-12-04, transformers 5.17, the defaults: prefill steps split and
overlapped, decode steps one write and the begin before the forward; ``--shapes 1b,8b
--pairs 2``, three calls at c207d5b, 8dbb1e6 and a135c58): met on every row in each. The
canary's share of a step, 1B / 8B: decode 0.99%, 0.98% and 0.98% / 0.60%, 0.61% and 0.66%
(engine steps of 57 to 111 ms, 13 rows), prefill 0.05% / 0.03% (22 rows, 2048 tokens).
The 1B rows have no margin: its decode read 0.98 to 1.08% over the six calls since
2026-12-03, and its prefill follows the host's state (1.23% in one of them: the GPU
finishes the forward before the canary's host work after it when the host runs slow). On
a decode step the canary's 0.5 to 0.9 ms of host time is GPU time the host-bound forward waits for
(``--phases`` says where it goes). Tokens identical with and without the canary, 0
violations. The table is in docs/performance.md ("Inside an engine").
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import gc
import inspect
import io
import math
import os
import pstats
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

if __name__ == "__main__" and "--smoke" in sys.argv:  # before Triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import attrs
import torch

from benchmarks.harness import OUT, Recorder, fmt, logged, markdown_table, utc_stamp

SHAPES: dict[str, dict[str, Any]] = {
    # Llama-3.2-1B (tied embeddings, as it has)
    "1b": dict(
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=8192,
        vocab_size=128256,
        tie_word_embeddings=True,
    ),
    # Llama-3.1-8B
    "8b": dict(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        tie_word_embeddings=False,
    ),
    # the smoke's (tests/engines/test_transformers.py's model)
    "tiny": dict(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,
        vocab_size=512,
        tie_word_embeddings=False,
    ),
}

KINDS = ("prefill", "decode")

SPLIT_WRITE: dict[str, bool | None] = {"auto": None, "on": True, "off": False}
"""``--split-write``'s values: ``CanaryConfig(split_write=...)``."""

COLUMNS = (
    ("shape", "shape"),
    ("kind", "kind"),
    ("write", "write"),
    ("steps", "steps off/on"),
    ("rows", "rows"),
    ("tokens", "tokens"),
    ("engine_step_ms", "engine step ms"),
    ("forward_gpu_ms", "forward GPU ms"),
    ("canary_host_us", "canary host us"),
    ("begin_host_us", "begin host us"),
    ("end_host_us", "end host us"),
    ("canary_gpu_us", "canary GPU us"),
    ("begin_gpu_us", "begin GPU us"),
    ("end_gpu_us", "end GPU us"),
    ("chain_gpu_us", "chain GPU us"),
    ("share", "share"),
    ("mean_share", "mean share"),
    ("step_with_ms", "step ms with"),
    ("delta_ms", "delta ms"),
    ("delta", "delta"),
)
"""The table's columns: (the CSV's name, the table's header). The CSV adds the shape's
checks, the run's settings and its metadata after them."""


# --- one run ---------------------------------------------------------------------------------
@attrs.define
class Step:
    """One forward of the engine as the probe's outer hooks saw it."""

    rows: int
    tokens: int
    prefill: bool
    start: float
    end: float = 0.0
    events: list[Any] = attrs.Factory(list)
    fast_path: bool = False
    """The forward had a ``block_table`` (flash attention's decode fast path)."""
    split: bool = False
    """With the canary: the step's writes ran split (``runtime.split_steps`` grew)."""
    overlapped: bool = False
    """With the canary: its ``begin_step`` work ran from ``end_step``
    (``runtime.overlapped_steps`` grew)."""
    _counts: tuple[int, int] = (0, 0)

    @property
    def kind(self) -> str:
        return "prefill" if self.prefill else "decode"


class StepProbe:
    """Forward hooks around everything else on the model: a pre-hook put first (before the
    canary's) and a forward hook added last (after the canary's), recording each
    continuous-batching forward of ``manager`` (warm-up forwards of fake requests skipped,
    as the adapter skips them): its batch, host times and, on CUDA, events on the
    forward's stream."""

    def __init__(self, model: Any, manager: Any) -> None:
        self.manager = manager
        self.steps: list[Step] = []
        self._open: Step | None = None
        self._cuda = next(model.parameters()).device.type == "cuda"
        self._pre = model.register_forward_pre_hook(self._before, with_kwargs=True, prepend=True)
        self._post: Any = None
        self._model = model
        self.canary: Any = None
        """The installed canary, whose runtime's counts say what each step ran."""

    def _counts(self) -> tuple[int, int]:
        runtime = None if self.canary is None else self.canary.runtime
        if runtime is None:  # (made in the canary's hook of the first step)
            return (0, 0)
        return (runtime.split_steps, runtime.overlapped_steps)

    def attach_after(self) -> None:
        """The forward hook, registered after the canary's (hooks run in their order)."""
        self._post = self._model.register_forward_hook(self._after, with_kwargs=True)

    def remove(self) -> None:
        self._pre.remove()
        if self._post is not None:
            self._post.remove()

    def _event(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _before(self, _module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        bp = self.manager.batch_processor
        cache = kwargs.get("cache")
        if cache is None or bp is None or bp.cache is not cache:
            return
        batch = bp.inputs_and_outputs.requests_in_batch
        if any(str(fs.state.request_id).startswith("__warmup_") for fs in batch):
            return
        q = [int(fs.query_length) for fs in batch]
        step = Step(
            rows=len(q),
            tokens=sum(q),
            prefill=any(n > 1 for n in q),
            start=time.perf_counter(),
            fast_path=kwargs.get("block_table") is not None,
        )
        step._counts = self._counts()
        if self._cuda:
            step.events.append(self._event())
        self._open = step

    def _after(self, _module: Any, _args: Any, _kwargs: Any, _output: Any) -> None:
        step, self._open = self._open, None
        if step is None:
            return
        if self._cuda:
            step.events.append(self._event())
        step.end = time.perf_counter()
        split, overlapped = self._counts()
        step.split, step.overlapped = split > step._counts[0], overlapped > step._counts[1]
        self.steps.append(step)


class StepCost(NamedTuple):
    """The canary's cost in one step (``runtime.timing``): host and GPU microseconds of
    ``begin_step`` + ``end_step`` and of each, and its share of the step's GPU time."""

    host_us: float
    gpu_us: float | None
    share: float | None
    begin_host_us: float
    end_host_us: float
    begin_gpu_us: float | None = None
    end_gpu_us: float | None = None
    chain_gpu_us: float | None = None
    """The split write's chains on the side stream, beside the forward (not in the share)."""


@attrs.define
class Run:
    """What one generation gave: the tokens per prompt, the steps, and with the canary its
    per-step timing and what its polls reported."""

    canary: bool
    tokens: list[list[int]]
    steps: list[Step]
    wall_s: float
    attn: str
    timing: list[StepCost] = attrs.Factory(list)
    """Per step: the canary's host and GPU (None off CUDA) us, and its share."""
    violations: int = 0
    flags: bool = False
    executing: bool = True
    polls: int = 0
    slot0_steps: int = 0
    runtime_steps: int = 0
    split_write: bool | None = None
    """With the canary: whether its runtime ran the split write (``runtime.split_write``)."""
    overlap_begin: bool | None = None
    """With the canary: whether ``begin_step``'s launches ran from ``end_step``
    (``runtime.overlap_begin``)."""

    def period_ms(self, i: int) -> float | None:
        """Host ms from step ``i``'s start to the next step's (None for the last)."""
        if i + 1 >= len(self.steps):
            return None
        return 1e3 * (self.steps[i + 1].start - self.steps[i].start)

    def forward_gpu_ms(self, i: int) -> float | None:
        ev = self.steps[i].events
        return ev[0].elapsed_time(ev[1]) if len(ev) == 2 else None


def _cb_config(args: argparse.Namespace) -> Any:
    """Eager and synchronous, sized for the workload; 5.17 calls the page size
    ``block_size`` and has no ``auto_switch_to_flash`` (the model's attention chooses)."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    params = inspect.signature(ContinuousBatchingConfig).parameters
    per_request = math.ceil((args.prompt + args.generate) / args.page_size)
    kwargs: dict[str, Any] = {
        ("page_size" if "page_size" in params else "block_size"): args.page_size,
        "num_blocks": args.requests * per_request + 8,
        "max_batch_tokens": args.max_batch_tokens,
        "max_requests_per_batch": args.requests,
        "use_cuda_graph": False,
        "use_async_batching": False,
    }
    if "auto_switch_to_flash" in params:
        kwargs["auto_switch_to_flash"] = args.attn == "flash"
    return ContinuousBatchingConfig(**kwargs)


def _set_attention(model: Any, attn: str) -> None:
    """``paged|sdpa`` on 5.17 (its manager would switch plain ``sdpa`` to flash attention
    where flash is installed); 5.19 takes ``sdpa`` and ``auto_switch_to_flash``."""
    import transformers

    if attn == "sdpa" and transformers.__version__.startswith("5.17."):
        model.set_attn_implementation("paged|sdpa")
    else:
        model.set_attn_implementation("sdpa")


def generate(
    model: Any,
    prompts: list[list[int]],
    args: argparse.Namespace,
    *,
    canary: bool,
    max_new: int,
    split_write: bool | None = None,
    overlap_begin: bool | None = False,
) -> Run:
    """One generation of ``prompts`` on a fresh manager (5.17 cannot reuse one across
    sessions), with the canary installed when ``canary``."""
    from transformers import GenerationConfig

    from kv_canary_buffers import RealKVMode
    from kv_canary_engines import CanaryConfig
    from kv_canary_engines.transformers import install

    _set_attention(model, args.attn)
    gen = GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    manager = model.init_continuous_batching(
        generation_config=gen, continuous_batching_config=_cb_config(args)
    )
    probe = StepProbe(model, manager)
    installed = None
    try:
        if canary:
            config = CanaryConfig(
                timing=True,
                real_kv=RealKVMode.PARTIAL,
                tail=True,
                stages=args.stages,
                verify_every=args.verify_every,
                poll_every=args.poll_every,
                sweep_every=args.sweep_every,
                split_write=split_write,
                overlap_begin=overlap_begin,
            )
            installed = install(model, manager, config)
            probe.canary = installed
        probe.attach_after()
        t0 = time.perf_counter()
        manager.start()
        tokens = _drive(manager, prompts, max_new)
        manager.stop(block=True)
        wall = time.perf_counter() - t0
        run = Run(
            canary=canary,
            tokens=tokens,
            steps=probe.steps,
            wall_s=wall,
            attn=str(model.config._attn_implementation),
        )
        if installed is not None:
            _canary_results(run, installed)
        return run
    finally:
        probe.remove()
        if installed is not None:
            installed.remove()
        if manager.is_running():
            manager.stop(block=True)
        manager.destroy()
        if hasattr(model, "_cached_continuous_batching_manager"):
            del model._cached_continuous_batching_manager


def _drive(manager: Any, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """Submit ``prompts`` to the started manager and wait for every one (10 minutes at
    most); the generated tokens in prompt order."""
    ids = manager.add_requests(inputs=prompts, max_new_tokens=max_new)
    done: dict[str, list[int]] = {}
    deadline = time.monotonic() + 600
    while len(done) < len(ids):
        if time.monotonic() > deadline:
            raise RuntimeError("kv-canary: engine_share: the engine did not finish in 10 minutes")
        if not manager.is_running():
            raise RuntimeError(
                f"kv-canary: engine_share: the generation loop stopped with "
                f"{len(ids) - len(done)} of {len(ids)} requests unfinished"
            )
        result = manager.get_result(timeout=0.5)
        if result is not None and result.is_finished():
            if getattr(result, "error", None) is not None:  # a forward (or a hook) raised
                raise RuntimeError(
                    f"kv-canary: engine_share: request {result.request_id} failed: {result.error}"
                )
            done[result.request_id] = list(result.generated_tokens)
    return [done[i] for i in ids]


def _canary_results(run: Run, canary: Any) -> None:
    """The canary's per-step timing, aligned with the probe's steps, and what it found
    (the polls during the run and one after its last step)."""
    runtime = canary.runtime
    if runtime is None:
        raise RuntimeError("kv-canary: engine_share: the canary never ran (no forward seen)")
    reports = list(canary.reports) + [runtime.poll()]
    timing = runtime.timing
    pre_post = list(zip(timing.host_pre_s, timing.host_post_s))
    host = [1e6 * (a + b) for a, b in pre_post]
    gpu = timing.gpu_ms()
    chains = timing.chain_gpu_ms_by_step()  # None on a step without chains
    if len(host) != len(run.steps) or (gpu and len(gpu) != len(run.steps)):
        raise RuntimeError(
            f"kv-canary: engine_share: the canary timed {len(host)} steps (GPU {len(gpu)}), "
            f"the probe saw {len(run.steps)}"
        )
    for i, (h, (a, b)) in enumerate(zip(host, pre_post)):
        if gpu:
            pre, fwd, post = gpu[i]
            total = pre + fwd + post
            share = (pre + post) / total if total else None
            ms = chains[i] if i < len(chains) else None
            chain = None if ms is None else 1e3 * ms
            run.timing.append(
                StepCost(
                    h, 1e3 * (pre + post), share, 1e6 * a, 1e6 * b, 1e3 * pre, 1e3 * post, chain
                )
            )
        else:
            run.timing.append(StepCost(h, None, None, 1e6 * a, 1e6 * b))
    run.violations = sum(len(r.violations) + r.dropped for r in reports)
    run.flags = any(r.flags for r in reports)
    run.executing = all(r.health.executing for r in reports)
    run.polls = len(reports)
    run.slot0_steps = canary.slot0_steps
    run.runtime_steps = runtime.stats.steps
    run.split_write = runtime.split_write
    run.overlap_begin = runtime.overlap_begin


# --- one shape -------------------------------------------------------------------------------
def build_model(shape: str, device: torch.device, dtype: torch.dtype) -> tuple[Any, float]:
    """A Llama of ``shape`` with random weights, built on ``device`` in ``dtype``; the
    seconds it took."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **SHAPES[shape],
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
    )
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return model, time.perf_counter() - t0


def make_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (n, length), generator=gen).tolist()


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def summarize(shape: str, offs: list[Run], ons: list[Run]) -> list[dict[str, Any]]:
    """One row per step kind (:data:`COLUMNS`' names): medians over every run's steps,
    each run's first step left out. ``ons`` are runs of one write mode (``write``:
    per step kind, what the runtime ran there: ``split``, ``one``, ``mixed`` when the
    steps differ, ``n/a`` without the canary, and ``+overlap`` (``+some overlap``) where
    the steps' ``begin_step`` work ran from ``end_step``; decode steps run one write
    before the forward under the defaults)."""
    rows = []
    for kind in KINDS:

        def pick(runs: list[Run]) -> list[tuple[Run, int]]:
            return [(r, i) for r in runs for i, s in enumerate(r.steps) if i and s.kind == kind]

        off, on = pick(offs), pick(ons)
        if not off and not on:
            continue
        # what the runtime ran on these steps (its counts): with the defaults only the
        # steps with a row of split_from_tokens tokens split and overlap (decode: none)
        split = {r.steps[i].split for r, i in on}
        overlapped = {r.steps[i].overlapped for r, i in on}
        label = {frozenset([True]): "split", frozenset([False]): "one"}.get(
            frozenset(split), "mixed" if split else "n/a"
        )
        label += {frozenset([True]): "+overlap", frozenset([True, False]): "+some overlap"}.get(
            frozenset(overlapped), ""
        )
        step_off = _median([r.period_ms(i) for r, i in off])
        step_on = _median([r.period_ms(i) for r, i in on])
        delta = None if step_off is None or step_on is None else step_on - step_off
        rows.append(
            {
                "shape": shape,
                "kind": kind,
                "write": label,
                "steps": f"{len(off)}/{len(on)}",
                "rows": _median([r.steps[i].rows for r, i in off + on]),
                "tokens": _median([r.steps[i].tokens for r, i in off + on]),
                "engine_step_ms": step_off,
                "forward_gpu_ms": _median([r.forward_gpu_ms(i) for r, i in off]),
                "canary_host_us": _median([r.timing[i].host_us for r, i in on]),
                "begin_host_us": _median([r.timing[i].begin_host_us for r, i in on]),
                "end_host_us": _median([r.timing[i].end_host_us for r, i in on]),
                "canary_gpu_us": _median([r.timing[i].gpu_us for r, i in on]),
                "begin_gpu_us": _median([r.timing[i].begin_gpu_us for r, i in on]),
                "end_gpu_us": _median([r.timing[i].end_gpu_us for r, i in on]),
                "chain_gpu_us": _median([r.timing[i].chain_gpu_us for r, i in on]),
                "share": _median([r.timing[i].share for r, i in on]),
                # (with --verify-every N > 1 the median is a step without the verifies)
                "mean_share": _mean([r.timing[i].share for r, i in on]),
                "step_with_ms": step_on,
                "delta_ms": delta,
                "delta": None if delta is None or not step_off else delta / step_off,
            }
        )
    return rows


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "n/a"
    if column in ("share", "mean_share", "delta"):
        return f"{100 * value:.2f}%"
    if column in ("rows", "tokens"):
        return f"{value:g}"
    if isinstance(value, float):
        return fmt(value, 2 if column.endswith("_ms") else 1)
    return str(value)


@attrs.frozen
class Checks:
    """A shape's checks: the canary changed no generated token, and found nothing."""

    identical: bool
    """Every request generated the same tokens in every run with the canary as in the first
    run without it."""
    lines: tuple[str, ...]
    violations: int
    clean: bool
    """No violation row, no status bit, the health check executing, in every canary run."""

    @property
    def ok(self) -> bool:
        return self.identical and self.clean


def check(shape: str, offs: list[Run], ons: list[Run]) -> Checks:
    """The tokens-identical and the violations lines of a shape."""
    base = offs[0].tokens
    n = len(base)
    same_on = [sum(a == b for a, b in zip(base, r.tokens)) for r in ons]
    same_off = [sum(a == b for a, b in zip(base, r.tokens)) for r in offs[1:]]
    identical = bool(ons) and all(s == n and len(r.tokens) == n for s, r in zip(same_on, ons))
    lines = [
        f"{shape}: tokens identical with and without the canary: "
        f"{'yes' if identical else 'NO'} ({', '.join(f'{s}/{n}' for s in same_on)} requests); "
        f"between the runs without it: "
        f"{'yes' if all(s == n for s in same_off) else 'NO'} "
        f"({', '.join(f'{s}/{n}' for s in same_off) or 'one run'})"
    ]
    violations = sum(r.violations for r in ons)
    flags = any(r.flags for r in ons)
    executing = all(r.executing for r in ons)
    slot0 = sum(r.slot0_steps for r in ons)
    lines.append(
        f"{shape}: canary violations: {violations} over {sum(r.runtime_steps for r in ons)} "
        f"steps ({sum(r.polls for r in ons)} polls); status words "
        f"{'SET' if flags else 'clean'}; health {'executing' if executing else 'NOT EXECUTING'}"
        + (f"; slot 0 unchecked in {slot0} steps (5.17: block 0 is real)" if slot0 else "")
    )
    runs = _in_order(offs, ons)
    walls = " / ".join(f"{_label(r)} {r.wall_s:.2f}" for r in runs)
    fast = sum(s.fast_path for r in runs for s in r.steps)
    lines.append(
        f"{shape}: run wall s {walls}; steps {' / '.join(str(len(r.steps)) for r in runs)}; "
        f"attention {offs[0].attn}"
        + (f"; decode fast path (block_table) in {fast} steps" if fast else "")
    )
    clean = bool(ons) and violations == 0 and not flags and executing
    return Checks(identical=identical, lines=tuple(lines), violations=violations, clean=clean)


def _label(run: Run) -> str:
    if not run.canary:
        return "off"
    label = {True: "on (split", False: "on (one write"}.get(run.split_write, "on (")  # type: ignore[arg-type]
    return label + (", overlapped)" if run.overlap_begin else ")")


def _in_order(offs: list[Run], ons: list[Run]) -> list[Run]:
    out = offs[:1]
    for on, off in zip(ons, offs[1:]):
        out += [on, off]
    return out


def run_shape(
    shape: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype
) -> tuple[list[dict[str, Any]], Checks]:
    """The warm-up, then off, (on, off) x ``--pairs`` (with ``--compare-split``, (split,
    off, one write, off) x ``--pairs``); the table's rows and the checks."""
    model, init_s = build_model(shape, device, dtype)
    params = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"{shape}: {params:.2f}B parameters, {dtype}, built on {device} in {init_s:.1f} s")
    vocab = SHAPES[shape]["vocab_size"]
    prompts = make_prompts(args.requests, args.prompt, vocab, seed=1)
    warm = make_prompts(args.requests, args.prompt, vocab, seed=2)
    modes = write_modes(args)
    t0 = time.perf_counter()
    generate(model, warm, args, canary=False, max_new=args.warmup_generate)
    for split, overlap in modes:  # the kernels compile here
        generate(
            model, warm, args, canary=True, max_new=args.warmup_generate,
            split_write=split, overlap_begin=overlap,
        )  # fmt: skip
    print(f"{shape}: warm-up (without, with the canary) {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    offs = [generate(model, prompts, args, canary=False, max_new=args.generate)]
    ons: list[list[Run]] = [[] for _ in modes]
    for _ in range(args.pairs):
        for runs, (split, overlap) in zip(ons, modes):
            runs.append(
                generate(
                    model,
                    prompts,
                    args,
                    canary=True,
                    max_new=args.generate,
                    split_write=split,
                    overlap_begin=overlap,
                )
            )
            offs.append(generate(model, prompts, args, canary=False, max_new=args.generate))
    runs = len(offs) + sum(map(len, ons))
    print(f"{shape}: {runs} measured runs {time.perf_counter() - t0:.1f} s")
    if args.profile:
        for line in profile_canary(shape, model, prompts, args):
            print(line)
    if args.phases:
        print(phases_canary(shape, model, prompts, args))
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    rows = [row for runs in ons for row in summarize(shape, offs, runs)]
    return rows, check(shape, offs, [r for runs in zip(*ons) for r in runs])


def write_modes(args: argparse.Namespace) -> list[tuple[bool | None, bool | None]]:
    """The canary runs' ``(split_write, overlap_begin)`` values: both splits with
    ``--compare-split``, both overlaps with ``--compare-overlap``."""
    split, overlap = SPLIT_WRITE[args.split_write], SPLIT_WRITE[args.overlap_begin]
    if args.compare_split:
        return [(True, overlap), (False, overlap)]
    if args.compare_overlap:
        return [(split, True), (split, False)]
    return [(split, overlap)]


def phases_canary(
    shape: str, model: Any, prompts: list[list[int]], args: argparse.Namespace
) -> str:
    """One more run with the canary (after the measured runs) under
    :class:`benchmarks.phases.Phases`: the host time of each phase of the step
    inside the engine, without a profiler's inflation."""
    from benchmarks.phases import Phases

    phases = Phases()
    try:
        split, overlap = write_modes(args)[0]
        generate(
            model, prompts, args, canary=True, max_new=args.generate,
            split_write=split, overlap_begin=overlap,
        )  # fmt: skip
    finally:
        phases.remove()
    return f"{shape}: host time per phase inside the engine (one more run):\n{phases.table()}"


# --- where the canary's host time goes (--profile) -------------------------------------------
_SYNCING = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",  # the synchronous one (cudaMemcpyAsync is not)
    "aten::_local_scalar_dense",
    "cudaMalloc",
    "cudaHostAlloc",
)
"""Calls that wait for the device (or allocate from the driver: ``cudaMalloc`` may
synchronize) inside a step of the canary: each is named in the profile's lines."""


def profile_canary(
    shape: str, model: Any, prompts: list[list[int]], args: argparse.Namespace
) -> list[str]:
    """One more run with the canary (``min(--generate, 16)`` tokens, after the measured
    runs: their figures are not touched), each ``CanaryRuntime.begin_step`` and
    ``end_step`` under cProfile and a ``torch.profiler`` of its own (CPU, and CUDA's
    runtime calls on CUDA; started in the engine's loop thread, where the hooks run);
    lines: cProfile's top ``--profile`` functions by own time, then per method the torch
    and CUDA runtime calls it made (calls and self host us per step), every syncing call
    named."""
    from torch.profiler import ProfilerActivity

    from kv_canary_engines.runtime import CanaryRuntime

    prof = cProfile.Profile()
    names = ("begin_step", "end_step")
    originals = {name: getattr(CanaryRuntime, name) for name in names}
    calls: dict[str, dict[str, tuple[int, float]]] = {name: {} for name in names}
    activities = [ProfilerActivity.CPU]
    if next(model.parameters()).device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)

    def wrapped(name: str, fn: Any) -> Any:
        def call(self: Any, *a: Any, **k: Any) -> Any:
            with torch.profiler.profile(activities=activities) as tp:
                prof.enable()
                try:
                    out = fn(self, *a, **k)
                finally:
                    prof.disable()
            seen = calls[name]
            for e in tp.events():
                if e.device_type == torch.autograd.DeviceType.CPU:
                    n, us = seen.get(e.name, (0, 0.0))
                    seen[e.name] = (n + 1, us + e.self_cpu_time_total)
            return out

        return call

    for name, fn in originals.items():
        setattr(CanaryRuntime, name, wrapped(name, fn))
    try:
        split, overlap = write_modes(args)[0]  # the first mode compared, or the one run
        run = generate(
            model, prompts, args, canary=True, max_new=min(args.generate, 16),
            split_write=split, overlap_begin=overlap,
        )  # fmt: skip
    finally:
        for name, fn in originals.items():
            setattr(CanaryRuntime, name, fn)
    steps = max(len(run.steps), 1)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(args.profile)
    lines = [
        f"{shape}: profile of the canary over {len(run.steps)} steps (one more run, "
        f"{min(args.generate, 16)} tokens; profiled, so slower than the table's figures)",
        f"{shape}: cProfile, begin_step + end_step, top {args.profile} by own time:",
        *text.getvalue().rstrip().splitlines(),
    ]
    for name, seen in calls.items():
        lines.append(
            f"{shape}: inside {name}: torch and CUDA runtime calls per step (self host us per step)"
        )
        for op, (n, us) in sorted(seen.items(), key=lambda kv: -kv[1][1])[: args.profile]:
            lines.append(f"    {op:48s} {n / steps:7.2f} calls {us / steps:9.1f} us")
        waits = {k: n for k, (n, _) in seen.items() if k.startswith(_SYNCING)}
        lines.append(
            f"{shape}: {name} syncing calls: "
            + (", ".join(f"{k} x{n}" for k, n in sorted(waits.items())) or "none")
        )
    return lines


# --- main ------------------------------------------------------------------------------------
def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--shapes", default="1b,8b", help="comma-separated: 1b, 8b (tiny)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=512, help="tokens per prompt")
    parser.add_argument("--generate", type=int, default=64, help="tokens generated per prompt")
    parser.add_argument("--max-batch-tokens", type=int, default=2048)
    parser.add_argument("--page-size", type=int, default=256)
    parser.add_argument("--pairs", type=int, default=1, help="(with, without) runs after the first")
    parser.add_argument("--warmup-generate", type=int, default=8)
    parser.add_argument("--poll-every", type=int, default=16)
    parser.add_argument(
        "--verify-every",
        type=int,
        default=1,
        help="CanaryConfig.verify_every: the HEAD and TAIL verifies every N steps (the\n"
        "writes run every step); 1, the target's setting, by default",
    )
    parser.add_argument("--sweep-every", type=int, default=0)
    parser.add_argument("--stages", default="kernels", choices=("kernels", "reference"))
    parser.add_argument("--attn", default="sdpa", choices=("sdpa", "flash"))
    parser.add_argument(
        "--split-write",
        default="auto",
        choices=tuple(SPLIT_WRITE),
        help="CanaryConfig(split_write=None, True, False); auto (the runtime's default):\n"
        "split on CUDA with the kernels",
    )
    parser.add_argument(
        "--compare-split",
        action="store_true",
        help="run the canary both ways in one process: (split, off, one write, off) pairs",
    )
    parser.add_argument(
        "--overlap-begin",
        default="auto",
        choices=tuple(SPLIT_WRITE),
        help="CanaryConfig(overlap_begin=None, True, False); auto (the runtime's default): "
        "on CUDA with the kernels",
    )
    parser.add_argument(
        "--compare-overlap",
        action="store_true",
        help="run the canary both ways in one process: (overlapped, off, before the "
        "forward, off) pairs",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="after the measured runs, one more canary run with each phase of the step\n"
        "timed (benchmarks.phases)",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the measured runs, one more canary run profiled: cProfile's top N of\n"
        "begin_step/end_step and the torch / CUDA runtime calls inside them",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the CSV")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the tiny Llama on the CPU, a few steps, the kernels under TRITON_INTERPRET=1",
    )
    args = parser.parse_args(argv)
    for name in ("requests", "prompt", "generate", "max_batch_tokens", "page_size", "pairs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.compare_split and args.compare_overlap:
        parser.error("--compare-split and --compare-overlap compare one setting each: pick one")
    if args.smoke:
        args.shapes, args.device, args.dtype = "tiny", "cpu", "float32"
        args.requests, args.prompt, args.generate = 3, 20, 4
        args.max_batch_tokens, args.page_size, args.warmup_generate = 32, 16, 1
        args.poll_every = 2
    return args


SETTINGS = (
    "requests",
    "prompt",
    "generate",
    "max_batch_tokens",
    "page_size",
    "pairs",
    "poll_every",
    "verify_every",
    "sweep_every",
    "stages",
    "attn",
    "dtype",
    "split_write",
    "compare_split",
    "overlap_begin",
    "compare_overlap",
)
"""The run's settings, in every CSV row."""


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown or not shapes:
        print(
            f"kv-canary: --shapes takes {', '.join(SHAPES)}, got {args.shapes!r}", file=sys.stderr
        )
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("engine_share: needs CUDA (or --smoke for the CPU)", file=sys.stderr)
        return 2
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if args.stages == "kernels" and device.type != "cuda" and not interpreted:
        print("kv-canary: --stages kernels off CUDA needs TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    import transformers

    from kv_canary_engines.transformers import SUPPORTED_VERSIONS

    minor = ".".join(transformers.__version__.split(".")[:2])
    if minor not in SUPPORTED_VERSIONS:  # before any run: install would refuse it later
        print(
            f"kv-canary: transformers {transformers.__version__} is not supported by the "
            f"adapter; supported: {', '.join(SUPPORTED_VERSIONS)}",
            file=sys.stderr,
        )
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"engine_share: {name}, torch {torch.__version__}, transformers "
        f"{transformers.__version__} (the adapter supports {', '.join(SUPPORTED_VERSIONS)}); "
        f"{args.requests} requests x {args.prompt} prompt + {args.generate} generated tokens, "
        f"max_batch_tokens {args.max_batch_tokens}, page {args.page_size}; canary HEAD + TAIL, "
        f"real-KV PARTIAL, stages {args.stages}, verify every {args.verify_every} step(s), "
        "poll every "
        f"{args.poll_every}; split write {args.split_write}; overlap begin "
        f"{args.overlap_begin}; runs: off, then {args.pairs} x "
        + (
            "(split, off, one write, off)"
            if args.compare_split
            else "(overlapped, off, before the forward, off)"
            if args.compare_overlap
            else "(on, off)"
        )
    )
    dtype = getattr(torch, args.dtype)
    meta = Recorder(name, None).meta
    meta["transformers"] = transformers.__version__
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"engine_share-{device.type}-{utc_stamp()}.csv"
    keys = [k for k, _ in COLUMNS]
    fields = [*keys, "tokens_identical", "violations", *SETTINGS, *meta]
    table: list[dict[str, Any]] = []
    notes: list[str] = []
    ok = True
    t0 = time.perf_counter()
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for shape in shapes:  # each shape's rows written as they come
            rows, checks = run_shape(shape, args, device, dtype)
            table += rows
            notes += checks.lines
            ok &= checks.ok
            for r in rows:
                writer.writerow(
                    {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
                    | {"tokens_identical": checks.identical, "violations": checks.violations}
                    | {k: getattr(args, k) for k in SETTINGS}
                    | meta
                )
            f.flush()
    print()
    print(markdown_table([h for _, h in COLUMNS], [[_cell(k, r[k]) for k in keys] for r in table]))
    print()
    for line in notes:
        print(line)
    shares = [r["share"] for r in table if r["share"] is not None]
    if shares:
        met = "met" if max(shares) <= 0.01 else "NOT met"
        print(f"target (the share at most 1% of decode and of prefill steps): {met}")
    print(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    with logged(Path(__file__).stem):
        raise SystemExit(main())

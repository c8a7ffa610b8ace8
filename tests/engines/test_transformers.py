"""The canary inside transformers' continuous batching (a tiny random-weight Llama from a
config, CPU): clean runs of more than 100 steps with chunked prefill, prefix-cache hits
and block reuse (0 violations, the same tokens as without the canary), every fault the
adapter can inject caught with the right request, a short run with the Triton kernels,
and the install-time refusals.

Needs transformers (the engines' environment, scripts/setup-engines.sh): skipped where it
is not importable, and failed instead when ``KV_CANARY_REQUIRE_ENGINES=1`` (the engines
run in CI), so that the engines' run never skips it.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import sys
import time
from typing import Any

import pytest

if importlib.util.find_spec("transformers") is None:
    if os.environ.get("KV_CANARY_REQUIRE_ENGINES") == "1":
        raise RuntimeError("kv-canary: KV_CANARY_REQUIRE_ENGINES=1 but transformers is missing")
    pytest.skip(
        "transformers is not installed here (the engines' environment has it: "
        "bash scripts/setup-engines.sh, then .venv-engines/bin/python -m pytest tests/engines)",
        allow_module_level=True,
    )

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from kv_canary_buffers import FailBits
from kv_canary_engines import CanaryConfig, Endpoint
from kv_canary_engines.faults import (
    FaultKind,
    TransformersFaults,
    explained,
    first_catch,
)
from kv_canary_engines.transformers import SUPPORTED_VERSIONS, install

pytestmark = pytest.mark.engines

MINOR = ".".join(sys.modules["transformers"].__version__.split(".")[:2])
ONLY_519 = pytest.mark.skipif(
    MINOR != "5.19", reason="the faults break transformers 5.19's allocator (5.17 has another)"
)
PERSISTENT = MINOR != "5.17"
"""5.17 fails a reused manager's second session on the CPU (an attention-mask size
mismatch), canary or not: each session gets its own manager there."""

MAX_NEW = 24


@pytest.fixture(scope="module")
def model() -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
    )
    return LlamaForCausalLM(config).eval()


SHARED = torch.randint(1, 500, (40,), generator=torch.Generator().manual_seed(0)).tolist()


def prompts(seed: int, n: int = 16) -> list[list[int]]:
    """Prompts of 5 to 44 tokens; every third one starts with the same 40 tokens in every
    session (prefix hits on its first two full pages of 16, within a session and from
    the previous one)."""
    gen = torch.Generator().manual_seed(seed)
    shared = SHARED
    out = []
    for i in range(n):
        if i % 3 == 0:
            out.append(shared + torch.randint(1, 500, (1 + i % 4,), generator=gen).tolist())
        else:
            length = int(torch.randint(5, 40, (1,), generator=gen))
            out.append(torch.randint(1, 500, (length,), generator=gen).tolist())
    return out


def cb_config() -> ContinuousBatchingConfig:
    # small pages, a small pool (blocks are reused) and a small token budget (prompts are
    # prefilled in chunks); 5.17 calls the page size block_size
    params = inspect.signature(ContinuousBatchingConfig).parameters
    page = "page_size" if "page_size" in params else "block_size"
    return ContinuousBatchingConfig(
        **{page: 16}, num_blocks=24, max_batch_tokens=32, max_requests_per_batch=4
    )


def generation() -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=-1, pad_token_id=0
    )


def drive(manager: Any, inputs: list[list[int]], cancelled: set[str]) -> dict[str, list[int]]:
    """Run ``inputs`` on a started manager until every request finished or was cancelled
    (by the canary's abort policy: ``generate_batch`` would wait for them forever)."""
    ids = manager.add_requests(inputs=inputs, max_new_tokens=MAX_NEW)
    done: dict[str, list[int]] = {}
    deadline = time.monotonic() + 300
    while len(done) + len(cancelled - done.keys()) < len(ids):
        assert time.monotonic() < deadline, "the engine did not finish"
        assert manager.is_running(), "the generation loop stopped"
        result = manager.get_result(timeout=0.5)
        if result is not None and result.is_finished():
            done[result.request_id] = list(result.generated_tokens)
    return done


def run(
    model: Any,
    sessions: list[list[list[int]]],
    *,
    canary_config: CanaryConfig | None = None,
    fault: FaultKind | None = None,
    at_step: int = 8,
    abort: bool = False,
) -> tuple[list[dict[str, list[int]]], Any, TransformersFaults | None]:
    """Run each session of prompts on one manager (its prefix cache carries over), with
    the canary when ``canary_config`` is given."""
    manager = model.init_continuous_batching(
        generation_config=generation(), continuous_batching_config=cb_config()
    )
    canary = injector = None
    cancelled: set[str] = set()
    if canary_config is not None:
        if abort:

            def policy(ids: frozenset[Any], report: Any) -> None:
                cancelled.update(str(i) for i in ids)
                assert canary is not None
                canary.abort(ids, report)

            canary_config = CanaryConfig(
                **{**_fields(canary_config), "policy": policy}  # type: ignore[arg-type]
            )
        canary = install(model, manager, canary_config)
        if fault is not None:
            injector = TransformersFaults(canary, fault, at_step=at_step)
    outputs = []
    try:
        for i, inputs in enumerate(sessions):
            if i and not PERSISTENT:
                manager.destroy()
                del model._cached_continuous_batching_manager
                manager = model.init_continuous_batching(
                    generation_config=generation(), continuous_batching_config=cb_config()
                )
                if canary is not None:
                    canary.manager = manager
                    model._cached_continuous_batching_manager = manager
            manager.start()
            outputs.append(drive(manager, inputs, cancelled))
            manager.stop(block=True, keep_for_next_session=i + 1 < len(sessions))
    finally:
        if injector is not None:
            injector.remove()
        if canary is not None:
            canary.remove()
        if manager.is_running():
            manager.stop(block=True)
        manager.destroy()
        if hasattr(model, "_cached_continuous_batching_manager"):
            del model._cached_continuous_batching_manager
    return outputs, canary, injector


def _fields(config: CanaryConfig) -> dict[str, Any]:
    import attrs

    return attrs.asdict(config, recurse=False)


def violations(canary: Any) -> list[Any]:
    return [v for r in canary.reports for v in r.violations]


SESSIONS = [prompts(1), prompts(2)]


@pytest.fixture(scope="module")
def reference(model: Any) -> list[dict[str, list[int]]]:
    outputs, _canary, _ = run(model, SESSIONS)
    return outputs


# --- clean runs ---------------------------------------------------------------------------
def test_a_clean_run_of_two_sessions_has_no_violation_and_the_same_tokens(model, reference):
    reused: dict[int, set[str]] = {}

    def blocks(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        bp = manager_of(model)
        if bp is not None:
            cache = bp.cache
            if MINOR == "5.17":
                tables = cache.group_cache_managers[0].block_table
            else:
                tables = cache.cache_allocators["full_attention"].block_table
            for rid, table in tables.items():
                for block in table:
                    reused.setdefault(int(block), set()).add(rid)

    handle = model.register_forward_pre_hook(blocks, with_kwargs=True)
    try:
        outputs, canary, _ = run(
            model, SESSIONS, canary_config=CanaryConfig(stages="reference", sweep_every=4)
        )
    finally:
        handle.remove()
    assert outputs == reference
    assert violations(canary) == []
    runtime = canary.runtime
    assert runtime.health.executing
    st = runtime.stats
    assert st.steps >= 100
    assert st.chunked_rows > 0  # prompts longer than the 32-token budget come in chunks
    assert st.prefix_hits > 0  # the shared 40-token prefix, within and across sessions
    assert st.sweeps > 0
    assert any(len(rids) > 1 for rids in reused.values())  # blocks reused by other requests
    if MINOR == "5.19":
        assert 0 not in reused  # block 0 (the canary's padding slot 0) is a trash block
    assert all(not any(r.plan_status.values()) for r in canary.reports)
    assert all(not any(r.canary_status.values()) for r in canary.reports)


def manager_of(model: Any) -> Any:
    manager = getattr(model, "_cached_continuous_batching_manager", None)
    return None if manager is None else manager.batch_processor


@ONLY_519
def test_a_short_run_with_the_triton_kernels_is_clean_and_catches_a_kv_overwrite(model):
    inputs = [[p[:12] for p in prompts(3, n=2)]]
    _, canary, _ = run(model, inputs, canary_config=CanaryConfig(stages="kernels"))
    assert canary.runtime.stages.name == "kernels"
    assert violations(canary) == [] and canary.runtime.stats.steps >= MAX_NEW
    _, canary, injector = run(
        model,
        inputs,
        canary_config=CanaryConfig(stages="kernels"),
        fault=FaultKind.KV_OVERWRITTEN,
        at_step=4,
    )
    assert injector is not None and injector.injection is not None
    caught = first_catch(injector.injection, canary.reports)
    assert caught is not None and caught.step == injector.injection.step
    assert caught.endpoint is Endpoint.TAIL_VERIFY
    assert caught.violation.fail_bits == FailBits.REAL_KV


# --- faults ---------------------------------------------------------------------------------
DELAY = {
    # steps from the misbehaving schedule or forward to the first catch
    FaultKind.FREED_PAGE_REUSED: 0,  # the reusing write, seen by that step's TAIL verify
    FaultKind.DOUBLE_ALLOCATION: 1,  # both write in one step: the next HEAD verify
    FaultKind.SLOT_OFF_BY_ONE: 1,  # the skipped slot is read at the next step
    FaultKind.KV_OVERWRITTEN: 0,  # that step's TAIL verify
    FaultKind.PADDING_WRITE: 0,  # that step's TAIL verify
}


@ONLY_519
@pytest.mark.parametrize("kind", sorted(DELAY, key=lambda k: k.name), ids=lambda k: k.name)
def test_a_fault_is_caught_with_the_request_it_harms(model, kind):
    # the policy cancels what a poll names, as an engine would
    _, canary, injector = run(
        model,
        [prompts(4, n=18)],
        canary_config=CanaryConfig(stages="reference"),
        fault=kind,
        abort=True,
    )
    assert canary.runtime.stats.steps >= 100
    assert injector is not None
    inj = injector.injection
    assert inj is not None, f"{kind.value} found no request to harm"
    caught = first_catch(inj, canary.reports)
    assert caught is not None, f"{kind.value} was not caught: {inj.detail}"
    assert caught.step - inj.step == DELAY[kind]
    assert inj.victims & caught.request_ids()
    if inj.culprits:  # the slot's other holder is named too
        assert inj.culprits & caught.request_ids()
    assert [v.line for v in violations(canary) if not explained([inj], v)] == []


@ONLY_519
def test_a_stale_prefix_cache_hit_is_caught_with_the_request_that_hit(model):
    # session 1 leaves the shared prefix's blocks in the prefix cache; in session 2 a long
    # prompt takes the first step's whole token budget, one of those blocks is reallocated
    # to it while its hash stays indexed, and the request waiting behind it then hits it
    filler = torch.randint(1, 500, (60,), generator=torch.Generator().manual_seed(6)).tolist()
    sessions = [[SHARED + [1, 2]], [filler, SHARED + [3]]]
    _, canary, injector = run(
        model,
        sessions,
        canary_config=CanaryConfig(stages="reference"),
        fault=FaultKind.STALE_PREFIX_HIT,
        at_step=0,
    )
    assert injector is not None and injector.injection is not None
    inj = injector.injection
    assert inj.victims, "no request hit the stale block"
    caught = first_catch(inj, canary.reports)
    assert caught is not None
    # the HEAD verify of the hit's first step, or its TAIL verify when the filler writes
    # the reused block in that same step
    assert caught.endpoint in (Endpoint.HEAD_VERIFY, Endpoint.TAIL_VERIFY)
    assert inj.victims & caught.request_ids()
    assert canary.runtime.stats.prefix_hits >= 1
    assert [v.line for v in violations(canary) if not explained([inj], v)] == []


@ONLY_519
def test_the_abort_policy_cancels_the_harmed_request_and_the_others_finish(model, reference):
    outputs, _, injector = run(
        model,
        [SESSIONS[0]],
        canary_config=CanaryConfig(stages="reference"),
        fault=FaultKind.KV_OVERWRITTEN,
        abort=True,
    )
    assert injector is not None and injector.injection is not None
    victims = injector.injection.victims
    (done,) = outputs
    assert victims and not victims & done.keys()  # cancelled, never finished
    assert len(done) == len(SESSIONS[0]) - len(victims)
    # the others generated exactly what they generate without the canary
    assert {k: v for k, v in reference[0].items() if k in done} == done


def test_speculative_faults_are_refused_for_transformers(model):
    manager = model.init_continuous_batching(
        generation_config=generation(), continuous_batching_config=cb_config()
    )
    canary = install(model, manager, CanaryConfig(stages="reference"))
    try:
        with pytest.raises(ValueError, match="does not speculate"):
            TransformersFaults(canary, FaultKind.SPECULATIVE_NOT_ROLLED_BACK, at_step=0)
    finally:
        canary.remove()
        manager.destroy()


# --- install-time refusals ------------------------------------------------------------------
def _manager(model: Any, **changes: Any) -> Any:
    manager = model.init_continuous_batching(
        generation_config=generation(), continuous_batching_config=cb_config()
    )
    for name, value in changes.items():
        setattr(manager.continuous_batching_config, name, value)
    return manager


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(use_cuda_graph=(True, False)), "use_cuda_graph=.* is not supported"),
        (dict(varlen_compile_config=object()), "a torch.compile'd forward"),
        (dict(use_async_batching=True), "use_async_batching=True is not supported"),
        (dict(cpu_offload_space=1.0), "cpu_offload_space=1.0 is not supported"),
    ],
)
def test_unsupported_modes_are_refused_at_install(model, changes, match):
    manager = _manager(model, **changes)
    try:
        with pytest.raises(ValueError, match="kv-canary: " + match):
            install(model, manager)
        assert getattr(model, "_kv_canary", None) is None
    finally:
        manager.destroy()


def test_other_refusals_at_install(model, monkeypatch):
    manager = _manager(model)
    try:
        with pytest.raises(
            TypeError, match="kv-canary: manager must be the ContinuousBatchingManager"
        ):
            install(model, object())
        manager.num_return_sequences = 2
        with pytest.raises(ValueError, match="num_return_sequences=2 is not supported"):
            install(model, manager)
        manager.num_return_sequences = 1
        # (transformers swaps its module in sys.modules on first use: patch the live one)
        monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.18.0")
        supported = ", ".join(f"{v}.x" for v in SUPPORTED_VERSIONS)
        with pytest.raises(ValueError, match=f"5.18.0 is not supported; supported: {supported}"):
            install(model, manager)
        monkeypatch.undo()
        canary = install(model, manager)
        with pytest.raises(ValueError, match="already installed"):
            install(model, manager)
        canary.remove()
    finally:
        manager.destroy()
        if hasattr(model, "_cached_continuous_batching_manager"):
            del model._cached_continuous_batching_manager


def test_a_sliding_window_model_is_refused_at_install():
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
    )
    config.layer_types = ["sliding_attention", "full_attention"]
    config.sliding_window = 8
    model = LlamaForCausalLM(config).eval()
    manager = model.init_continuous_batching(
        generation_config=generation(), continuous_batching_config=cb_config()
    )
    try:
        with pytest.raises(ValueError, match=r"attention layer types \['full_attention', "):
            install(model, manager)
    finally:
        manager.destroy()


def test_the_canary_logs_nothing_on_a_clean_run(model, caplog):
    with caplog.at_level(logging.WARNING, logger="kv_canary"):
        run(model, [prompts(5, n=4)], canary_config=CanaryConfig(stages="reference"))
    assert [r.getMessage() for r in caplog.records if r.name == "kv_canary"] == []

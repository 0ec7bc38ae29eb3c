"""How each system of ``benchmarks/vs_peers_gpu.py`` is launched (issue 27): the command lines of ours
(``scripts/quickstart.py``), veRL 0.9.1 (``verl.trainer.main_ppo`` with Hydra overrides, plus its multi-turn
tool and agent-loop files) and TRL 1.16 (``trl_gpu_run.py``), each child's environment (:func:`child_env`),
and the :class:`BenchConfig` / :class:`Inputs` they are built from; kept apart from the driver (inputs, runs,
records) so that the three launches read side by side. Unlike its neighbours it runs on the driver's side
only, never in a peer's site: it imports our ``verl`` (``recipe_overrides``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from verl.trainer.overrides import recipe_overrides

ROOT = Path(__file__).resolve().parents[2]
PEERS_DIR = ROOT / "benchmarks" / "peers"
SITES = {"ours": ["/tmp/site", str(ROOT)], "verl": ["/tmp/site-verl", "/tmp/site"],
         "trl": ["/tmp/site-trl", "/tmp/site"]}
RETRIEVER_TOPK = 3  # passages a search, all systems (the learning recipe's retriever.topk)
# veRL cuts a tool's answer in characters: our learning corpus's 3-passage observations average 3.96
# characters a SmolLM2 token (300 of them, 2026-12-03), so 4 characters a token of our budget
CHARS_PER_TOKEN = 4
# where a turn ends in all three systems (ours: the learning recipe's turn rules; the peers: vLLM stop strings)
STOP_STRINGS = ("</search>", "</answer>")
# veRL's names for benchmarks/peers/verl_search.py's pieces (that module runs in veRL's site only)
VERL_AGENT_LOOP, VERL_TOOL_PARSER, VERL_TOOL = "search_r1_tool_agent", "search_r1_tags", "search"
VERL_SINGLE_TURN_LOOP = "search_r1_single_turn"
VERL_TOOL_YAML, VERL_LOOP_YAML = "verl_search_tool.yaml", "verl_agent_loop.yaml"
# veRL's documented best, flash_attention_2 with use_remove_padding, needs the flash-attn package, which has
# no wheel for the device's torch 2.11 / CUDA 13 (PyPI: source only) and cannot be built there (no network);
# veRL's next path is torch's SDPA over padded micro-batches (its remove-padding path on SDPA would build a
# dense (tokens x tokens) mask over each 64k-token packed micro-batch)
VERL_ATTENTION = "sdpa"
# and its documented fused log-prob head, which on the padded path spares the (tokens x vocab) fp32 logits
# (12.9 GB a 64k-token micro-batch at SmolLM2's vocabulary; the first H200 run without it peaked at 121 GiB
# allocated). Backend "torch": exact, chunked, runs on any device (its Triton kernel is GPU-only, untested here)
VERL_FUSED_KERNELS = ("actor_rollout_ref.model.use_fused_kernels=true",
                      "actor_rollout_ref.model.fused_kernel_options.impl_backend=torch")
# ours skips the old-log-prob pass on-policy (one update a batch: old = its own log-probs, detached); veRL's
# documented way to skip it is its rollout-correction "bypass" mode, old = the rollout's (vLLM's) log-probs
# (docs/algo/rollout_corr.md), so that veRL too runs two passes a step, not three
# sampling, the same in the three systems: temperature 1 over the whole vocabulary, veRL's and TRL's defaults;
# ours would otherwise sample with Search-R1's top_p 0.95 (another distribution, and a sort of the vocabulary
# a decode step in vLLM's sampler)
TEMPERATURE, TOP_P = 1.0, 1.0
# the loss, the same in the three systems: no entropy bonus (veRL 0.9.1's default; TRL's GRPO loss has none).
# Ours would otherwise add Search-R1's 0.001: while every reward is 0 (the `learning` warm start single-turn
# scores none) it is the only gradient beside the KL's, Adam turns it into lr-sized steps, and our responses
# lengthen while the peers' do not: a different workload (docs/benchmarks.md, "Against veRL and TRL")
ENTROPY_COEFF = 0.0
VERL_SKIP_OLD_LOG_PROBS = ("algorithm.rollout_correction.bypass_mode=true",
                           "actor_rollout_ref.rollout.calculate_log_probs=true")


@dataclass(frozen=True)
class BenchConfig:
    """One configuration of the comparison (the same for the three systems; ``vs_peers_gpu.CONFIGS``).

    Attributes:
        model: ``warm_start`` (the SmolLM2-135M SFT warm start) or a shape of ``benchmarks/shapes.py``
            (randomly initialised, SmolLM2 tokenizer).
        sources: data sources kept from the learning data's train split (None: all).
        prompts: prompts a step; ``n``: samples a prompt.
        max_prompt_length / max_response_length: tokens (longer prompts are dropped).
        lr: AdamW learning rate, constant.
        gpu_memory_utilization: vLLM's share of the GPU (all three systems).
        gradient_checkpointing: activation checkpointing in the update (all three).
        max_token_len: tokens a packed micro-batch (ours, veRL); ``trl_micro_batch``: completions a
            padded TRL micro-batch.
        max_turns: searches a row at most (0: single turn, no retriever); then ``max_response_length`` is
            one turn's budget (Search-R1's meaning) and ``max_obs_length`` one observation's, in tokens.
    """

    model: str
    sources: tuple[str, ...] | None
    prompts: int
    n: int
    max_prompt_length: int
    max_response_length: int
    lr: float
    gpu_memory_utilization: float
    gradient_checkpointing: bool
    max_token_len: int
    trl_micro_batch: int
    max_turns: int = 0
    max_obs_length: int = 0

    @property
    def response_width(self) -> int:
        """A row's response tokens at most: every turn and every observation (one turn when single-turn)."""
        return self.max_response_length * (self.max_turns + 1) + self.max_obs_length * self.max_turns

    @property
    def obs_chars(self) -> int:
        """The observation budget in characters (veRL's unit): ``max_obs_length x CHARS_PER_TOKEN``."""
        return self.max_obs_length * CHARS_PER_TOKEN


@dataclass(frozen=True)
class Inputs:
    """What a configuration's runs read: the policy's HF folder, ours/veRL's parquet folder, TRL's JSONL, and
    for a multi-turn configuration the retriever server's ``/retrieve`` URL."""

    model: str
    data_dir: Path
    trl_questions: Path
    retriever_url: str | None = None


SINGLE_TURN_ROLLOUT = ("actor_rollout_ref.rollout.mode=sync", "actor_rollout_ref.rollout.engine_process=false")
"""our rollout for a single-turn configuration, over the learning recipe's async one"""


def ours_command(cfg: BenchConfig, inputs: Inputs, steps: int, work: Path, name: str) -> list[str]:
    """Our trainer (``scripts/quickstart.py``, as ``train_grpo.sh`` on a GPU calls it) with the learning
    recipe at ``cfg``'s sizes: single turn with no retriever, or our search rollout (:func:`ours_turn_overrides`)."""
    ckpt = "true" if cfg.gradient_checkpointing else "false"
    no_retriever = [] if cfg.max_turns else ["--no-retriever"]  # multi-turn: the driver's server answers
    return [sys.executable, str(ROOT / "scripts" / "quickstart.py"), *no_retriever, "--data-dir", str(inputs.data_dir),
            "+recipe=search_r1_grpo", "trainer.n_gpus_per_node=1", *recipe_overrides("learning_gpu"),
            f"actor_rollout_ref.model.path={inputs.model}", *ours_turn_overrides(cfg, inputs),
            f"data.train_batch_size={cfg.prompts}", f"actor_rollout_ref.rollout.n={cfg.n}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={cfg.prompts}", f"actor_rollout_ref.actor.optim.lr={cfg.lr}",
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={cfg.max_token_len}",
            f"actor_rollout_ref.actor.entropy_coeff={ENTROPY_COEFF}",
            f"actor_rollout_ref.rollout.gpu_memory_utilization={cfg.gpu_memory_utilization}",
            f"actor_rollout_ref.rollout.temperature={TEMPERATURE}", f"actor_rollout_ref.rollout.top_p={TOP_P}",
            f"actor_rollout_ref.model.enable_gradient_checkpointing={ckpt}",
            "trainer.logger=[console,jsonl]",
            f"trainer.log_dir={work / 'logs'}", f"trainer.total_training_steps={steps}", "trainer.save_freq=-1",
            "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.resume_mode=disable",
            "trainer.export_hf=false", f"trainer.experiment_name=vs-peers-{name}",
            f"trainer.default_local_dir={work / 'ckpt'}"]


def ours_turn_overrides(cfg: BenchConfig, inputs: Inputs) -> list[str]:
    """Single turn (``max_turns=0``, prompts and the engine's context of ``max_prompt_length``) or our search
    rollout (what ``train_grpo.sh`` runs by default) against ``inputs.retriever_url``: ``max_turns``
    searches, turns of ``max_response_length`` and observations of ``max_obs_length`` tokens, an engine
    context holding the prompt and the whole trajectory (the learning recipe's 2,048).

    Raises:
        ValueError: a multi-turn configuration without a retriever URL.
    """
    lengths = [f"data.max_start_length={cfg.max_prompt_length}", f"data.max_response_length={cfg.max_response_length}"]
    if not cfg.max_turns:
        # one generate call with no searches to overlap: the sync loop on the engine in this process
        # (the learning recipe's async rollout pays off between searches)
        return ["max_turns=0", "do_search=false", *lengths, f"data.max_prompt_length={cfg.max_prompt_length}",
                *SINGLE_TURN_ROLLOUT]
    if not inputs.retriever_url:
        raise ValueError("a multi-turn configuration needs the retriever server's URL (Inputs.retriever_url)")
    return [f"max_turns={cfg.max_turns}", "do_search=true", f"retriever.url={inputs.retriever_url}",
            f"retriever.topk={RETRIEVER_TOPK}", *lengths, f"data.max_obs_length={cfg.max_obs_length}",
            f"data.max_prompt_length={cfg.max_prompt_length + cfg.response_width}"]


def verl_overrides(cfg: BenchConfig, inputs: Inputs, steps: int, work: Path, name: str, trainer: str = "v1") -> list[str]:
    """veRL 0.9.1's Hydra overrides of ``verl/trainer/config/ppo_trainer.yaml`` (keys checked against the
    wheel's config by tests/benchmarks/test_vs_peers_peer_code.py). ``trainer``: ``v1`` (veRL's default
    trainer, TransferQueue) or ``v0`` (its legacy ``RayPPOTrainer``, the fallback). Multi-turn: the rows
    of ``vs_peers_gpu.verl_search_row`` and :func:`verl_agent_loop_overrides`; the response budget is the
    whole row's."""
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    ckpt = "true" if cfg.gradient_checkpointing else "false"
    parquet = inputs.data_dir / ("verl_train.parquet" if cfg.max_turns else "train.parquet")
    return [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false", *VERL_SKIP_OLD_LOG_PROBS,
        f"data.train_files={parquet}", f"data.val_files={parquet}", f"data.train_batch_size={cfg.prompts}",
        f"data.max_prompt_length={cfg.max_prompt_length}", f"data.max_response_length={cfg.response_width}",
        "data.filter_overlong_prompts=true", "data.shuffle=false",
        f"actor_rollout_ref.model.path={inputs.model}", "actor_rollout_ref.model.use_remove_padding=false",
        f"+actor_rollout_ref.model.override_config.attn_implementation={VERL_ATTENTION}", *VERL_FUSED_KERNELS,
        f"actor_rollout_ref.model.enable_gradient_checkpointing={ckpt}",
        f"{actor}.optim.lr={cfg.lr}", f"{actor}.ppo_mini_batch_size={cfg.prompts}", f"{actor}.use_dynamic_bsz=true",
        f"{actor}.ppo_max_token_len_per_gpu={cfg.max_token_len}", f"{actor}.use_kl_loss=true",
        f"{actor}.kl_loss_coef=0.001", f"{actor}.kl_loss_type=low_var_kl", f"{actor}.entropy_coeff={ENTROPY_COEFF}",
        f"{actor}.fsdp_config.param_offload=false", f"{actor}.fsdp_config.optimizer_offload=false",
        "actor_rollout_ref.ref.fsdp_config.param_offload=false",
        f"{rollout}.name=vllm", f"{rollout}.n={cfg.n}", f"{rollout}.tensor_model_parallel_size=1",
        f"{rollout}.gpu_memory_utilization={cfg.gpu_memory_utilization}", f"{rollout}.enforce_eager=false",
        f"{rollout}.temperature={TEMPERATURE}", f"{rollout}.top_p={TOP_P}",
        f"reward.custom_reward_function.path={PEERS_DIR / 'em_reward.py'}", "reward.custom_reward_function.name=compute_score",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.logger=[console,file]",
        f"trainer.total_training_steps={steps}", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.resume_mode=disable", "trainer.project_name=vs_peers",
        f"trainer.experiment_name={name}", f"trainer.default_local_dir={work / 'ckpt'}",
        f"trainer.use_v1={'true' if trainer == 'v1' else 'false'}", *verl_agent_loop_overrides(cfg, work),
    ]


def verl_agent_loop_overrides(cfg: BenchConfig, work: Path) -> list[str]:
    """veRL's agent loop from ``<work>/verl_agent_loop.yaml`` (:func:`write_verl_files`): single-turn, veRL's
    single-turn loop ending at ``STOP_STRINGS``; multi-turn, its tool agent loop with ``max_turns`` tool
    rounds (``max_user_turns``) and ``max_turns + 1`` generations, one call a turn, the observation cut to
    ``cfg.obs_chars`` characters, Search-R1's tag parser and the tool config, turns ending at the tags and
    after ``max_response_length`` tokens."""
    turn, agent = "actor_rollout_ref.rollout.multi_turn", "actor_rollout_ref.rollout.agent"
    loop = [f"{agent}.agent_loop_config_path={work / VERL_LOOP_YAML}"]
    if not cfg.max_turns:
        return [f"{agent}.default_agent_loop={VERL_SINGLE_TURN_LOOP}", *loop]
    return [f"{turn}.enable=true", f"{turn}.max_assistant_turns={cfg.max_turns + 1}",
            f"{turn}.max_user_turns={cfg.max_turns}", f"{turn}.max_parallel_calls=1",
            f"{turn}.format={VERL_TOOL_PARSER}", f"{turn}.tool_config_path={work / VERL_TOOL_YAML}",
            f"{turn}.max_tool_response_length={cfg.obs_chars}", f"{turn}.tool_response_truncate_side=right",
            f"{agent}.default_agent_loop={VERL_AGENT_LOOP}", *loop]


def write_verl_files(cfg: BenchConfig, url: str | None, work: Path) -> None:
    """``<work>/verl_agent_loop.yaml`` (veRL's agent loop list: ``verl_search.SearchR1SingleTurnAgentLoop``,
    or for a multi-turn configuration ``verl_search.SearchR1ToolAgentLoop`` with ``max_response_length``-token
    turns; both ending at ``STOP_STRINGS``) and, multi-turn, ``<work>/verl_search_tool.yaml`` (veRL's tool
    config: ``verl_search.RetrieverSearchTool`` at our server's ``url``, top-``RETRIEVER_TOPK``, observations
    of ``cfg.obs_chars`` characters)."""
    import yaml

    if not cfg.max_turns:
        loop = {"name": VERL_SINGLE_TURN_LOOP, "_target_": "verl_search.SearchR1SingleTurnAgentLoop",
                "stop": list(STOP_STRINGS)}
        (work / VERL_LOOP_YAML).write_text(yaml.safe_dump([loop], sort_keys=False))
        return
    query = {"type": "string", "description": "A search query: the top passages of the corpus come back."}
    schema = {"type": "function", "function": {
        "name": VERL_TOOL, "description": "Searches a Wikipedia corpus for passages relevant to the query.",
        "parameters": {"type": "object", "properties": {"query": query}, "required": ["query"]}}}
    tool = {"class_name": "verl_search.RetrieverSearchTool", "tool_schema": schema,
            "config": {"type": "native", "retrieval_service_url": url, "topk": RETRIEVER_TOPK, "timeout": 30,
                       "max_chars": cfg.obs_chars}}
    loop = {"name": VERL_AGENT_LOOP, "_target_": "verl_search.SearchR1ToolAgentLoop",
            "stop": list(STOP_STRINGS), "turn_max_tokens": cfg.max_response_length}
    (work / VERL_TOOL_YAML).write_text(yaml.safe_dump({"tools": [tool]}, sort_keys=False))
    (work / VERL_LOOP_YAML).write_text(yaml.safe_dump([loop], sort_keys=False))


def verl_command(cfg: BenchConfig, inputs: Inputs, steps: int, work: Path, name: str, trainer: str = "v1") -> list[str]:
    """``python -m verl.trainer.main_ppo`` with :func:`verl_overrides`; its agent-loop (and tool) files
    written into ``work`` first (:func:`write_verl_files`)."""
    write_verl_files(cfg, inputs.retriever_url, work)
    return [sys.executable, "-m", "verl.trainer.main_ppo", *verl_overrides(cfg, inputs, steps, work, name, trainer)]


def trl_command(cfg: BenchConfig, inputs: Inputs, steps: int, work: Path, name: str) -> list[str]:
    """``benchmarks/peers/trl_gpu_run.py`` at ``cfg``'s sizes (per-step JSON to ``<work>/trl_steps.json``)."""
    return [sys.executable, str(PEERS_DIR / "trl_gpu_run.py"), "--questions", str(inputs.trl_questions),
            "--model", inputs.model, "--steps", str(steps), "--out", str(work / "trl_steps.json"),
            "--output_dir", str(work / "trl_output"), "--prompts", str(cfg.prompts), "--generations", str(cfg.n),
            "--max_prompt_length", str(cfg.max_prompt_length), "--max_completion_length", str(cfg.max_response_length),
            "--lr", str(cfg.lr), "--micro_batch", str(cfg.trl_micro_batch),
            "--vllm_gpu_memory_utilization", str(cfg.gpu_memory_utilization), "--temperature", str(TEMPERATURE),
            "--top_p", str(TOP_P), "--stop", *STOP_STRINGS,
            *(["--gradient_checkpointing"] if cfg.gradient_checkpointing else [])]


def child_env(system: str, work: Path) -> dict:
    """The environment of a system's run: its sites first on ``PYTHONPATH`` and nothing of another's (veRL's
    workers also import ``benchmarks/peers/verl_search.py``, its agent loops); the peers get vLLM's own
    process model (our drivers' ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is ours)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([*SITES[system], *([str(PEERS_DIR)] if system == "verl" else [])])
    if system != "ours":
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    if system == "verl":
        env["VERL_FILE_LOGGER_PATH"] = str(work / "verl_metrics.jsonl")  # verl/utils/tracking.py FileLogger
    return env

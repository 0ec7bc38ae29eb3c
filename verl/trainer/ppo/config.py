"""The PPO/GRPO trainer's configuration: Search-R1's key tree as typed dataclasses.

``PPOConfig`` is the trainer's tree (``data``, ``actor_rollout_ref``, ``critic``, ``reward_model``,
``algorithm``, ``trainer``, ``rollout``, ``evaluation``, ``max_turns``, ``env``); each section is the dataclass of
the component it configures. The environment a run names (``env.name``) brings the run's class, a
subclass adding its own sections (Search-R1's: ``retriever``, ``do_search``, the format scores of
``reward_model``). ``verl/trainer/config/ppo_trainer.yaml`` and docs/configuration.md are generated
from the default environment's class (``python -m verl.trainer.ppo.config_docs``) and a test keeps
them in step. :func:`load_config` turns a composed Hydra tree into a checked, immutable config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, OmegaConf

from verl.algorithms.config import AlgorithmConfig
from verl.envs.base import EnvConfig
from verl.trainer.evaluation.config import EvaluationConfig
from verl.trainer.ppo.health import HealthConfig
from verl.utils.config import delete_key, leaf_defaults, to_typed
from verl.utils.dataset.config import DataConfig
from verl.utils.host_memory import HostMemoryConfig
from verl.workers.config import ActorRolloutRefConfig
from verl.workers.critic.config import CriticConfig
from verl.workers.reward_manager.config import RewardModelConfig

BACKENDS = ("ray", "local")


@dataclass(frozen=True)
class TrainerConfig:
    """The loop around the step: length, logging, checkpoints, devices (``trainer``)."""

    backend: str = "ray"
    """`ray` (workers as Ray actors; multi-GPU/multi-node) or `local` (one rank in the controller)"""
    total_epochs: int = 15
    """epochs when `total_training_steps` is null"""
    total_training_steps: Optional[int] = None
    """steps to run (wins over epochs; Search-R1's scripts: 1005)"""
    project_name: str = "Search-R1"
    """wandb project"""
    experiment_name: str = "nq-search-r1-ppo-qwen2.5-3b-em"
    """run name"""
    logger: List[str] = field(default_factory=lambda: ["console", "jsonl"])
    """any of `console`, `jsonl`, `tensorboard`, `wandb` (offline without `WANDB_API_KEY`)"""
    log_dir: str = "${.default_local_dir}/logs"
    """`metrics.jsonl`, tensorboard and wandb files"""
    nnodes: int = 1
    """Ray nodes, each holding `n_gpus_per_node` ranks; above 1, start a Ray cluster first (docs/multinode.md)"""
    n_gpus_per_node: int = 8
    """ranks per node (CPU processes when there is no GPU)"""
    dry_run: bool = False
    """print the run plan and where the ranks would go (checked against the running Ray cluster, if any:
    docs/multinode.md), then exit before any worker starts or model loads"""
    save_freq: int = 100
    """checkpoint every N steps (and at the end); <= 0 disables"""
    test_freq: int = 50
    """validate every N steps (and at the end); <= 0 disables"""
    val_before_train: bool = True
    """validate before the first step"""
    val_only: bool = False
    """validate (the resumed checkpoint) and exit"""
    validation_data_dir: Optional[str] = None
    """write per-sample validation generations to `<dir>/<step>.jsonl`, and their trajectory report to
    `<dir>/<step>.html` (docs/evaluation.md)"""
    validation_report_questions: int = 1000
    """trajectories the `<step>.html` report holds at most, taken source by source (its summary counts
    every question); 0: no report"""
    critic_warmup: int = 0
    """steps that update only the critic before the actor starts"""
    max_time_s: Optional[float] = None
    """wall-clock seconds the run may take from its process's start (a job's time limit): the step
    after which one more step, the final validation and the final checkpoint would not fit becomes
    the last, validated and checkpointed (the estimates are the slowest recent step, the last
    validation and the last save); the next run resumes from it. `null`: no limit"""
    seed: int = 1
    """seed of the controller's RNGs"""
    default_local_dir: str = "verl_checkpoints/${.experiment_name}"
    """checkpoint root: `global_step_N/{actor,critic,huggingface}`, `latest_checkpointed_iteration.txt`"""
    resume_mode: str = "auto"
    """`auto` (latest complete checkpoint), `disable`, or a `global_step_N` folder; a checkpoint trained on other
    data (`trainer_state.json` records the train files) or already at the target step stops the run at start"""
    max_actor_ckpt_to_keep: Optional[int] = None
    """keep at most N checkpoints, pruned as whole step folders (`null`: all); the best one (`keep_best`)
    is never pruned"""
    keep_best: Optional[str] = None
    """a validation metric to keep the best checkpoint of, higher is better (e.g. `val/test_em/all`): a
    validation that beats every earlier one (from step 1) saves a checkpoint there, recorded in
    `<default_local_dir>/best_checkpoint.json` and kept beside the latest; `null`: off"""
    health: HealthConfig = field(default_factory=HealthConfig)
    """training-health signals (`health/*`) and their alarms (verl/trainer/ppo/health.py)"""
    export_hf: bool = True
    """write `global_step_N/huggingface/` (loadable by `AutoModelForCausalLM.from_pretrained`)"""
    device_peak_flops: Optional[float] = None
    """peak FLOP/s per device for `perf/mfu/actor` (`null`: the known-GPU table or a CPU estimate)"""
    worker_env_vars: Optional[Dict[str, str]] = None
    """environment of the Ray worker processes; `null`: `MALLOC_ARENA_MAX=2` on CPU-only machines
    (glibc reads malloc settings at process start); with GPUs `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`
    unless the launching shell sets `PYTORCH_CUDA_ALLOC_CONF`; a mapping replaces that (`{}`: none)"""
    host_memory: HostMemoryConfig = field(default_factory=HostMemoryConfig)
    """CPU-only glibc heap tuning of the worker processes (no effect with GPUs)"""


@dataclass(frozen=True)
class RolloutPoolConfig:
    """GPUs of the rollout engines when they are apart from the training ranks (``rollout``; veRL's
    one-step-off-policy keys): used with ``actor_rollout_ref.hybrid_engine=false``."""

    nnodes: int = 1
    """Ray nodes of the rollout pool"""
    n_gpus_per_node: int = 0
    """rollout ranks per node, each an engine on a GPU of its own (CPU processes without GPUs); 0: the
    engines share the training ranks (the hybrid engine)"""


@dataclass(frozen=True)
class PPOConfig:
    """The trainer's part of a run: Search-R1's ``ppo_trainer.yaml`` tree plus newer veRL keys (an
    environment's class adds its own sections)."""

    data: DataConfig = field(default_factory=DataConfig)
    """prompts and token budgets"""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """actor, rollout engine and reference policy"""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """value model (PPO only)"""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """the rule reward"""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """advantage estimator and in-reward KL"""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """the training loop"""
    rollout: RolloutPoolConfig = field(default_factory=RolloutPoolConfig)
    """the rollout engines' own GPUs (split pools: `actor_rollout_ref.hybrid_engine=false`)"""
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    """`bash evaluate.sh` (verl/trainer/main_eval.py)"""
    max_turns: int = 2
    """maximum generate -> tool call rounds per trajectory (Search-R1's scripts: 2 to 4)"""
    env: EnvConfig = field(default_factory=EnvConfig)
    """the environment the agent loop runs (its tags, tools and rewards)"""


def environment_of(cfg: DictConfig | dict | PPOConfig):
    """The environment class a tree (or a typed config) names in ``env.name`` / ``env.module``.

    Raises:
        ConfigError: a malformed ``env`` section or an unknown name.
    """
    from verl.envs.registry import load_environment

    if isinstance(cfg, PPOConfig):
        return load_environment(cfg.env.name, cfg.env.module)
    tree = OmegaConf.create(cfg) if not isinstance(cfg, DictConfig) else cfg
    env = to_typed(EnvConfig, tree.get("env") if "env" in tree else {}, prefix="env")
    return load_environment(env.name, env.module)


def load_config(cfg: DictConfig | dict) -> PPOConfig:
    """A checked, immutable config from a composed Hydra tree (or any nested mapping).

    The environment named by ``env.name`` gives the configuration class (``PPOConfig`` or its
    subclass with the environment's sections). Compatibility keys (:mod:`verl.trainer.ppo.compat`)
    are taken out first, with one warning for each set to a value other than its default; the rest
    is typed by OmegaConf against the dataclasses, then
    :func:`verl.trainer.ppo.config_check.check_config` checks the values that belong together
    (batch sizes, registered algorithm names, budgets).

    Raises:
        ConfigError (a ValueError): an unknown key or environment, a wrong type or a bad
            combination, naming the key.
    """
    from verl.trainer.ppo.compat import pop_compat_keys
    from verl.trainer.ppo.config_check import check_config

    tree = pop_compat_keys(cfg)
    config_class = environment_of(tree).config_class
    config = to_typed(config_class, without_other_environment_defaults(tree, config_class))
    check_config(config)
    return config


def without_other_environment_defaults(tree: DictConfig, config_class: type) -> DictConfig:
    """``tree`` without the keys that the default environment declares and ``config_class`` does not,
    where they hold the default environment's value.

    ``ppo_trainer.yaml`` holds the default environment's whole tree (Search-R1's ``retriever``,
    format scores...); a run in another environment drops those defaults here, while a value the
    user set for such a key stays and is named as an unknown key by the typing.
    """
    from verl.envs.registry import load_environment

    default = EnvConfig()
    default_class = load_environment(default.name, default.module).config_class
    if config_class is default_class:
        return tree
    own = leaf_defaults(config_class)
    for key, value in leaf_defaults(default_class).items():
        if key not in own and OmegaConf.select(tree, key, default=object()) == value:
            delete_key(tree, key)
    return tree


def default_config(**sections: Any) -> PPOConfig:
    """The defaults with some sections replaced (tests, benchmarks): ``default_config(trainer={...})``;
    typed by the class of the environment ``sections`` name (default: ``search_r1``)."""
    return to_typed(environment_of(sections).config_class, sections)

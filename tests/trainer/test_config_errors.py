"""Configuration mistakes fail at start in one line naming the key, before any model is loaded;
Search-R1's own scripts get through unchanged."""

import dataclasses
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from verl.trainer.main_ppo import parse_config
from verl.trainer.ppo.config import PPOConfig, load_config
from verl.trainer.ppo.run_plan import make_run_plan
from verl.utils.config import ConfigError
from verl.workers import batching

from .helpers import search_r1_script

SCRIPTS = Path(__file__).resolve().parent / "data" / "search_r1_scripts"


def _run_main(*overrides: str, module: str = "verl.trainer.main_ppo") -> subprocess.CompletedProcess:
    # A model path that does not exist proves the failure comes before any model loading.
    return subprocess.run([sys.executable, "-m", module, "actor_rollout_ref.model.path=/nonexistent/model",
                           *overrides], capture_output=True, text=True, timeout=120)


def test_defaults_pass_checks_and_are_immutable():
    config = load_config({})
    assert isinstance(config, PPOConfig)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.trainer.total_epochs = 3  # type: ignore[misc]


@pytest.mark.parametrize("override, message", [
    ("trainer.total_epochs=abc", "trainer.total_epochs: Value 'abc' of type 'str' could not be converted to Integer"),
    ("trainer.total_epoch=3", "trainer.total_epoch: Key 'total_epoch' not in 'TrainerConfig'; did you mean "
                              "'total_epochs'?"),
    ("data.train_batch_size=100", "data.train_batch_size (100) is not divisible by actor.ppo_mini_batch_size (256)"),
    ("algorithm.adv_estimator=grpoo", "algorithm.adv_estimator='grpoo': choose one of"),
    ("actor_rollout_ref.rollout.val_kwargs.do_sample=true", "set actor_rollout_ref.rollout.val_kwargs.temperature > 0"),
    ("env.name=search_r2", "error: env.name: no environment 'search_r2' (known: search_r1, tool_call"),
    ("+recipe=search_r1_grpoo", "error: recipe: no preset 'search_r1_grpoo' (known: "),
    ("reward_model.style=fmt", "error: reward_model.style: 'fmt' is not one of em, format"),
])
def test_command_line_errors_name_the_key_in_one_line(override, message):
    result = _run_main(override)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("overrides, message", [
    (["actor_rollout_ref.actor.ppo_micro_batch_size=12"],
     "actor.ppo_micro_batch_size (12) is not divisible by data-parallel size (nnodes x n_gpus_per_node) (8)"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size=48"],
     "actor.ppo_mini_batch_size x rollout.n rows per rank (32) is not divisible by actor.ppo_micro_batch_size "
     "per rank (6)"),
    (["critic.ppo_micro_batch_size=3"],
     "critic.ppo_micro_batch_size (3) is not divisible by data-parallel size (nnodes x n_gpus_per_node) (8)"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5"],
     "actor.ppo_mini_batch_size x rollout.n rows per rank (32) is not divisible by actor.ppo_micro_batch_size "
     "per rank (5)"),
    (["algorithm.adv_estimator=grpo"], "algorithm.adv_estimator=grpo needs groups"),
    (["actor_rollout_ref.rollout.name=sglang"], "actor_rollout_ref.rollout.name='sglang'"),
    (["actor_rollout_ref.rollout.temperature=hot"], "actor_rollout_ref.rollout.temperature: Value 'hot'"),
    (["trainer.resume_mode=/no/such/checkpoint"], "trainer.resume_mode='/no/such/checkpoint'"),
    (["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.n_agent=5"], "disagree; set only one"),
    (["actor_rollout_ref.rollout.val_kwargs.do_sample=true"],
     "actor_rollout_ref.rollout.val_kwargs.do_sample=true samples nothing with val_kwargs.temperature=0.0: set "
     "actor_rollout_ref.rollout.val_kwargs.temperature > 0"),
    (["actor_rollout_ref.rollout.temperature=0"], "actor_rollout_ref.rollout.temperature=0.0 must be > 0"),
])
def test_parse_config_names_culprit(overrides, message):
    with pytest.raises(ConfigError) as error:
        parse_config(overrides)
    assert message in str(error.value)


def test_the_environment_brings_its_sections():
    """env.name picks the run's config class: tool_call has the retriever but not Search-R1's format
    scores; a key of another environment is an unknown key."""
    tool_call = parse_config(["env.name=tool_call", "retriever.topk=5"])
    assert type(tool_call).__name__ == "ToolCallConfig" and tool_call.retriever.topk == 5
    with pytest.raises(ConfigError, match="reward_model.structure_format_score: Key 'structure_format_score' not in"):
        parse_config(["env.name=tool_call", "reward_model.structure_format_score=0.2"])


RECIPES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "verl" / "trainer" / "config" / "recipe").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_every_recipe_passes_the_start_up_check_on_each_algorithm(recipe, algo):
    """Each preset stacked on a training script's recipe is a valid run (keys, types, batch sizes)."""
    config = parse_config([f"+recipe=search_r1_{algo}", f"+recipe={recipe}"])
    assert make_run_plan(config, 10).total_training_steps > 0


def test_recipes_stack_in_order_and_overrides_win():
    """A script's recipe, the user's recipe on top, then key=value over every recipe."""
    grpo = parse_config(["+recipe=search_r1_grpo"])
    assert grpo.algorithm.adv_estimator == "grpo" and grpo.actor_rollout_ref.rollout.n == 5
    embedded = parse_config(["+recipe=search_r1_grpo", "+recipe=embedded_cpu_grpo", "+recipe=format_reward",
                             "data.train_batch_size=4"])
    assert embedded.actor_rollout_ref.rollout.n == 4 and embedded.data.val_batch_size == 8
    assert embedded.data.train_batch_size == 4 and embedded.reward_model.structure_format_score == 0.2
    ppo = parse_config(["recipe=[embedded_cpu_ppo]"])
    assert ppo.algorithm.adv_estimator == "gae" and ppo.algorithm.use_kl_in_reward


def test_validation_sampling_with_a_temperature_passes():
    config = parse_config(["actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                           "actor_rollout_ref.rollout.val_kwargs.temperature=0.7"])
    assert config.actor_rollout_ref.rollout.val_kwargs.temperature == 0.7


@pytest.mark.parametrize("key, value", [
    ("algorithm.adv_estimator", "grpo_typo"), ("actor_rollout_ref.actor.policy_loss.loss_mode", "vanila"),
    ("algorithm.kl_penalty", "kl3"), ("actor_rollout_ref.actor.kl_loss_type", "lowvar"),
    ("actor_rollout_ref.actor.tis_level", "tokens"), ("actor_rollout_ref.actor.tis_mode", "clip"),
    ("algorithm.kl_ctrl.type", "pid"), ("actor_rollout_ref.actor.loss_agg_mode", "token_mean"),
    ("critic.model.value_head_init", "gaussian"),
])
def test_algorithm_names_are_checked_against_the_registries(key, value):
    with pytest.raises(ConfigError, match=f"{key}='{value}': choose one of"):
        parse_config([f"{key}={value}"])


def test_every_group_estimator_of_the_registry_rejects_one_response_per_prompt():
    from verl import algorithms

    group_estimators = [name for name, entry in algorithms.ADV_ESTIMATOR_REGISTRY.items() if entry.needs_groups]
    assert "reinforce_plus_plus_baseline" in group_estimators and "grpo" in group_estimators
    for name in group_estimators:
        with pytest.raises(ConfigError, match="needs groups"):
            parse_config([f"algorithm.adv_estimator={name}"])
        parse_config([f"algorithm.adv_estimator={name}", "actor_rollout_ref.rollout.n=5"])


def test_a_registered_loss_restricts_its_aggregation_modes():
    from verl import algorithms

    @algorithms.register_policy_loss("test_seq_only", loss_agg_modes=("seq-mean-token-mean",))
    def seq_only(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="seq-mean-token-mean",
                 config=None, rollout_is_weights=None):
        raise NotImplementedError

    try:
        with pytest.raises(ConfigError, match="loss_agg_mode='token-mean' is not defined for"):
            parse_config(["actor_rollout_ref.actor.policy_loss.loss_mode=test_seq_only"])
        parse_config(["actor_rollout_ref.actor.policy_loss.loss_mode=test_seq_only",
                      "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"])
    finally:
        del algorithms.POLICY_LOSS_REGISTRY["test_seq_only"]


def test_plus_form_and_plain_form_both_set_declared_keys():
    config = parse_config(["+trainer.val_only=true", "+trainer.val_before_train=false",
                           "+actor_rollout_ref.model.attn_implementation=sdpa"])
    assert config.trainer.val_only and not config.trainer.val_before_train
    assert config.actor_rollout_ref.model.attn_implementation == "sdpa"
    with pytest.raises(ConfigError, match="trainer.no_such_key: Key 'no_such_key' not in 'TrainerConfig'"):
        parse_config(["+trainer.no_such_key=1"])


def test_verl_offload_keys_are_accepted_for_every_role():
    """veRL's `param_offload` (between phases, the default) and `offload_policy` (FSDP2's CPU offload)."""
    roles = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic.model")
    config = parse_config([f"{role}.fsdp_config.{key}={value}" for role in roles
                           for key, value in (("param_offload", "false"), ("offload_policy", "true"))])
    defaults = parse_config([])
    for section in (lambda c: c.actor_rollout_ref.actor, lambda c: c.actor_rollout_ref.ref, lambda c: c.critic.model):
        assert section(config).fsdp_config.offload_policy and not section(config).fsdp_config.param_offload
        assert section(defaults).fsdp_config.param_offload and not section(defaults).fsdp_config.offload_policy
    paper = parse_config(["+recipe=search_r1_ppo", "+recipe=paper_scale_one_gpu"])
    for fsdp in (paper.actor_rollout_ref.actor.fsdp_config, paper.critic.model.fsdp_config):
        assert (fsdp.param_offload, fsdp.offload_policy, fsdp.optimizer_offload) == (False, False, True)
    assert paper.actor_rollout_ref.ref.fsdp_config.offload_policy  # as in its measured runs
    # the asynchronous rollout, its engine core apart: the faster whole step at this shape
    assert (paper.actor_rollout_ref.rollout.mode, paper.actor_rollout_ref.rollout.engine_process) == ("async", True)
    # its forward-only passes take 4x the update's token budget a micro-batch
    node = paper.actor_rollout_ref
    for name, pass_config in (("rollout", node.rollout), ("ref", node.ref)):
        micro = batching.log_prob_batching(name, pass_config, node.actor, world_size=1)
        assert micro.use_dynamic_bsz and micro.max_token_len == 4 * node.actor.ppo_max_token_len_per_gpu == 65536


def test_engine_length_follows_the_data_budgets_and_a_short_one_is_rejected():
    config = parse_config(["data.max_prompt_length=4096", "data.max_response_length=500"])
    plan = make_run_plan(config, batches_per_epoch=10)
    assert plan.engine_max_model_len == 4596
    assert make_run_plan(parse_config(["actor_rollout_ref.rollout.max_model_len=8192"]), 10).engine_max_model_len == 8192
    with pytest.raises(ConfigError, match="max_model_len=2048 is below data.max_prompt_length \\+ "
                                          "data.max_response_length = 4096 \\+ 500 = 4596"):
        parse_config(["actor_rollout_ref.rollout.max_model_len=2048"])


def test_compat_keys_are_accepted_and_warn_only_when_changed(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.trainer.ppo.compat"):
        parse_config(["actor_rollout_ref.actor.state_masking=true", "algorithm.no_think_rl=false",
                      "actor_rollout_ref.rollout.prompt_length=4096"])
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="verl.trainer.ppo.compat"):
        parse_config(["actor_rollout_ref.rollout.ignore_eos=true", "trainer.default_hdfs_dir=/hdfs/x",
                      "actor_rollout_ref.rollout.response_length=64"])
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert any(m.startswith("actor_rollout_ref.rollout.ignore_eos=True has no effect here") for m in messages)
    assert any(m.startswith("actor_rollout_ref.rollout.response_length=64 has no effect here") for m in messages)


def _script_overrides(path: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """A Search-R1 script's module and overrides as its shell would pass them, paths substituted."""
    return search_r1_script(path, {
        "$BASE_MODEL": str(tmp_path / "model"), "$DATA_DIR": str(tmp_path / "data"),
        "$TRAIN_DATA_DIR": str(tmp_path / "data"), "$TEST_DATA_DIR": str(tmp_path / "data"),
        "$EXPERIMENT_NAME": "search-r1-script", "$WAND_PROJECT": "Search-R1", "$N_NODES": "4"})


@pytest.mark.parametrize("script", sorted(SCRIPTS.glob("*.args")), ids=lambda p: p.stem)
def test_search_r1_scripts_pass_the_start_up_check(script, tmp_path):
    module, overrides = _script_overrides(script, tmp_path)
    assert module in ("verl.trainer.main_ppo", "verl.trainer.main_ppo_format")
    __import__(module)  # the entry module exists
    defaults = ["reward_model.style=format"] if module.endswith("_format") else []
    config = parse_config([*defaults, *overrides])
    assert config.actor_rollout_ref.model.path == str(tmp_path / "model")
    assert config.retriever.url == "http://127.0.0.1:8000/retrieve"


def test_format_entry_runs_the_same_checks():
    result = _run_main("trainer.total_epoch=3", module="verl.trainer.main_ppo_format")
    assert result.returncode == 2 and "trainer.total_epoch: Key 'total_epoch' not in" in result.stderr


@pytest.mark.parametrize("overrides, message", [
    (["actor_rollout_ref.rollout.staleness=2"], r"rollout.staleness=2: choose 0 \(on-policy\) or 1"),
    (["actor_rollout_ref.rollout.staleness=1", "actor_rollout_ref.rollout.name=hf"],
     r"staleness=1 needs actor_rollout_ref.rollout.name=vllm"),
    (["actor_rollout_ref.rollout.staleness=1", "actor_rollout_ref.rollout.name=vllm",
      "actor_rollout_ref.rollout.free_cache_engine=true"], r"set actor_rollout_ref.rollout.free_cache_engine=false"),
    (["actor_rollout_ref.rollout.staleness=1", "actor_rollout_ref.rollout.name=vllm",
      "actor_rollout_ref.rollout.free_cache_engine=false"], r"set actor_rollout_ref.actor.tis_imp_ratio_cap > 0"),
])
def test_staleness_needs_its_companions(overrides, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(overrides)


@pytest.mark.parametrize("overrides, message", [
    (["rollout.n_gpus_per_node=2"], r"rollout.n_gpus_per_node=2 gives the engines GPUs of their own: set "
                                    r"actor_rollout_ref.hybrid_engine=false too"),
    (["actor_rollout_ref.hybrid_engine=false"], r"hybrid_engine=false needs the engines' own GPUs: rollout.nnodes=1 "
                                                r"x rollout.n_gpus_per_node=0 \(each >= 1\)"),
    (["actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1", "trainer.backend=local"],
     r"runs the engines in Ray workers of their own: set trainer.backend=ray \(got 'local'\)"),
    (["actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=3", "actor_rollout_ref.rollout.name=vllm",
      "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
     r"tensor_model_parallel_size=2 must divide rollout.n_gpus_per_node=3"),
])
def test_split_pools_need_their_own_ranks(overrides, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(overrides)


def test_split_pools_engine_ranks_need_not_divide_the_training_batches():
    """An engine rank alone runs no log-prob or update pass: 6 engines beside 2 training ranks start,
    though Search-R1's 64/128-row micro-batches do not split over 6 ranks (a training rank's would not)."""
    from verl.workers.fsdp_workers import role_batchings

    cfg = parse_config(["actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=6",
                        "trainer.n_gpus_per_node=2"]).actor_rollout_ref
    assert role_batchings(cfg, 5, 6, is_actor=False, is_ref=False) == (None, None, None)
    update, old, ref = role_batchings(cfg, 5, 2, is_actor=True, is_ref=True)
    assert update is not None and old.rows == ref.rows == 64
    with pytest.raises(ValueError, match=r"\(64\) is not divisible by data-parallel size .* \(6\)"):
        role_batchings(cfg, 5, 6, is_actor=True, is_ref=False)


def test_split_pools_let_staleness_keep_the_kv_cache_setting():
    """Apart from the actor the engine is never released, so staleness 1 does not ask for
    free_cache_engine=false there."""
    cfg = parse_config(["actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1",
                        "actor_rollout_ref.rollout.staleness=1", "actor_rollout_ref.rollout.name=vllm",
                        "actor_rollout_ref.rollout.free_cache_engine=true", "actor_rollout_ref.actor.tis_imp_ratio_cap=2"])
    assert not cfg.actor_rollout_ref.hybrid_engine and cfg.rollout.n_gpus_per_node == 1


@pytest.mark.parametrize("overrides, message", [
    (["actor_rollout_ref.rollout.name=hf"], r"frontend_process=true is for the vllm engine; got .*name='hf'"),
    (["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async"],
     r"frontend_process=true serves the sync loop; set actor_rollout_ref.rollout.mode=sync"),
    (["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
     r"frontend_process=true needs actor_rollout_ref.rollout.tensor_model_parallel_size=1, got 2"),
])
def test_frontend_process_needs_the_sync_vllm_loop(overrides, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(["actor_rollout_ref.rollout.frontend_process=true", *overrides])

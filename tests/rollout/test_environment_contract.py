"""The contract every environment keeps with the agent loop, checked on both of this package's
environments (``search_r1`` and ``tool_call``) in both rollout modes: real tokenizer, real retriever
server, scripted engine (the engine is not what is under test here).

Select with ``pytest -k "environment or tool_call"``.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from search_r1.envs.search_r1 import SearchR1Environment
from search_r1.envs.search_tool import SearchTool
from search_r1.envs.tool_call import ToolCallEnvironment
from search_r1.envs.search_r1.prompts import prompt_messages
from tests.rollout.scripted import ScriptedEngine
from verl.envs import load_environment
from verl.protocol import DataProto
from verl.utils.config import ConfigError
from verl.utils.dataset.rl_dataset import render_prompt
from verl.workers.reward_manager import RewardManager
from verl.workers.rollout.agent_loop import LoopConfig, MultiTurnRollout
from verl.workers.rollout.base import SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=96)
QUESTION = "Where was Manuel Díaz Rodríguez born?"

# How each environment's model writes a search, an answer and a malformed action.
WRITERS = {
    "search_r1": {"search": "<think>look it up</think>\n<search> {} </search>",
                  "answer": "<think>found</think>\n<answer> {} </answer>",
                  "invalid": "<search>   </search>"},
    "tool_call": {"search": '<tool_call>\n{{"name": "search", "arguments": {{"query": "{}"}}}}\n</tool_call>',
                  "answer": "<answer> {} </answer>",
                  "invalid": '<tool_call>\n{"name": "search", "arguments": {"query": }}\n</tool_call>'},
}
ENVIRONMENTS = {"search_r1": SearchR1Environment, "tool_call": ToolCallEnvironment}


@pytest.fixture(params=sorted(ENVIRONMENTS))
def env_name(request) -> str:
    return request.param


def make_env(name: str, tokenizer, retriever, max_obs_length: int = 200):
    return ENVIRONMENTS[name](tokenizer, SearchTool(retriever), max_obs_length)


def prompt_ids(env, tokenizer, question: str) -> list[int]:
    """The prompt as the trainer's data loader makes it from a Search-R1 row."""
    row = {"prompt": prompt_messages(question)}
    messages = env.prompt_messages(row, row["prompt"])
    text = render_prompt(tokenizer, messages, **env.chat_template_kwargs())
    return tokenizer.encode(text, add_special_tokens=False)


def run(env, tokenizer, scripts, mode, **budgets):
    prompts = [prompt_ids(env, tokenizer, f"{QUESTION} ({i})") for i in range(len(scripts))]
    engine = ScriptedEngine(tokenizer, prompts, scripts)
    loop = LoopConfig(**{"max_turns": 2, "max_start_length": 2048, "max_prompt_length": 4096,
                         "max_response_length": 600, "mode": mode, "log_probs": True, **budgets})
    out = MultiTurnRollout(tokenizer, engine, env, loop).run(
        DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts}), PARAMS)
    return prompts, out


def spans(out, row: int, generated: bool) -> list[list[int]]:
    """The runs of generated (mask 1) or environment (mask 0) tokens of a row's response."""
    real = out.batch["attention_mask"][row, out.batch["prompts"].shape[1]:].bool()
    ids = out.batch["responses"][row][real].tolist()
    mask = out.batch["response_mask"][row][real].tolist()
    runs, current = [], []
    for token, m in zip(ids, mask):
        if m == int(generated):
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def test_environment_search_invalid_answer_and_reward(env_name, tokenizer, retriever, mode):
    write = WRITERS[env_name]
    env = make_env(env_name, tokenizer, retriever)
    scripts = [[write["search"].format("Manuel Díaz Rodríguez"), write["answer"].format("Caracas")],
               [write["answer"].format("Caracas")],
               [write["invalid"], write["answer"].format("Lima")]]
    prompts, out = run(env, tokenizer, scripts, mode)
    b = out.batch
    assert b["finished"].tolist() == [1, 1, 1] and b["truncated"].tolist() == [0, 0, 0]
    assert b["turns"].tolist() == [2, 1, 2] and b["valid_search"].tolist() == [1, 0, 0]
    assert b["valid_action"].tolist() == [2, 1, 1] and b["empty_search"].tolist() == [0, 0, 0]
    for row, prompt in enumerate(prompts):  # token-exact: the sequence is prompt + response
        seq = b["input_ids"][row][b["attention_mask"][row].bool()].tolist()
        assert seq[:len(prompt)] == prompt
    # the search's observation is the environment's rendering of the retriever's passages
    docs = retriever.retrieve(["Manuel Díaz Rodríguez"])[0]
    assert docs and spans(out, 0, generated=False) == [env.render(docs).ids]
    assert env.render(docs).counts == {"obs_truncated": 0, "empty_search": 0}
    # the invalid action got the environment's answer to it, and the row went on
    (invalid,) = spans(out, 2, generated=False)
    assert invalid == env.invalid(env.parse(write["invalid"])).ids
    # the environment's reward: EM on the answer, the model's own words only
    out.non_tensor_batch["data_source"] = np.array(["nq"] * 3, dtype=object)
    out.non_tensor_batch["reward_model"] = np.array([{"ground_truth": {"target": ["Caracas"]}}] * 3, dtype=object)
    result = RewardManager(tokenizer, env.compute_score)(out, return_dict=True)
    assert result["reward_extra_info"]["em"] == [1.0, 1.0, 0.0]
    answers = [env.extract_answer(tokenizer.decode(run_ids, skip_special_tokens=True))
               for run_ids in (spans(out, row, True)[-1] for row in range(3))]
    assert answers == ["Caracas", "Caracas", "Lima"]


def test_environment_observation_is_cut_inside_its_wrapper(env_name, tokenizer, retriever, mode):
    full = make_env(env_name, tokenizer, retriever, max_obs_length=1000)
    budget = len(full.observations.head_ids) + len(full.observations.tail_ids) + 12
    env = make_env(env_name, tokenizer, retriever, max_obs_length=budget)
    write = WRITERS[env_name]
    _, out = run(env, tokenizer, [[write["search"].format("England writer journalist"), write["answer"].format("x")]],
                 mode)
    (observation,) = spans(out, 0, generated=False)
    assert len(observation) == budget and out.batch["obs_truncated"].tolist() == [1]
    assert observation[-len(env.observations.tail_ids):] == env.observations.tail_ids  # the wrapper closes


def test_environment_modes_agree_and_final_turn_runs_no_tool(env_name, tokenizer, retriever):
    write = WRITERS[env_name]
    scripts = [[write["search"].format("England writer"), write["search"].format("Berkshire")],
               [write["answer"].format("x")]]
    outs = {mode: run(make_env(env_name, tokenizer, retriever), tokenizer, scripts, mode, max_turns=1)[1]
            for mode in ("sync", "async")}
    for key in ("responses", "response_mask", "turns", "finished", *ENVIRONMENTS[env_name].counters):
        assert outs["sync"].batch[key].tolist() == outs["async"].batch[key].tolist(), key
    # max_turns=1: the second search is the final turn's and is not run (the row ends unanswered)
    assert outs["sync"].batch["valid_search"].tolist() == [2, 0]
    assert outs["sync"].batch["finished"].tolist() == [0, 1]
    assert len(spans(outs["sync"], 0, generated=False)) == 1


def test_environment_no_search_gives_empty_observations(env_name, tokenizer, mode):
    write = WRITERS[env_name]
    env = make_env(env_name, tokenizer, None)
    _, out = run(env, tokenizer, [[write["search"].format("anything"), write["answer"].format("x")]], mode)
    assert out.batch["empty_search"].tolist() == [1] and spans(out, 0, False) == [env.render([]).ids]


def test_environment_registry_and_pickling(env_name, tokenizer, retriever):
    env = make_env(env_name, tokenizer, retriever)
    assert load_environment(env_name) is type(env) and env.name == env_name
    docs = retriever.retrieve(["Berkshire"])[0]
    env.render(docs)
    # what the agent loop sends to the rollout workers every step: no tokenizer (the worker binds
    # its own), no observation cache
    sent = pickle.dumps(env)
    assert len(sent) < len(pickle.dumps(tokenizer)) / 10
    copy = pickle.loads(sent)
    assert copy.tokenizer is None and not copy.observations._cache
    with pytest.raises(RuntimeError, match="unpickled without its tokenizer: bind"):
        copy.render(docs)
    assert copy.bind(tokenizer) is copy and copy.render(docs).ids == env.render(docs).ids
    assert copy.stop_strings == env.stop_strings and copy.max_concurrent_calls == env.max_concurrent_calls


def test_unknown_environment_is_one_line():
    with pytest.raises(ConfigError, match=r"^env.name: no environment 'search_r2' \(known: search_r1, tool_call"):
        load_environment("search_r2")
    with pytest.raises(ConfigError, match=r"^env.module: cannot import 'no_such_pkg.env'"):
        load_environment("x", "no_such_pkg.env")


def test_environment_free_rl_library():
    """verl imports nothing of search_r1: no import line, and the trainer's modules load without it."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    verl = Path(__file__).resolve().parents[2] / "verl"
    lines = [f"{path}:{number}" for path in verl.rglob("*.py")
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.match(r"\s*(from|import) search_r1", line)]
    assert lines == []
    code = ("import sys, verl.trainer.main_ppo, verl.trainer.main_eval, verl.trainer.ppo.trainer_setup, "
            "verl.trainer.fsdp_sft_trainer, verl.workers.fsdp_workers, verl.workers.rollout.agent_loop.async_loop; "
            "print(sorted(m for m in sys.modules if m.startswith('search_r1')))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"

"""benchmarks/vs_peers_gpu.py (issue 27) and its commands (benchmarks/peers/commands.py): each system's
command is a configuration that system accepts, the peers' reward scores as ours, each system's per-step
records summarise into the right medians and ratios, and each child sees only its own site. The veRL and
TRL checks read the wheels that benchmarks/device/peer_wheels.sh downloads into .whl-peers/ (not in a clean
clone: they skip there).

Configuration ``search`` (multi-turn): our command passes our config check at the learning recipe's
rollout; veRL's own code (unpacked from its 0.9.1 wheel, in a child process) loads our tool config, runs its
``ToolAgentLoop`` with our parser, tool and stop strings against OUR retriever server started by the driver
on a tiny corpus (the one stand-in: a scripted LLM in place of veRL's vLLM server, which needs a GPU), and
its reward reads the result as ours; TRL 1.16's trainer refuses tools for the warm start's chat template."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

import commands  # noqa: E402
import em_reward  # noqa: E402
import trl_gpu_run  # noqa: E402
import vs_peers_gpu as bench  # noqa: E402

from search_r1.envs.search_r1.prompts import prompt_messages  # noqa: E402
from search_r1.envs.search_r1.reward import compute_score_em  # noqa: E402
from verl.trainer.main_ppo import parse_config  # noqa: E402
from verl.trainer.ppo.run_plan import response_width  # noqa: E402
from verl.utils.model_zoo import smollm2_dir  # noqa: E402

URL = "http://127.0.0.1:8123/retrieve"
INPUTS = commands.Inputs("/models/policy", Path("/data/vs_peers"), Path("/data/vs_peers/trl_questions.jsonl"), URL)
SINGLE_TURN = sorted(name for name, cfg in bench.CONFIGS.items() if not cfg.max_turns)


@pytest.mark.parametrize("name", SINGLE_TURN)
def test_our_command_passes_our_config_check_single_turn(name, tmp_path):
    cfg = bench.CONFIGS[name]
    cmd = commands.ours_command(cfg, INPUTS, 5, tmp_path, name)
    assert cmd[1].endswith("scripts/quickstart.py") and "--no-retriever" in cmd
    config = parse_config(cmd[cmd.index("+recipe=search_r1_grpo"):])
    assert config.max_turns == 0 and config.do_search is False
    assert config.data.train_batch_size == cfg.prompts == config.actor_rollout_ref.actor.ppo_mini_batch_size
    assert config.actor_rollout_ref.rollout.n == cfg.n and config.data.max_response_length == cfg.max_response_length
    assert config.actor_rollout_ref.model.enable_gradient_checkpointing == cfg.gradient_checkpointing
    assert config.actor_rollout_ref.actor.use_kl_loss and config.actor_rollout_ref.actor.kl_loss_coef == 0.001
    # the peers' loss: no entropy bonus (veRL's default, TRL has none), not Search-R1's 0.001
    assert config.actor_rollout_ref.actor.entropy_coeff == commands.ENTROPY_COEFF == 0
    assert config.trainer.total_training_steps == 5 and config.reward_model.style == "em"
    # the peers' sampling (veRL's and TRL's defaults), not Search-R1's top_p 0.95
    assert (config.actor_rollout_ref.rollout.temperature, config.actor_rollout_ref.rollout.top_p) == (1.0, 1.0)
    # one generate call: the sync loop on an in-process engine, over the learning recipe's async rollout
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.mode, rollout.engine_process) == ("sync", False)


def test_our_search_command_passes_our_config_check_at_the_learning_recipes_rollout(tmp_path):
    cfg = bench.CONFIGS["search"]
    cmd = commands.ours_command(cfg, INPUTS, 5, tmp_path, "search")
    assert "--no-retriever" not in cmd  # the driver's server answers at the URL
    config = parse_config(cmd[cmd.index("+recipe=search_r1_grpo"):])
    assert config.max_turns == cfg.max_turns == 2 and config.do_search is True
    assert config.retriever.url == URL and config.retriever.topk == commands.RETRIEVER_TOPK == 3
    assert config.data.max_start_length == 320 and config.data.max_response_length == 320
    assert config.data.max_obs_length == 384 and config.data.max_prompt_length == 2048
    assert response_width(config) == cfg.response_width == 1728  # our run plan's trajectory width
    assert config.data.train_batch_size == 64 and config.actor_rollout_ref.rollout.n == 8
    assert config.actor_rollout_ref.rollout.top_p == commands.TOP_P == 1.0
    assert config.actor_rollout_ref.actor.use_kl_loss and config.reward_model.style == "em"
    assert config.actor_rollout_ref.actor.entropy_coeff == commands.ENTROPY_COEFF
    # searches to overlap: the learning recipe's rollout, async with the engine core apart
    assert (config.actor_rollout_ref.rollout.mode, config.actor_rollout_ref.rollout.engine_process) == ("async", True)
    with pytest.raises(ValueError, match="retriever server's URL"):
        commands.ours_command(cfg, commands.Inputs("/m", Path("/d"), Path("/q")), 5, tmp_path, "search")


CASES = [
    ("<think>x</think><answer> Paris </answer>", ["Paris"]),
    ("<answer>the Eiffel Tower.</answer>", {"target": np.array(["Eiffel tower"], dtype=object)}),
    ("<answer>A</answer>", ["a"]),
    ("<answer></answer>", ["a"]),
    ("<answer>London</answer> then <answer>Paris</answer>", ["Paris"]),
    ("<answer>London</answer>", ["Paris", "paris france"]),
    ("no answer here", ["Paris"]),
    ("<information><answer>Paris</answer></information>", ["Paris"]),
    ("<answer>Rome</answer><information>Doc 1 <answer>Paris</answer>", ["Paris"]),
    ("<search>q</search>" + em_reward._INVALID_ACTION_MESSAGE + "<answer>1,000</answer>", ["1000"]),
    ("<answer>Beijing</answer>", "Beijing"),
]


@pytest.mark.parametrize("text,gold", CASES)
def test_the_peers_reward_scores_as_ours(text, gold):
    assert em_reward.compute_score("nq", text, gold) == compute_score_em(text, gold)
    assert em_reward.compute_score_em(text, gold, format_score=0.1) == compute_score_em(text, gold, format_score=0.1)
    target = gold["target"] if isinstance(gold, dict) else gold
    assert em_reward.em_reward([[{"role": "assistant", "content": text}]], [target]) == [compute_score_em(text, gold)]


def test_each_systems_records_summarise_into_medians_and_ratios(tmp_path):
    cfg = bench.CONFIGS["learning"]
    # ours: verl/utils/tracking.py JsonlLogger.log writes {"step": N, <metric>: value, ...} a line
    ours = tmp_path / "metrics.jsonl"
    ours.write_text("".join(json.dumps({"step": i + 1, "timing_s/step": s, "timing_s/gen": s / 2, "timing_s/ref": 1.0,
                                        "timing_s/update_actor": 2.0, "timing_s/weight_sync": 0.1,
                                        "response_length/mean": 100.0, "perf/total_num_tokens": 1000.0 * s,
                                        "perf/max_memory_allocated_gb/update_actor": 20.0 + i,
                                        "perf/max_memory_allocated_gb/ref": 10.0,
                                        "perf/max_memory_reserved_gb/update_actor": 30.0 + i}) + "\n"
                            for i, s in enumerate((60.0, 6.0, 8.0, 7.0))))
    # veRL 0.9.1: verl/utils/tracking.py FileLogger.log writes {"step": N, "data": {...}} (orjson) a line
    verl = tmp_path / "verl_metrics.jsonl"
    verl.write_text("".join(json.dumps({"step": i + 1, "data": {"timing_s/step": s, "timing_s/gen": 4.0,
                                                                "timing_s/old_log_prob": 1.0, "timing_s/ref": 1.0,
                                                                "timing_s/update_actor": 3.0, "timing_s/update_weights": 0.5,
                                                                "response_length/mean": 200.0, "perf/total_num_tokens": 5e5,
                                                                "actor/perf/max_memory_allocated_gb": 30.0,
                                                                "actor/perf/max_memory_reserved_gb": 35.0}}) + "\n"
                            for i, s in enumerate((90.0, 10.0, 12.0, 11.0))))
    steps = bench.ours_records(ours, cfg)
    assert [s["step_s"] for s in steps] == [60.0, 6.0, 8.0, 7.0] and steps[1]["log_prob_s"] == 1.0
    assert steps[0]["generated_tokens"] == 100.0 * 64 * 8 and steps[3]["memory_gib"] == 23.0
    assert steps[3]["memory_reserved_gib"] == 33.0  # the largest over the phases, allocated and reserved apart
    summary = bench.summarise(steps, warmup=1)
    assert summary["steps_measured"] == 3 and summary["enough_steps"] and summary["median"]["step_s"] == 7.0
    assert summary["generated_tokens_per_s"] == pytest.approx(51200 / 3.5)
    assert summary["step_tokens_per_s_per_gpu"] == 1000.0
    verl_steps = bench.verl_records(verl, cfg)
    assert verl_steps[1] == {"step_s": 10.0, "gen_s": 4.0, "log_prob_s": 2.0, "update_s": 3.0, "weight_sync_s": 0.5,
                             "generated_tokens": 200.0 * 64 * 8, "total_tokens": 5e5, "memory_gib": 30.0,
                             "memory_reserved_gib": 35.0, "searches": None}
    results = {"learning": {"ours": {**summary, "peak_gpu_memory_gib": 50.0},
                            "verl": {**bench.summarise(verl_steps, 1), "peak_gpu_memory_gib": 80.0},
                            "trl": {"steps_measured": 0, "peak_gpu_memory_gib": 40.0}}}
    assert bench.ratios(results, "verl", "step_s", False) == {"learning": round(11.0 / 7.0, 3)}
    assert bench.ratios(results, "trl", "step_s", False) == {}  # no TRL step measured: no ratio
    # nor a memory ratio: a run cut before its steps peaked at start-up alone
    assert bench.ratios(results, "trl", "peak_gpu_memory_gib", True) == {}
    assert bench.ratios(results, "verl", "peak_gpu_memory_gib", True) == {"learning": 0.625}
    # the tokens a step generated, ours over the peer's: medians 51,200 against 102,400
    block = bench.ratio_block(results)
    assert block["ratio_generated_vs_verl"] == {"learning": 0.5} and block["ratio_generated_vs_trl"] == {}
    assert block["ratio_step_vs_verl"] == {"learning": round(11.0 / 7.0, 3)} and len(block) == 6
    assert bench.ours_records(tmp_path / "missing.jsonl", cfg) == [] and bench.summarise([], 1) == {"steps_measured": 0}


def test_search_records_count_searches_a_row_in_both_systems(tmp_path):
    cfg = bench.CONFIGS["search"]
    row = {"timing_s/step": 9.0, "timing_s/gen": 6.0, "response_length/mean": 700.0}
    ours, verl = tmp_path / "metrics.jsonl", tmp_path / "verl_metrics.jsonl"
    ours.write_text("".join(json.dumps({**row, "env/number_of_valid_search": s}) + "\n" for s in (1.0, 1.5, 1.25, 1.5)))
    # veRL's tool agent loop: num_turns = assistant + user turns + 1; k searches then an answer -> 2k + 2
    verl.write_text("".join(json.dumps({"step": 1, "data": {**row, "num_turns/mean": t}}) + "\n" for t in (4.0, 5.0, 5.0, 6.0)))
    assert [s["searches"] for s in bench.ours_records(ours, cfg)] == [1.0, 1.5, 1.25, 1.5]
    assert [s["searches"] for s in bench.verl_records(verl, cfg)] == [1.0, 1.5, 1.5, 2.0]
    assert bench.summarise(bench.ours_records(ours, cfg), 1)["median"]["searches"] == 1.5
    assert bench.ours_records(ours, bench.CONFIGS["learning"])[0]["searches"] is None  # single turn: none


def test_trl_steps_join_the_callbacks_times_with_generation_and_sync(tmp_path):
    steps = [{"step_s": 30.0, "max_memory_allocated_gib": 40.0, "max_memory_reserved_gib": 45.0},
             {"step_s": 10.0, "max_memory_allocated_gib": 41.0, "max_memory_reserved_gib": 46.0}]
    bench_times = {"gen_s": [20.0, 5.0], "score_s": [25.0, 7.0], "sync_s": [0.4], "generated_tokens": [900, 800],
                   "total_tokens": [1900, 1800]}
    records = trl_gpu_run.step_records(steps, bench_times)
    assert records[0]["weight_sync_s"] == 0.0 and records[0]["gen_s"] == 20.0  # no push before the first step
    assert records[1] == {"step_s": 10.0, "max_memory_allocated_gib": 41.0, "max_memory_reserved_gib": 46.0,
                          "gen_s": 4.6, "weight_sync_s": 0.4,
                          "log_prob_s": 2.0, "update_s": 3.0, "generated_tokens": 800, "total_tokens": 1800}
    path = tmp_path / "trl_steps.json"
    path.write_text(json.dumps({"steps": records}))
    record = bench.trl_records(path, bench.CONFIGS["learning"])[1]
    assert (record["memory_gib"], record["memory_reserved_gib"]) == (41.0, 46.0)


def test_each_child_sees_its_own_site_only(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"/tmp/site:{ROOT}")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    verl = commands.child_env("verl", tmp_path)
    # veRL's workers import the agent loops (and the search tool and parser) from benchmarks/peers
    assert verl["PYTHONPATH"] == f"/tmp/site-verl:/tmp/site:{commands.PEERS_DIR}"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in verl
    assert verl["VERL_FILE_LOGGER_PATH"] == str(tmp_path / "verl_metrics.jsonl")
    assert commands.child_env("trl", tmp_path)["PYTHONPATH"] == "/tmp/site-trl:/tmp/site"
    ours = commands.child_env("ours", tmp_path)
    assert ours["PYTHONPATH"] == f"/tmp/site:{ROOT}" and ours["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


# ---- configuration 3: multi-turn search ------------------------------------------------------------------
CORPUS = [("Paris", "Paris is the capital and largest city of France."),
          ("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, France."),
          ("Berlin", "Berlin is the capital of Germany."),
          ("Long passage", "A deliberately long passage about lattice towers. " * 60)]
QUESTION = "what is the capital of france?"


@pytest.fixture(scope="module")
def search_run(tmp_path_factory):
    """The driver's own preparation of configuration ``search`` on a tiny learning-data folder: ONE retriever
    server of ours (``search_server``, as on the device), the runs' data and veRL's tool and loop files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path_factory.mktemp("learning")
    (data / "corpus.jsonl").write_text("".join(json.dumps({"id": str(i), "contents": f'"{title}"\n{text}'}) + "\n"
                                              for i, (title, text) in enumerate(CORPUS)))
    rows = [{"data_source": "nq", "prompt": prompt_messages(QUESTION), "ability": "fact-reasoning",
             "reward_model": {"style": "rule", "ground_truth": {"target": ["Paris"]}},
             "extra_info": {"split": "train", "index": 0, "uid": "nq-train-0"}}]
    pq.write_table(pa.Table.from_pylist(rows), data / "train.parquet")
    work = tmp_path_factory.mktemp("vs_peers")
    args = argparse.Namespace(data=str(data), work_dir=str(work), warm_start=smollm2_dir(), configs=["search"],
                              systems=["ours", "verl", "trl"])
    cfg = bench.CONFIGS["search"]
    with bench.search_server(args) as url:
        inputs = bench.prepare_inputs("search", cfg, args, url)
        run_dir = work / "search_verl"
        run_dir.mkdir()
        command = commands.verl_command(cfg, inputs, 5, run_dir, "search")
        single_dir = work / "learning_verl"  # a single-turn configuration's veRL run on the same rows
        single_dir.mkdir()
        single = commands.verl_command(bench.CONFIGS["learning"], inputs, 5, single_dir, "learning")
        yield {"url": url, "inputs": inputs, "overrides": command[3:], "cfg": cfg, "single_overrides": single[3:]}


def test_the_driver_starts_one_retriever_only_when_a_system_searches(search_run, tmp_path):
    only_trl = argparse.Namespace(data="/nowhere", work_dir=str(tmp_path), configs=["learning", "search"], systems=["trl"])
    with bench.search_server(only_trl) as url:
        assert url is None  # TRL cannot run `search`: no server, no index
    assert search_run["url"].startswith("http://127.0.0.1:") and search_run["url"].endswith("/retrieve")
    assert search_run["inputs"].retriever_url == search_run["url"]


def test_our_search_run_passes_quickstarts_start_up_checks_on_the_drivers_server(search_run, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import quickstart

    inputs = search_run["inputs"]
    cmd = commands.ours_command(search_run["cfg"], inputs, 5, tmp_path, "search")
    files = [f"data.train_files={inputs.data_dir / 'train.parquet'}", f"data.val_files={inputs.data_dir / 'test.parquet'}"]
    # what quickstart checks before anything slow: keys and types, start-up checks, data files, the model
    config = quickstart.check_run([*files, *cmd[cmd.index("+recipe=search_r1_grpo"):]], user_model=True)
    assert config.retriever.url == search_run["url"] and config.max_turns == 2
    assert quickstart.retriever_answers(config.retriever.url)  # so quickstart uses it and starts no server


def test_verl_rows_carry_the_tool_agent_loop_and_tools_kwargs(search_run):
    import pyarrow.parquet as pq

    row = pq.read_table(search_run["inputs"].data_dir / "verl_train.parquet").to_pylist()[0]
    assert row["agent_name"] == commands.VERL_AGENT_LOOP and row["extra_info"]["need_tools_kwargs"] is True
    assert row["extra_info"]["tools_kwargs"] == {"search": {"create_kwargs": {
        "ground_truth": {"target": ["Paris"]}, "question": QUESTION, "data_source": "nq"}}}
    assert row["extra_info"]["uid"] == "nq-train-0" and row["prompt"] == prompt_messages(QUESTION)
    ours = pq.read_table(search_run["inputs"].data_dir / "train.parquet").to_pylist()[0]
    assert "agent_name" not in ours and "tools_kwargs" not in ours["extra_info"]  # ours reads the rows unchanged


# Run in a child process on veRL 0.9.1's own code: its tool loader, dataset, agent loop registry entry and
# ToolAgentLoop; a scripted LLM answers in place of its vLLM server and keeps what each turn asked for.
VERL_LOOP_CHECK = r'''
import asyncio, json, sys
from pathlib import Path
import hydra
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from transformers import AutoTokenizer

spec = json.loads(Path(sys.argv[1]).read_text())
with initialize_config_dir(config_dir=spec["config_dir"], version_base=None):
    config = compose("ppo_trainer", spec["overrides"])
OmegaConf.resolve(config)
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.experimental.agent_loop.tool_parser import ToolParser
from verl.tools.tool_registry import load_all_tools
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

rollout = config.actor_rollout_ref.rollout
tools = load_all_tools(rollout.multi_turn.tool_config_path, rollout.multi_turn.function_tool_path)  # as AgentLoopWorker
tok = AutoTokenizer.from_pretrained(config.actor_rollout_ref.model.path)
row = dict(RLHFDataset(config.data.train_files, tok, config.data)[0])
agent_name = row.get("agent_name", rollout.agent.default_agent_loop)  # as AgentLoopWorker: the rows' or the default
loop_config = next(c for c in OmegaConf.load(rollout.agent.agent_loop_config_path) if c.name == agent_name)


def ids(text):
    return tok.encode(text, add_special_tokens=False)


class ScriptedLLM:
    def __init__(self, turns):
        self.turns, self.calls = turns, []

    async def generate(self, *, request_id, prompt_ids, sampling_params, **_):
        self.calls.append({"prompt_ids": list(prompt_ids), "params": dict(sampling_params)})
        return TokenOutput(token_ids=ids(self.turns[len(self.calls) - 1]))


async def rollout_of(turns):
    llm = ScriptedLLM(turns)
    loop = hydra.utils.instantiate(loop_config, trainer_config=DictConfigWrap(config), server_manager=llm,
                                   tokenizer=tok, processor=None, dataset_cls=RLHFDataset,
                                   data_config=DictConfigWrap(config.data), hf_model_type="llama",
                                   tools=ToolListWrap(tools))
    kwargs = {k: v for k, v in row.items() if k != "agent_name"}
    out = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": False}, **kwargs)
    sent = [c["prompt_ids"] for c in llm.calls]
    appended = [tok.decode(b[len(a) + len(ids(t)):]) for a, b, t in zip(sent, sent[1:], turns)]
    keys = ("stop", "max_tokens", "include_stop_str_in_output")
    return {"loop": type(loop).__name__, "params": [{k: c["params"].get(k) for k in keys} for c in llm.calls],
            "appended": appended, "num_turns": out.num_turns, "response": tok.decode(out.response_ids, skip_special_tokens=True),
            "mask": list(out.response_mask), "generated": sum(len(ids(t)) for t in turns[:len(llm.calls)])}


async def main():
    runs = [await rollout_of(turns) for turns in spec["runs"]]
    if not tools:  # single turn
        return {"runs": runs}
    parser = ToolParser.get_tool_parser(rollout.multi_turn.format, tok)
    parsed = {}
    for text in spec["parse"]:
        _, calls = await parser.extract_tool_calls(ids(text))
        parsed[text] = [[c.name, json.loads(c.arguments)] for c in calls]
    long = (await tools[0].execute("id", {"query": "deliberately long lattice passage"}))[0].text
    return {"tools": [[t.name, type(t).__name__, t.url, t.topk, t.max_chars] for t in tools],
            "tools_kwargs": row["tools_kwargs"], "parsed": parsed, "long": long, "runs": runs}


print(json.dumps(asyncio.run(main())))
'''
PARSE = ["<think>x</think>\n<search> capital of France </search>", "<answer>Paris</answer>",
         "<answer>a</answer><search>q</search>", "<search>   </search>", "<search>q"]
RUNS = [["<think>need the capital</think>\n<search> capital of France </search>",
         "<think>the tower too</think>\n<search>Eiffel Tower</search>", "<answer> Paris </answer>"],
        ["<search>Berlin</search>", "<search>Paris</search>", "<search>a third search</search>", "never asked"]]


@pytest.fixture(scope="module")
def verl_site(verl_code) -> Path:
    """veRL's code where its agent loop can import (it needs orjson, in veRL's site on the device)."""
    if importlib.util.find_spec("orjson") is None:
        pytest.skip("veRL's agent loop imports orjson (a veRL dependency, in its site on the device), not in this env")
    return verl_code


def run_verl_loop_check(verl_site: Path, overrides: list[str], tmp_path: Path, runs=RUNS) -> dict:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"config_dir": str(verl_site / "verl" / "trainer" / "config"),
                                "overrides": overrides, "parse": PARSE, "runs": runs}))
    script = tmp_path / "verl_loop_check.py"
    script.write_text(VERL_LOOP_CHECK)
    paths = [str(verl_site), str(commands.PEERS_DIR), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, str(script), str(spec)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_verls_tool_agent_loop_searches_our_retriever_with_search_r1s_turns(verl_site, search_run, tmp_path):
    cfg, got = search_run["cfg"], run_verl_loop_check(verl_site, search_run["overrides"], tmp_path)
    # veRL's own loader took our tool config: our server's URL, top-3, the character budget
    assert got["tools"] == [["search", "RetrieverSearchTool", search_run["url"], 3, cfg.obs_chars]]
    assert got["tools_kwargs"]["search"]["create_kwargs"]["question"] == QUESTION
    assert got["long"].startswith('<information>Doc 1(Title: "Long passage")') and got["long"].endswith("</information>")
    assert len(got["long"]) == cfg.obs_chars  # cut inside the passages, the closing tag kept
    assert got["parsed"] == {PARSE[0]: [["search", {"query": "capital of France"}]], PARSE[1]: [], PARSE[2]: [],
                             PARSE[3]: [], PARSE[4]: []}
    answered, exhausted = got["runs"]
    # every turn stops at Search-R1's tags (kept in the output) and after 320 tokens (or the row's budget left)
    assert all(p["stop"] == ["</search>", "</answer>"] and p["include_stop_str_in_output"] for p in answered["params"])
    assert [p["max_tokens"] for p in answered["params"]] == [320, 320, 320]
    # each search's observation: our server's passages in a chat-template tool turn, masked out of the loss
    assert len(answered["appended"]) == 2
    assert all(a.startswith("<|im_start|>tool\n<information>Doc 1(Title: ")
               and a.endswith("</information><|im_end|>\n<|im_start|>assistant\n") for a in answered["appended"])
    assert "Paris is the capital and largest city of France." in answered["appended"][0]
    assert "wrought-iron lattice tower" in answered["appended"][1]
    assert answered["num_turns"] == 6 and sum(answered["mask"]) == answered["generated"]
    # veRL's reward decodes without special tokens: the peers' EM reads it as ours does
    assert em_reward.compute_score("nq", answered["response"], {"target": ["Paris"]}) == 1.0
    assert compute_score_em(answered["response"], {"target": ["Paris"]}) == 1.0
    # max_turns = 2: the third turn's search is not run and the row ends there (ours: the same rule)
    assert len(exhausted["params"]) == 3 and len(exhausted["appended"]) == 2 and exhausted["num_turns"] == 6



def test_verls_single_turn_loop_ends_at_search_r1s_tags(verl_site, search_run, tmp_path):
    answer = "<think>the capital</think>\n<answer> Paris </answer>"
    got = run_verl_loop_check(verl_site, search_run["single_overrides"], tmp_path, runs=[[answer]])
    (run,) = got["runs"]
    # veRL's own registry and single-turn loop, one generation asking vLLM for Search-R1's stop strings
    assert run["loop"] == "SearchR1SingleTurnAgentLoop"
    assert run["params"] == [{"stop": ["</search>", "</answer>"], "max_tokens": None, "include_stop_str_in_output": True}]
    assert run["num_turns"] == 2 and sum(run["mask"]) == run["generated"]
    assert em_reward.compute_score("nq", run["response"], {"target": ["Paris"]}) == 1.0

def test_a_peer_that_cannot_run_a_configuration_is_recorded_with_the_reason(tmp_path):
    args = bench.parse_args(["--warm_start", "/w", "--configs", "search", "--work_dir", str(tmp_path)])
    deadline = 1e18  # the budget is no reason here
    assert bench.skipped("search", "trl", deadline, args) == {"skipped": bench.UNSUPPORTED["search", "trl"],
                                                             "unsupported": True}
    assert bench.skipped("search", "verl", deadline, args) is None and bench.skipped("learning", "trl", deadline, args) is None
    assert "budget" in bench.skipped("search", "ours", 0.0, args)["skipped"]
    results = {"search": {"ours": {"median": {"step_s": 8.0}, "enough_steps": True},
                          "verl": {"median": {"step_s": 16.0}, "enough_steps": True},
                          "trl": bench.skipped("search", "trl", deadline, args)}}
    body = bench.report(results, args)
    assert body["ratio_step_vs_verl"] == {"search": 2.0} and body["ratio_step_vs_trl"] == {}
    assert body["ratio_absent"] == {"ratio_step_vs_trl": {"search": bench.UNSUPPORTED["search", "trl"]}}
    assert body["configs"]["search"]["response_width"] == 1728 and body["configs"]["search"]["obs_chars"] == 1536
    assert body["configs"]["search"]["retriever"]["topk"] == 3


def test_verl_halves_its_token_budget_on_the_same_trainer_and_falls_back_to_v0_for_other_failures(
        tmp_path, monkeypatch):
    calls, outcomes = [], []

    def scripted_run(system, name, cfg, inputs, args, deadline, verl_trainer="v1"):
        calls.append((system, verl_trainer, cfg.max_token_len))
        return outcomes.pop(0)

    monkeypatch.setattr(bench, "run_system", scripted_run)
    args = bench.parse_args(["--warm_start", "/w", "--work_dir", str(tmp_path)])
    cfg, full = bench.CONFIGS["learning"], bench.CONFIGS["learning"].max_token_len
    oom = {"steps": [], "log_tail": ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.00 GiB"]}
    no_tq = {"steps": [], "log_tail": ["ModuleNotFoundError: No module named 'transfer_queue'"]}
    # out of memory on v1: v1 again at half the budget, v1 kept for later configurations
    trainers, outcomes[:] = ["v1", "v0"], [oom, {"steps": [{"step_s": 5.0}]}]
    result = bench.run_verl("learning", cfg, INPUTS, args, 1e18, trainers)
    assert calls == [("verl", "v1", full), ("verl", "v1", full // 2)]
    assert trainers == ["v1", "v0"] and result["steps"] and result["verl_max_token_len"] == full // 2
    assert "CUDA out of memory" in result["out_of_memory_attempt"]["log_tail"][0]
    # v1 fails otherwise: v0 at the same budget, then v0 for later configurations
    calls.clear()
    outcomes[:] = [no_tq, {"steps": [{"step_s": 5.0}]}]
    result = bench.run_verl("learning", cfg, INPUTS, args, 1e18, trainers)
    assert calls == [("verl", "v1", full), ("verl", "v0", full)] and trainers == ["v0"]
    assert "transfer_queue" in result["v1_attempt"]["log_tail"][0] and "verl_max_token_len" not in result
    # v1 out of memory, then failing otherwise at half: v0 keeps the halved budget
    calls.clear()
    trainers, outcomes[:] = ["v1", "v0"], [oom, no_tq, {"steps": [{"step_s": 5.0}]}]
    result = bench.run_verl("learning", cfg, INPUTS, args, 1e18, trainers)
    assert calls == [("verl", "v1", full), ("verl", "v1", full // 2), ("verl", "v0", full // 2)]
    assert result["verl_max_token_len"] == full // 2 and "transfer_queue" in result["v1_attempt"]["log_tail"][0]
    # a budget given from the start: no memory failure needed, recorded as the run's
    calls.clear()
    args32k = bench.parse_args(["--warm_start", "/w", "--work_dir", str(tmp_path), "--verl_max_token_len", "32768"])
    outcomes[:] = [{"steps": [{"step_s": 5.0}]}]
    assert bench.run_verl("learning", cfg, INPUTS, args32k, 1e18, ["v1", "v0"])["verl_max_token_len"] == 32768
    assert calls == [("verl", "v1", 32768)]
    with pytest.raises(SystemExit):
        bench.parse_args(["--warm_start", "/w", "--verl_max_token_len", "0"])
    # any other failure on v0 is recorded as it is, not repeated
    calls.clear()
    outcomes[:] = [{"steps": [], "log_tail": ["ImportError: FlashAttention2 has been toggled on"]}]
    assert bench.run_verl("learning", cfg, INPUTS, args, 1e18, trainers) == {
        "steps": [], "log_tail": ["ImportError: FlashAttention2 has been toggled on"]}
    assert calls == [("verl", "v0", full)]


def test_a_variant_of_ours_runs_beside_ours_with_its_overrides_and_is_compared_with_both(tmp_path, monkeypatch):
    mb32k = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768"
    args = bench.parse_args(["--warm_start", "/w", "--work_dir", str(tmp_path), "--systems", "trl,ours,verl",
                             "--ours_variant", f"mb32k={mb32k}", "--ours_variant", "two=trainer.seed=3; data.seed=4"])
    assert args.systems == ["trl", "ours", "ours-mb32k", "ours-two", "verl"]
    assert args.ours_variants == {"ours-mb32k": [mb32k], "ours-two": ["trainer.seed=3", "data.seed=4"]}
    for bad in (["--ours_variant", "MB=a=1"], ["--ours_variant", "mb=a"], ["--ours_variant", "mb="],
                ["--systems", "trl", "--ours_variant", "mb=a=1"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--warm_start", "/w", *bad])
    # its command is ours with the overrides last (Hydra: the last value wins), and passes our config check
    cfg, work = bench.CONFIGS["learning"], tmp_path / "learning_ours-mb32k"
    cmd, env, cwd = bench.launch("ours-mb32k", "learning", cfg, INPUTS, args, work)
    assert cmd == commands.ours_command(cfg, INPUTS, args.steps, work, "learning") + [mb32k]
    assert cwd == ROOT and env == commands.child_env("ours", work)
    assert bench.launch("ours", "learning", cfg, INPUTS, args, work)[0] == cmd[:-1]
    config = parse_config(cmd[cmd.index("+recipe=search_r1_grpo"):])
    assert config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 32768
    # the report: the variant against plain ours and each peer, as the top-level ratios compare ours
    run = lambda step_s, peak: {"median": {"step_s": step_s}, "peak_gpu_memory_gib": peak, "enough_steps": True}  # noqa: E731
    results = {"learning": {"ours": run(4.0, 100.0), "ours-mb32k": {**run(5.0, 80.0), "overrides": [mb32k]},
                            "trl": run(10.0, 88.0)}}
    body = bench.report(results, args)
    assert body["ratio_step_vs_trl"] == {"learning": 2.5}  # plain ours
    assert body["variants"] == {"ours-mb32k": {"learning": {
        "overrides": [mb32k], "step_vs_ours": 0.8, "memory_vs_ours": 0.8, "step_vs_trl": 2.0, "memory_vs_trl": 0.909}}}


def test_every_configuration_has_a_run_limit():
    assert set(bench.RUN_TIMEOUT_S) == set(bench.CONFIGS)
    assert bench.parse_args(["--warm_start", "/m"]).run_timeout_s is None  # then the configuration's


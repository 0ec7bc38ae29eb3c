"""The tool_call environment: the chat template's tool turns, token-exact, on both tokenizers and engines."""

from __future__ import annotations

import json

import pytest

from search_r1.envs.search_tool import SearchTool
from search_r1.envs.tool_call import ToolCallEnvironment
from search_r1.envs.tool_call.prompts import SEARCH_TOOL, TOOL_SYSTEM_TEXT
from search_r1.search.passages import format_passages
from tests.rollout.test_environment_contract import QUESTION, WRITERS, prompt_ids, run, spans
from verl.protocol import DataProto
from verl.workers.rollout.base import SamplingParams

CALL = WRITERS["tool_call"]["search"]


def test_tool_call_trajectory_is_the_chat_template_rendering(qwen_tokenizer, retriever, mode):
    """With Qwen's template (tools in the system turn, tool turns as ``<tool_response>`` user turns)
    the decoded prompt + trajectory is the template's rendering of the conversation up to the last
    tool turn (with the assistant header), then the answer and the EOS."""
    tok = qwen_tokenizer
    env = ToolCallEnvironment(tok, SearchTool(retriever), 400)
    assert env.template_has_tools and env.chat_template_kwargs() == {"tools": [SEARCH_TOOL]}
    turns = [CALL.format("Manuel Díaz Rodríguez"), CALL.format("Caracas"), "<answer> Caracas </answer>"]
    _, out = run(env, tok, [turns], mode, max_response_length=1200)
    real = out.batch["attention_mask"][0].bool()
    trajectory = tok.decode(out.batch["input_ids"][0][real])
    conversation = env.messages(f"{QUESTION} (0)")
    for text, query in zip(turns[:2], ["Manuel Díaz Rodríguez", "Caracas"]):
        docs = retriever.retrieve([query])[0]
        conversation += [{"role": "assistant", "content": text}, {"role": "tool", "content": format_passages(docs).strip()}]
    rendered = tok.apply_chat_template(conversation, tools=[SEARCH_TOOL], tokenize=False, add_generation_prompt=True)
    assert trajectory == rendered + turns[2] + tok.eos_token
    assert out.batch["valid_search"].tolist() == [2] and out.batch["finished"].tolist() == [1]
    # each tool turn is tokenised on its own: the ids are those of its text
    for observation in spans(out, 0, generated=False):
        assert tok.encode(tok.decode(observation), add_special_tokens=False) == observation


def test_tool_call_without_template_tools_describes_the_tool_itself(tokenizer):
    """SmolLM2's template has no tools: the tool is described in the system turn, and tool turns are
    the template's own (``<|im_start|>tool``) with the ``<tool_response>`` wrapper inside."""
    env = ToolCallEnvironment(tokenizer, SearchTool(None), 200)
    assert not env.template_has_tools and env.chat_template_kwargs() == {}
    prompt = tokenizer.decode(prompt_ids(env, tokenizer, "who wrote hamlet"))
    assert prompt.startswith("<|im_start|>system\n" + TOOL_SYSTEM_TEXT + "<|im_end|>")
    assert prompt.endswith("<|im_start|>user\nQuestion: who wrote hamlet?\n<|im_end|>\n<|im_start|>assistant\n")
    assert env.observations.head == "<|im_end|>\n<|im_start|>tool\n<tool_response>\n"
    assert env.observations.tail == "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("call,reason", [
    ('<tool_call>\n{"name": "search", "arguments": {"query": }}\n</tool_call>', "not valid JSON"),
    ('<tool_call>\n["search", "x"]\n</tool_call>', 'must be {"name": "search"'),
    ('<tool_call>\n{"name": "lookup", "arguments": {"query": "x"}}\n</tool_call>', 'must be {"name": "search"'),
    ('<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>', "non-empty string argument 'query'"),
    ('<tool_call>\n{"name": "search", "arguments": {"query": "  "}}\n</tool_call>', "non-empty string argument 'query'"),
    ('<tool_call>\n{"name": "search", "arguments": "x"}\n</tool_call>', "non-empty string argument 'query'"),
])
def test_tool_call_malformed_call_is_an_invalid_action(tokenizer, call, reason, mode):
    env = ToolCallEnvironment(tokenizer, SearchTool(None), 200)
    action = env.parse(call)
    assert action.kind is None and reason in action.content and action.counts["valid_action"] == 0
    _, out = run(env, tokenizer, [[call, "<answer> x </answer>"]], mode)
    assert out.batch["finished"].tolist() == [1] and out.batch["valid_action"].tolist() == [1]
    (answer,) = spans(out, 0, generated=False)
    text = tokenizer.decode(answer)
    assert text.startswith(env.observations.head) and reason in text and text.endswith(env.observations.tail)


def test_tool_call_reads_flashrag_and_search_r1_rows_as_its_own(tokenizer, tmp_path):
    from verl.utils.dataset.config import DataConfig
    from verl.utils.dataset.rl_dataset import RLHFDataset

    env = ToolCallEnvironment(tokenizer, SearchTool(None), 200)
    flashrag = tmp_path / "nq" / "test.jsonl"
    flashrag.parent.mkdir()
    flashrag.write_text(json.dumps({"id": "1", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}) + "\n")
    search_r1_rows = tmp_path / "rows.jsonl"
    from search_r1.envs.search_r1.prompts import prompt_messages
    search_r1_rows.write_text(json.dumps({"data_source": "nq", "prompt": prompt_messages("who wrote hamlet"),
                                          "reward_model": {"ground_truth": {"target": ["Shakespeare"]}}}) + "\n")
    a, b = (RLHFDataset(path, tokenizer, DataConfig(max_start_length=1024), env)[0] for path in (flashrag, search_r1_rows))
    assert a["raw_prompt_ids"] == b["raw_prompt_ids"] == prompt_ids(env, tokenizer, "who wrote hamlet")
    assert a["data_source"] == "nq" and a["reward_model"]["ground_truth"] == {"target": ["Shakespeare"]}


COPY = ('Write exactly this and nothing else: <tool_call>\n{"name": "search", "arguments": '
        '{"query": "Manuel Díaz Rodríguez"}}\n</tool_call>')


@pytest.mark.slow
@pytest.mark.parametrize("engine_name", ["hf_engine", "vllm_engine"])
def test_tool_call_rollout_on_the_real_engines(engine_name, request, tokenizer, retriever, mode):
    """SmolLM2 writes the call after a forced ``<tool_call>`` prefix (with the tool's description in
    the system turn it copies the schema instead); the loop stops at ``</tool_call>``, searches and
    appends the tool turn; every trained token is a sampled one and the sequence is prompt + response."""
    engine = request.getfixturevalue(engine_name)
    env = ToolCallEnvironment(tokenizer, SearchTool(retriever), 200)
    messages = [{"role": "user", "content": COPY}]
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                              + "<tool_call>", add_special_tokens=False)
    assert env.open_tag(prompt) == "<tool_call>"
    from verl.workers.rollout.agent_loop import LoopConfig, MultiTurnRollout

    loop = LoopConfig(max_turns=1, max_start_length=1024, max_prompt_length=1500, max_response_length=400, mode=mode,
                      log_probs=True)
    out = MultiTurnRollout(tokenizer, engine, env, loop).run(DataProto.from_dict(non_tensors={"raw_prompt_ids": [prompt]}),
                                                            SamplingParams(temperature=0, max_tokens=48))
    assert out.batch["valid_search"].tolist() == [1], tokenizer.decode(out.batch["responses"][0])
    seq = out.batch["input_ids"][0][out.batch["attention_mask"][0].bool()].tolist()
    assert seq[:len(prompt)] == prompt
    first = spans(out, 0, generated=False)[0]
    assert first == env.render(retriever.retrieve(["Manuel Díaz Rodríguez"])[0]).ids
    generated = tokenizer.decode(spans(out, 0, generated=True)[0])
    assert generated.rstrip().endswith("</tool_call>") or tokenizer.decode(first).startswith(">")

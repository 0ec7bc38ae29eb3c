"""Ask a search agent a question: one-shot with --question, else an interactive prompt.

    python infer.py --model PATH_OR_ID --question "Who wrote Hamlet?" \
        [--retriever_url http://127.0.0.1:8000/retrieve] [--topk 3] [--temperature 0] \
        [--engine vllm|hf] [--max_turns 4] [--env search_r1|tool_call]

It runs the training rollout's own loop (``MultiTurnRollout`` in the environment the model was
trained in) on a batch of one and prints the trajectory (think/search/information/answer) and the
final answer. A model path that is no model
folder and a retriever that does not answer are reported in one line (exit code 2) before the
model loads.
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv=None) -> argparse.Namespace:
    from search_r1.search.config import RetrieverConfig
    from verl.workers.rollout import default_engine_name

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="HF folder or hub id")
    p.add_argument("--question", default=None, help="omit for an interactive prompt")
    p.add_argument("--retriever_url", default=RetrieverConfig.url)
    p.add_argument("--topk", type=int, default=RetrieverConfig.topk)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top_p", type=float, default=1.0)
    p.add_argument("--engine", choices=["vllm", "hf"], default=default_engine_name())
    p.add_argument("--max_turns", type=int, default=4)
    p.add_argument("--max_tokens", type=int, default=500, help="new tokens per turn")
    p.add_argument("--max_response_length", type=int, default=2048)
    p.add_argument("--max_obs_length", type=int, default=512)
    p.add_argument("--max_model_len", type=int, default=4096)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--template", default="base", help="prompt template name in search_r1.envs.search_r1.prompts.TEMPLATES")
    p.add_argument("--no_search", action="store_true", help="R1 without search")
    p.add_argument("--env", choices=["search_r1", "tool_call"], default="search_r1",
                   help="the environment the model was trained in (env.name)")
    return p.parse_args(argv)


def check_inputs(args) -> None:
    """The model path and (with search) the retriever, before anything loads.

    Raises:
        ValueError: ``--model`` is no model folder / known hub id, or nothing answers at
            ``--retriever_url``; the message says what to do.
    """
    from search_r1.search.client import RetrieverClient, RetrieverError
    from verl.utils.model_path import check_model_path

    check_model_path(args.model, "--model")
    if args.no_search:
        return
    try:
        RetrieverClient(args.retriever_url, topk=1, timeout=5.0, max_retries=0).retrieve(["test"])
    except RetrieverError as err:
        raise ValueError(f"--retriever_url {args.retriever_url}: no retriever answers ({err}); start one "
                         "(bash retrieval_launch.sh, see README 'Try a model'), point --retriever_url at it, "
                         "or pass --no_search") from None


def build_rollout(args):
    """The tokenizer and the training's multi-turn rollout in the chosen environment (``--env``)."""
    from transformers import AutoTokenizer

    from search_r1.envs import SearchR1Environment, ToolCallEnvironment
    from search_r1.envs.search_tool import SearchTool
    from search_r1.search.client import RetrieverClient
    from verl.workers.rollout import build_rollout_engine
    from verl.workers.rollout.agent_loop import LoopConfig, MultiTurnRollout

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    engine = build_rollout_engine({"name": args.engine, "dtype": args.dtype, "max_model_len": args.max_model_len},
                                  args.model, tokenizer)
    loop = LoopConfig(max_turns=args.max_turns, max_start_length=args.max_model_len // 2,
                      max_prompt_length=args.max_model_len - args.max_tokens,
                      max_response_length=args.max_response_length, mode="sync", log_probs=False)
    retriever = None if args.no_search else RetrieverClient(args.retriever_url, topk=args.topk)
    env_class = {"search_r1": SearchR1Environment, "tool_call": ToolCallEnvironment}[args.env]
    env = env_class(tokenizer, SearchTool(retriever), args.max_obs_length)
    return tokenizer, MultiTurnRollout(tokenizer, engine, env, loop)


def prompt_ids(tokenizer, env, question: str, template: str) -> list[int]:
    """The prompt as training builds it from a Search-R1 row of ``question`` (in ``env``'s form)."""
    from search_r1.envs.search_r1.prompts import prompt_messages
    from verl.utils.dataset.rl_dataset import render_prompt

    row = {"prompt": prompt_messages(question, template)}
    messages = env.prompt_messages(row, row["prompt"])
    return tokenizer.encode(render_prompt(tokenizer, messages, **env.chat_template_kwargs()), add_special_tokens=False)


def answer(tokenizer, rollout, question: str, args) -> str:
    """Roll out one question, print the trajectory and return the final answer ('' if none)."""
    from verl.protocol import DataProto
    from verl.workers.rollout.base import SamplingParams

    batch = DataProto.from_dict(non_tensors={"raw_prompt_ids": [prompt_ids(tokenizer, rollout.env, question,
                                                                           args.template)]})
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)
    out = rollout.run(batch, params)
    width = out.batch["prompts"].shape[1]
    real = out.batch["attention_mask"][0, width:].bool()
    trajectory = tokenizer.decode(out.batch["responses"][0][real], skip_special_tokens=True)
    print(trajectory)
    stats = {k: int(out.batch[k][0]) for k in ("turns", "valid_search", "finished", "truncated")}
    print(f"--- {stats} timing={ {k: round(v, 2) for k, v in out.meta_info['timing'].items()} }")
    final = rollout.env.extract_answer(trajectory) or ""
    print(f"Final answer: {final or '(none)'}")
    return final


def require_packages() -> None:
    """One line, not a traceback, when this interpreter lacks the project (environment not active)."""
    import importlib.util

    missing = [m for m in ("torch", "transformers", "omegaconf", "httpx", "verl") if importlib.util.find_spec(m) is None]
    if missing:
        _fail(f"{sys.executable} cannot import {', '.join(missing)}: activate the project's environment "
              "(. .venv/bin/activate; bash scripts/install.sh makes it)")


def main(argv=None) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    require_packages()
    args = parse_args(argv)
    try:
        check_inputs(args)
    except ValueError as err:
        _fail(str(err))
    tokenizer, rollout = build_rollout(args)
    if args.question:
        _answer_or_exit(tokenizer, rollout, args.question, args)
        return
    while True:
        try:
            question = input("question> ").strip()
        except EOFError:
            break
        if question in ("", "exit", "quit"):
            break
        _answer_or_exit(tokenizer, rollout, question, args)


def _answer_or_exit(tokenizer, rollout, question: str, args) -> None:
    """:func:`answer`; a retriever that stops answering ends the program with one line."""
    from search_r1.search.client import RetrieverError

    try:
        answer(tokenizer, rollout, question, args)
    except RetrieverError as err:
        _fail(f"{err} (is the retriever at --retriever_url still running?)")


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()

"""Search-R1's protocol in veRL 0.9.1's agent loops (issue 27, ``benchmarks/vs_peers_gpu.py``): the multi-turn
search of configuration ``search`` against our retriever server, and the single-turn configurations' turn end.

veRL 0.9.1 ships no search tool (its ``verl/tools/`` holds ``base_tool``, ``function_tool``, ``schemas`` and
``tool_registry`` only; the Search-R1-like ``search_tool.py`` of earlier releases is gone), and its tool agent
loop parses tool calls in a chat template's function-calling format (``multi_turn.format``, default
``hermes``: ``<tool_call>{json}</tool_call>``), which the SmolLM2 warm start never writes. This module plugs
Search-R1's protocol into veRL's own extension points, each named in the run's configuration:

- :class:`RetrieverSearchTool` (``multi_turn.tool_config_path``, ``class_name``): a ``BaseTool`` that POSTs the
  query to a Search-R1 ``/retrieve`` server (``retrieval_service_url``, ``topk``) and answers with Search-R1's
  observation text, ``<information>Doc 1(Title: ...) ...</information>``, its passages cut at the end so that
  the whole fits ``max_chars`` and the closing tag stays;
- :class:`SearchR1TagParser` (``multi_turn.format=search_r1_tags``): the first complete ``<search>`` /
  ``<answer>`` pair of a turn is its action; a non-empty search becomes a call of the ``search`` tool;
- :class:`SearchR1ToolAgentLoop` (``agent.agent_loop_config_path``): veRL's ``ToolAgentLoop`` whose turns end
  at Search-R1's stop strings and after ``turn_max_tokens`` tokens (veRL's own loop stops a turn only at the
  EOS, a parser's stop token ids or the response budget);
- :class:`SearchR1SingleTurnAgentLoop` (the same file, single-turn configurations): veRL's
  ``SingleTurnAgentLoop`` ending at the same stop strings, as ours and TRL's runs do (veRL's rollout config
  has no stop strings; without them the warm start writes on after ``</answer>`` to the length limit).

It runs in veRL's site only (``PYTHONPATH=/tmp/site-verl:/tmp/site:benchmarks/peers``; veRL's package is also
called ``verl``); it imports nothing of ours, and only the standard library besides veRL.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from typing import Any

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

PARSER_NAME = "search_r1_tags"
TOOL_NAME = "search"
STOP_STRINGS = ("</search>", "</answer>")
ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)  # Search-R1's action regex
HEAD, TAIL = "<information>", "</information>"


def with_stop(sampling_params: dict[str, Any], stop: list[str]) -> dict[str, Any]:
    """vLLM sampling parameters ending generation at ``stop``, the stop string kept in the output."""
    return {**sampling_params, "stop": list(stop), "include_stop_str_in_output": True}


def first_search(text: str) -> str | None:
    """The query of a turn whose first complete ``<search>``/``<answer>`` pair is a non-empty search, else None."""
    match = ACTION.search(text)
    if match is None or match.group(1) != "search":
        return None
    return match.group(2).strip() or None


def render_passages(hits: list[dict]) -> str:
    """Search-R1's passage text, ``Doc {i}(Title: {title}) {text}`` a line, of ``/retrieve`` hits
    (``{"document": {"contents": '"Title"\\ntext'}}``), stripped."""
    lines = []
    for i, hit in enumerate(hits, start=1):
        title, _, text = hit["document"]["contents"].partition("\n")
        lines.append(f"Doc {i}(Title: {title}) {text}\n")
    return "".join(lines).strip()


def observation(hits: list[dict], max_chars: int) -> str:
    """``<information>passages</information>`` of at most ``max_chars`` characters: the passages are cut at
    their end, the wrapper is kept whole."""
    room = max(max_chars - len(HEAD) - len(TAIL), 0)
    return HEAD + render_passages(hits)[:room] + TAIL


def retrieve(url: str, query: str, topk: int, timeout: float, attempts: int = 3) -> list[dict]:
    """One query's hits from a Search-R1 ``/retrieve`` server (``{"queries": [q], "topk": k}``), retried on
    a failure (``attempts`` tries, 1 s apart); the last failure is raised."""
    body = json.dumps({"queries": [query], "topk": topk, "return_scores": False}).encode()
    for attempt in range(attempts):
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())["result"][0]
        except OSError:
            if attempt == attempts - 1:
                raise
            time.sleep(1.0)
    return []


class RetrieverSearchTool(BaseTool):
    """The ``search`` tool: one query to our retriever server, Search-R1's observation back.

    Config keys (the tool config's ``config``): ``retrieval_service_url`` (``http://host:port/retrieve``),
    ``topk`` (3), ``timeout`` (s, 30), ``max_chars`` (the observation's length at most).
    """

    def __init__(self, config: dict, tool_schema):
        super().__init__(config, tool_schema)
        self.url = config["retrieval_service_url"]
        self.topk, self.timeout = int(config.get("topk", 3)), float(config.get("timeout", 30))
        self.max_chars = int(config["max_chars"])

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """The observation for ``parameters["query"]`` (reward 0; metrics: the hits' count)."""
        query = str(parameters.get("query", "")).strip()
        if not query:
            return ToolResponse(text=HEAD + TAIL), 0.0, {"hits": 0}
        hits = await asyncio.to_thread(retrieve, self.url, query, self.topk, self.timeout)
        return ToolResponse(text=observation(hits, self.max_chars)), 0.0, {"hits": len(hits)}


@ToolParser.register(PARSER_NAME)
class SearchR1TagParser(ToolParser):
    """Search-R1's tags as veRL tool calls: ``<search>q</search>`` -> ``search({"query": q})``."""

    async def extract_tool_calls(self, responses_ids: list[int], tools=None) -> tuple[str, list[FunctionCall]]:
        """The turn's text and its search call (none for an answer, an empty query or no complete tag)."""
        text = await asyncio.get_running_loop().run_in_executor(None, self.tokenizer.decode, responses_ids)
        query = first_search(text)
        calls = [] if query is None else [FunctionCall(name=TOOL_NAME, arguments=json.dumps({"query": query}))]
        return text, calls


class SearchR1ToolAgentLoop(ToolAgentLoop):
    """veRL's ``ToolAgentLoop`` with Search-R1's turn ends: generation stops at ``stop`` (the stop string kept
    in the output, as the parser needs it) and after ``turn_max_tokens`` tokens (None: veRL's own budget)."""

    def __init__(self, *args, stop=STOP_STRINGS, turn_max_tokens: int | None = None, **kwargs):
        kwargs.pop("name", None)  # the agent loop's registry name, passed along by hydra's instantiate
        super().__init__(*args, **kwargs)
        self.stop, self.turn_max_tokens = [str(s) for s in stop], turn_max_tokens

    def turn_params(self, sampling_params: dict[str, Any], used: int) -> dict[str, Any]:
        """One turn's sampling parameters, ``used`` response tokens into the row."""
        params = with_stop(sampling_params, self.stop)
        if self.turn_max_tokens:
            params["max_tokens"] = max(1, min(int(self.turn_max_tokens), self.response_length - used))
        return params

    async def _handle_generating_state(self, agent_data, sampling_params: dict[str, Any], ignore_termination: bool = False):
        params = self.turn_params(sampling_params, len(agent_data.response_mask))
        return await super()._handle_generating_state(agent_data, params, ignore_termination)


class SearchR1SingleTurnAgentLoop(SingleTurnAgentLoop):
    """veRL's ``SingleTurnAgentLoop`` whose one generation ends at ``stop`` (the stop string kept)."""

    def __init__(self, *args, stop=STOP_STRINGS, **kwargs):
        kwargs.pop("name", None)  # the agent loop's registry name, passed along by hydra's instantiate
        super().__init__(*args, **kwargs)
        self.stop = [str(s) for s in stop]

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        return await super().run(with_stop(sampling_params, self.stop), **kwargs)

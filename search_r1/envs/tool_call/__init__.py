"""The tool_call environment (``env.name=tool_call``): search through the chat template's tool calls."""

from search_r1.envs.tool_call.env import ToolCallEnvironment

__all__ = ["ToolCallEnvironment"]

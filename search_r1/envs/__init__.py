"""The environments of this package, registered by name for ``env.name`` (``verl.envs.registry``):
``search_r1`` (Search-R1's tags) and ``tool_call`` (the chat template's tool calls), and the search
tool both call (``search_tool.py``). Importing this package registers both (``env.module``'s
default), whether or not the package is installed with its entry points."""

from search_r1.envs.search_r1 import SearchR1Environment
from search_r1.envs.tool_call import ToolCallEnvironment

__all__ = ["SearchR1Environment", "ToolCallEnvironment"]

"""Test your agents offline: a scripted OpenAI-compatible model server on loopback (chat completions and
the Responses API, answered from the same script, so one script drives OpenAI-compatible, OpenCode and
Codex agents).

from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

async with ScriptedModel([call(tool_call("unit_list")), say("done", when=Match(last_role="tool"))]) as model:
    agent = OpenAIAgent(base_url=model.base_url, model="scripted")
    ...
assert model.requests[1].last_message["role"] == "tool"
"""

from .script import (
    Match,
    Script,
    ScriptedError,
    ScriptedToolCall,
    ScriptedUsage,
    ScriptError,
    Step,
    call,
    say,
    tool_call,
)
from .server import RecordedRequest, ScriptedModel

__all__ = [
    "Match",
    "RecordedRequest",
    "Script",
    "ScriptError",
    "ScriptedError",
    "ScriptedModel",
    "ScriptedToolCall",
    "ScriptedUsage",
    "Step",
    "call",
    "say",
    "tool_call",
]

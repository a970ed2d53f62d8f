"""Test your agents offline: a scripted model server on loopback (chat completions, the Responses API,
Anthropic Messages and Gemini generateContent, answered from the same script, so one script drives
OpenAI-compatible, OpenCode, Codex, Claude Code and Gemini CLI agents).

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
from .server import RecordedRequest, ScriptedModel, ScriptedModelError

__all__ = [
    "Match",
    "RecordedRequest",
    "Script",
    "ScriptError",
    "ScriptedError",
    "ScriptedModel",
    "ScriptedModelError",
    "ScriptedToolCall",
    "ScriptedUsage",
    "Step",
    "call",
    "say",
    "tool_call",
]

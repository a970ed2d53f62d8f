"""Test your agents offline: a scripted model server on loopback that answers chat completions, the Responses API,
Anthropic Messages and Gemini from one script.

    async with ScriptedModel([call(tool_call("unit_list")), say("done", when=Match(last_role="tool"))]) as model:
        agent = OpenAIAgent(base_url=model.base_url, model="scripted")
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

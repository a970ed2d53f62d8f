"""The reference's online tests as the scripted model plays them: one copy for every agent suite that runs them
under the tools' own names (the OpenAI-compatible agent, Codex)."""

from __future__ import annotations

from unit_mcp.testing import Match, Step, call, say, tool_call

NONCE_PROMPT = "Call get_nonce, then call record_value with the nonce you received. Reply exactly done:<nonce>."


def echo_token(marker: str) -> tuple[str, list[Step]]:
    """The prompt asking for one `echo_token` call with `marker`, and the model's steps: that call, then its output."""
    prompt = (
        f"Use echo_token exactly once with token {marker}. Then reply with exactly the tool output and no extra text."
    )
    steps = [
        call(
            tool_call("echo_token", {"token": marker}),
            when=Match(user_contains="echo_token", tools_offered=["echo_token"]),
        ),
        say("{{last}}", when=Match(last_role="tool")),
    ]
    return prompt, steps


def nonce_steps() -> list[Step]:
    """The model's steps for `NONCE_PROMPT`: get_nonce, record_value with the nonce it gave, then `done:<nonce>`."""
    return [
        call("get_nonce", when=Match(last_role="user")),
        call(tool_call("record_value", {"value": "{{tool:get_nonce.nonce}}"}), when=Match(last_contains="nonce")),
        say("done:{{tool:get_nonce.nonce}}", when=Match(last_contains="recorded:")),
    ]

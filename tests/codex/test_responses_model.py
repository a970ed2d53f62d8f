"""The scripted model's Responses API (what Codex speaks), answered from the same scripts as chat completions."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from unit_mcp.testing import Match, ScriptedError, ScriptedModel, Step, call, say, tool_call
from unit_mcp.testing.responses import chat_messages

pytestmark = pytest.mark.anyio

NAMESPACED_TOOLS = [
    {"type": "function", "name": "request_user_input", "parameters": {}},
    {
        "type": "namespace",
        "name": "mcp__unit_agent",
        "tools": [{"type": "function", "name": "echo_token"}, {"type": "function", "name": "get_nonce"}],
    },
]


def responses_body(*items: dict[str, Any], stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": list(items), "tools": NAMESPACED_TOOLS, "stream": stream, **extra}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def sse(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line[6:] != "[DONE]"]


async def test_a_streamed_answer_is_the_event_sequence_codex_reads() -> None:
    steps = [Step(text="calling now", chunk_size=4, tool_calls=[tool_call("echo_token", {"token": "t"})])]
    async with ScriptedModel(steps) as model, httpx2.AsyncClient(base_url=model.base_url) as http:
        response = await http.post("/responses", json=responses_body(user("go")))
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse(response.text)
        assert model.requests[0].finished and model.requests[0].tool_names == [
            "request_user_input",
            "echo_token",
            "get_nonce",
        ]
    kinds = [event["type"] for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    done = [event["item"] for event in events if event["type"] == "response.output_item.done"]
    assert done[0]["type"] == "message" and done[0]["content"][0]["text"] == "calling now"
    assert {k: done[1][k] for k in ("type", "namespace", "name", "call_id")} == {
        "type": "function_call",
        "namespace": "mcp__unit_agent",  # the namespace the tool was offered in
        "name": "echo_token",
        "call_id": "call_1_0",
    }
    assert json.loads(done[1]["arguments"]) == {"token": "t"}
    deltas = [event["delta"] for event in events if event["type"] == "response.output_text.delta"]
    assert "".join(deltas) == "calling now" and len(deltas) == 3
    completed = events[-1]["response"]
    assert completed["status"] == "completed" and completed["output"] == done
    assert completed["usage"]["input_tokens"] > 0 and completed["usage"]["output_tokens"] > 0


async def test_namespaces_follow_the_offer_unless_the_step_names_one() -> None:
    steps = [call("get_nonce", "not_offered", tool_call("echo_token", {"token": "x"}, namespace="mcp__other"))]
    async with ScriptedModel(steps) as model, httpx2.AsyncClient(base_url=model.base_url) as http:
        answer = (await http.post("/responses", json=responses_body(user("go"), stream=False))).json()
    calls = [(item["name"], item.get("namespace")) for item in answer["output"]]
    assert calls == [("get_nonce", "mcp__unit_agent"), ("not_offered", None), ("echo_token", "mcp__other")]
    assert answer["object"] == "response" and answer["status"] == "completed"


async def test_input_is_matched_and_templated_like_chat_messages() -> None:
    """Function calls and their outputs read as tool messages; Codex's `Wall time` line is not the tool's output."""
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        user("fetch the nonce"),
        {
            "type": "function_call",
            "namespace": "mcp__unit_agent",
            "name": "get_nonce",
            "arguments": "{}",
            "call_id": "c1",
        },
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [
                {"type": "input_text", "text": "Wall time: 0.0150 seconds\nOutput:"},
                {"type": "input_text", "text": '{"nonce": "n-1"}'},
            ],
        },
    ]
    assert chat_messages({"instructions": "system words", "input": items}) == [
        {"role": "system", "content": "system words"},
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "fetch the nonce"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_nonce", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"nonce": "n-1"}'},
    ]
    steps = [
        say("wrong", when=Match(last_role="user")),
        say("done:{{tool:get_nonce.nonce}} after {{last}}", when=Match(last_role="tool", system_contains="brief")),
    ]
    async with ScriptedModel(steps) as model, httpx2.AsyncClient(base_url=model.base_url) as http:
        answer = (await http.post("/responses", json=responses_body(*items, stream=False))).json()
    assert answer["output"][0]["content"][0]["text"] == 'done:n-1 after {"nonce": "n-1"}'


async def test_one_script_answers_chat_completions_and_responses_alike() -> None:
    script = [
        call(
            tool_call("echo_token", {"token": "{{user}}"}), when=Match(tools_offered=["echo_token"], last_role="user")
        ),
        say("echoed {{last}}", when=Match(last_role="tool"), repeat=True),
    ]
    chat_tools = [{"type": "function", "function": {"name": "echo_token", "parameters": {}}}]
    async with ScriptedModel(script) as model, httpx2.AsyncClient(base_url=model.base_url) as http:
        first = await http.post("/responses", json=responses_body(user("abc"), stream=False))
        assert json.loads(first.json()["output"][0]["arguments"]) == {"token": "abc"}
        chat = {
            "model": "m",
            "tools": chat_tools,
            "messages": [
                {"role": "user", "content": "abc"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"name": "echo_token", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c", "content": "abc"},
            ],
        }
        second = (await http.post("/chat/completions", json=chat)).json()
        assert second["choices"][0]["message"]["content"] == "echoed abc"
        output = {"type": "function_call_output", "call_id": "c", "output": "abc"}
        third = await http.post("/responses", json=responses_body(user("abc"), output, stream=False))
        assert third.json()["output"][0]["content"][0]["text"] == "echoed abc"


async def test_break_off_drops_the_final_events_of_both_apis() -> None:
    steps = [Step(text="cut short", break_off=True, repeat=True)]
    async with ScriptedModel(steps) as model, httpx2.AsyncClient(base_url=model.base_url) as http:
        streamed = sse((await http.post("/responses", json=responses_body(user("x")))).text)
        chat = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
        raw_chat = (await http.post("/chat/completions", json=chat)).text
        records = list(model.requests)
    kinds = [event["type"] for event in streamed]
    assert "response.output_text.delta" in kinds
    assert "response.output_item.done" not in kinds and "response.completed" not in kinds
    chunks = sse(raw_chat)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "cut short"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks) and "[DONE]" not in raw_chat
    assert [(r.finished, r.disconnected, r.error) for r in records] == [
        (False, False, "the stream was broken off, as scripted")
    ] * 2


async def test_errors_and_unmatched_requests_answer_with_an_http_error() -> None:
    steps = [Step(error=ScriptedError(status=429, message="slow down"), match=Match(user_contains="first"))]
    async with ScriptedModel(steps) as model, httpx2.AsyncClient(base_url=model.base_url) as http:
        limited = await http.post("/responses", json=responses_body(user("first")))
        unmatched = await http.post("/responses", json=responses_body(user("second")))
    assert limited.status_code == 429 and limited.json()["error"]["message"] == "scripted model: slow down"
    assert (
        unmatched.status_code == 400 and "no scripted step matches request #2" in unmatched.json()["error"]["message"]
    )

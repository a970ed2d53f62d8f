"""The scripted model's Anthropic Messages and Gemini faces on the wire: one script, its matches and its
templates answer them like chat completions (streamed and not), refusals come back in each API's error shape,
and the key a client sent is recorded. The real clients' runs are in test_headless_clients.py.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx2
import pytest

from unit_mcp.testing import Match, ScriptedModel, Step, call, say, tool_call

pytestmark = pytest.mark.anyio


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def _messages_body(*messages: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    tools = [{"name": "get_nonce", "input_schema": {"type": "object"}}]
    return {"model": "claude-x", "system": [{"type": "text", "text": "be brief"}], "messages": list(messages),
            "tools": tools, "stream": stream, "max_tokens": 100}  # fmt: skip


async def test_messages_stream_a_tool_call_then_answer_from_its_result() -> None:
    steps = [
        Step(
            tool_calls=[tool_call("get_nonce", {"n": 1})], text="calling", chunk_size=3, match=Match(last_role="user")
        ),
        say("nonce is {{tool:get_nonce.nonce}}", when=Match(last_role="tool", system_contains="be brief")),
    ]
    async with ScriptedModel(steps) as model, httpx2.AsyncClient(base_url=model.url) as http:
        first = await http.post(
            "/v1/messages",
            json=_messages_body({"role": "user", "content": "go"}, stream=True),
            headers={"x-api-key": "k1"},
        )
        events = _events(first.text)
        assert [e["type"] for e in events][:2] == ["message_start", "content_block_start"]
        assert events[-2]["delta"]["stop_reason"] == "tool_use" and events[-1]["type"] == "message_stop"
        text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
        arguments = "".join(e["delta"].get("partial_json", "") for e in events if e["type"] == "content_block_delta")
        assert text == "calling" and json.loads(arguments) == {"n": 1}
        use = next(e["content_block"] for e in events if e["type"] == "content_block_start" and e["index"] == 1)
        assert use["type"] == "tool_use" and use["name"] == "get_nonce"

        turn = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": use["id"], "name": "get_nonce", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": [
                {"type": "text", "text": '{"nonce": "n-42"}'}]}]},
        ]  # fmt: skip
        second = (await http.post("/v1/messages", json=_messages_body(*turn))).json()
    assert second["content"] == [{"type": "text", "text": "nonce is n-42"}] and second["stop_reason"] == "end_turn"
    first_request, second_request = model.requests
    assert first_request.api == "anthropic" and first_request.api_key == "k1" and first_request.stream
    assert second_request.last_message == {
        "role": "tool", "tool_call_id": use["id"], "content": '{"nonce": "n-42"}', "is_error": False,
    }  # fmt: skip
    assert second_request.tool_names == ["get_nonce"]


async def test_gemini_streams_calls_and_answers_from_unwrapped_results() -> None:
    steps = [
        call(tool_call("get_nonce", {"n": 1}), when=Match(last_role="user", has_tools=True)),
        say("nonce is {{tool:get_nonce.nonce}}", when=Match(last_role="tool")),
    ]
    tools = [{"functionDeclarations": [{"name": "get_nonce", "parametersJsonSchema": {"type": "object"}}]}]
    user = {"role": "user", "parts": [{"text": "go"}]}
    async with ScriptedModel(steps) as model, httpx2.AsyncClient(base_url=model.url) as http:
        path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
        first = await http.post(
            path, params={"alt": "sse"}, json={"contents": [user], "tools": tools}, headers={"x-goog-api-key": "k2"}
        )
        (chunk,) = _events(first.text)
        candidate = chunk["candidates"][0]
        assert candidate["finishReason"] == "STOP"
        call_part = candidate["content"]["parts"][0]["functionCall"]
        assert call_part["name"] == "get_nonce" and call_part["args"] == {"n": 1}
        wrapped = '<untrusted_context>\n{"nonce": "n-7"}\n</untrusted_context>'
        contents = [
            user,
            {"role": "model", "parts": [{"functionCall": call_part}]},
            {"role": "user", "parts": [{"functionResponse": {"id": call_part["id"], "name": "get_nonce",
                                                             "response": {"output": wrapped}}}]},
        ]  # fmt: skip
        second = await http.post("/v1beta/models/gemini-2.5-flash:generateContent", json={"contents": contents})
        counted = await http.post("/v1beta/models/gemini-2.5-flash:countTokens", json={"contents": contents})
    assert second.json()["candidates"][0]["content"]["parts"] == [{"text": "nonce is n-7"}]
    assert counted.json()["totalTokens"] > 0
    assert [r.api for r in model.requests] == ["gemini", "gemini"] and model.requests[0].api_key == "k2"
    assert model.requests[1].last_message["content"] == '{"nonce": "n-7"}'
    assert model.requests[0].body and model.requests[0].stream and not model.requests[1].stream


async def test_refusals_come_back_in_each_apis_error_shape() -> None:
    async with ScriptedModel([]) as model, httpx2.AsyncClient(base_url=model.url) as http:
        messages = await http.post("/v1/messages", json=_messages_body({"role": "user", "content": "x"}))
        gemini = await http.post("/v1beta/models/m:generateContent", json={"contents": []})
    assert messages.status_code == 400 and messages.json()["type"] == "error"
    assert "no scripted step matches" in messages.json()["error"]["message"]
    assert gemini.status_code == 400 and "no scripted step matches" in gemini.json()["error"]["message"]


STREAMED = {
    "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True},
             "data: [DONE]"),
    "responses": ("/v1/responses", {"model": "m", "input": "go", "stream": True}, "response.completed"),
    "anthropic": ("/v1/messages", _messages_body({"role": "user", "content": "go"}, stream=True), "message_stop"),
    "gemini": ("/v1beta/models/m:streamGenerateContent", {"contents": [{"role": "user", "parts": [{"text": "go"}]}]},
               "finishReason"),
}  # fmt: skip


@pytest.mark.parametrize("api", list(STREAMED))
async def test_every_api_streams_in_pieces_and_breaks_off_before_its_final_events(api: str) -> None:
    path, body, final = STREAMED[api]
    steps = [Step(text="hello world", chunk_size=3, chunk_delay=0.01, break_off=broken) for broken in (False, True)]
    async with ScriptedModel(steps) as model, httpx2.AsyncClient(base_url=model.url) as http:
        whole, broken = [(await http.post(path, json=body)).text for _ in steps]
    assert len(broken) < len(whole)
    assert all(piece in whole for piece in ('"hel"', '"lo "', '"wor"', '"ld"')), "the text goes out in pieces"
    assert '"hel"' in broken, "a stream that breaks off sends what comes before its final events"
    assert final in whole and final not in broken
    finished, cut = model.requests
    assert finished.api == api and finished.stream and finished.finished and finished.error is None
    assert not cut.finished and cut.error == "the stream was broken off, as scripted" and not cut.disconnected


async def test_a_step_after_another_waits_for_it_and_says_so_when_it_never_comes() -> None:
    steps = [
        say("first", when=Match(user_contains="one"), label="one", after="two"),
        say("second", when=Match(user_contains="two"), label="two", after="one"),
        say("alone", when=Match(user_contains="three"), label="three", after="nobody", after_timeout=0.2),
    ]
    body = {"model": "m", "messages": [{"role": "user", "content": "one"}]}
    async with ScriptedModel(steps) as model, httpx2.AsyncClient(base_url=model.url, timeout=10) as http:
        first = [None]

        async def ask_one() -> None:
            first[0] = (await http.post("/v1/chat/completions", json=body)).json()

        async with anyio.create_task_group() as group:
            group.start_soon(ask_one)
            await anyio.sleep(0.3)
            assert first[0] is None, "the step labelled one answered before step two was asked"
            second = (await http.post("/v1/chat/completions", json=body | {"messages": [
                {"role": "user", "content": "two"}]})).json()  # fmt: skip
        alone = await http.post(
            "/v1/chat/completions", json=body | {"messages": [{"role": "user", "content": "three"}]}
        )
    assert first[0]["choices"][0]["message"]["content"] == "first"  # type: ignore[index]
    assert second["choices"][0]["message"]["content"] == "second"
    assert alone.status_code == 400 and "waited 0.2 s for step 'nobody'" in alone.text
    assert [r.label for r in model.requests] == ["one", "two", "three"]

"""The scripted model as any client sees it: OpenAI-compatible JSON and SSE, matching, logging, CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from unit_mcp.testing import Match, Script, ScriptedModel, Step, call, say, tool_call

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]


def body(*messages: dict[str, Any], stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), "stream": stream, **extra}


def sse_events(text: str) -> list[Any]:
    return [
        line[6:] if line[6:] == "[DONE]" else json.loads(line[6:])
        for line in text.splitlines()
        if line.startswith("data: ")
    ]


async def test_plain_json_answers_with_text_or_tool_calls() -> None:
    steps = [say("hello there"), call(tool_call("unit_list"), tool_call("echo_token", {"token": "x"}, id="call-7"))]
    async with ScriptedModel(steps) as model, httpx2.AsyncClient(base_url=model.base_url) as http:
        first = (await http.post("/chat/completions", json=body({"role": "user", "content": "hi"}))).json()
        assert first["object"] == "chat.completion" and first["model"] == "m"
        assert first["choices"][0]["message"] == {"role": "assistant", "content": "hello there"}
        assert first["choices"][0]["finish_reason"] == "stop" and first["usage"]["total_tokens"] > 0
        second = (await http.post("/chat/completions", json=body({"role": "user", "content": "go"}))).json()
        calls = second["choices"][0]["message"]["tool_calls"]
        assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
            ("call_2_0", "unit_list", {}),
            ("call-7", "echo_token", {"token": "x"}),
        ]
        assert second["choices"][0]["finish_reason"] == "tool_calls"
        models = (await http.get("/models")).json()
        assert models["data"][0]["id"] == "scripted"


async def test_streaming_sends_openai_chunks_usage_and_done() -> None:
    steps = [Step(text="abcdefghij", chunk_size=4, tool_calls=[tool_call("t", {"k": "v"})])]
    async with ScriptedModel(steps) as model, httpx2.AsyncClient(base_url=model.base_url) as http:
        request = body({"role": "user", "content": "x"}, stream=True, stream_options={"include_usage": True})
        response = await http.post("/chat/completions", json=request)
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content", "") for d in deltas) == "abcdefghij"
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["id"] and calls[0]["function"]["name"] == "t"
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"k": "v"}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


async def test_steps_match_requests_repeat_and_fail_loudly_when_nothing_matches(tmp_path: Path) -> None:
    steps = [
        say("title", when=Match(system_contains="title generator"), repeat=True, label="title"),
        say("second", when=Match(last_role="tool"), label="after-tool"),
        say("first", label="plain"),
        say("{{user.missing}}", when=Match(user_contains="template"), label="broken"),
    ]
    log = tmp_path / "requests.jsonl"
    async with ScriptedModel(steps, log_path=log) as model, httpx2.AsyncClient(base_url=model.url) as http:

        async def ask(*messages: dict[str, Any]) -> httpx2.Response:
            return await http.post("/v1/chat/completions", json=body(*messages))

        title = {"role": "system", "content": "You are a title generator."}
        assert (await ask(title, {"role": "user", "content": "a"})).json()["choices"][0]["message"][
            "content"
        ] == "title"
        assert (await ask({"role": "user", "content": "b"})).json()["choices"][0]["message"]["content"] == "first"
        tool = {"role": "tool", "tool_call_id": "c", "content": "r"}
        assert (await ask({"role": "user", "content": "b"}, tool)).json()["choices"][0]["message"][
            "content"
        ] == "second"
        assert (await ask(title, {"role": "user", "content": "c"})).json()["choices"][0]["message"][
            "content"
        ] == "title"
        broken = await ask({"role": "user", "content": "template please"})
        assert broken.status_code == 400 and "no missing in" in broken.json()["error"]["message"]
        nothing = await ask({"role": "user", "content": "d"})
        assert nothing.status_code == 400
        assert "no scripted step matches request #6" in nothing.json()["error"]["message"]
        model.assert_done()

        logged = (await http.get("/_scripted/requests")).json()
        assert [(r["index"], r["label"], r["status"]) for r in logged] == [
            (1, "title", 200),
            (2, "plain", 200),
            (3, "after-tool", 200),
            (4, "title", 200),
            (5, "broken", 400),
            (6, None, 400),
        ]
    assert [json.loads(line)["index"] for line in log.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]


async def test_steps_can_be_added_over_http_and_unused_steps_are_reported() -> None:
    async with ScriptedModel() as model, httpx2.AsyncClient(base_url=model.url) as http:
        added = await http.post("/_scripted/steps", json=[{"text": "late"}, {"text": "never", "label": "spare"}])
        assert added.json() == {"added": 2, "steps": 2}
        assert (await http.post("/_scripted/steps", json=[{"txt": "typo"}])).status_code == 400
        reply = await http.post("/v1/chat/completions", json=body({"role": "user", "content": "x"}))
        assert reply.json()["choices"][0]["message"]["content"] == "late"
        with pytest.raises(AssertionError, match=r"1 scripted step.*spare"):
            model.assert_done()


def test_synchronous_use_with_the_openai_sdk() -> None:
    """Users test their own (synchronous) agents offline: the server runs in a thread of its own."""
    with ScriptedModel([say("offline answer")]) as model:
        client = openai.OpenAI(base_url=model.base_url, api_key="unused")
        completion = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        client.close()
    assert completion.choices[0].message.content == "offline answer"
    assert model.requests[0].last_text == "hi"


def test_the_command_line_serves_a_script_until_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(Script(steps=[say("from the cli")]).model_dump_json())
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "unit_mcp.testing", "--script", str(script), "--log", str(log)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line.startswith("OPENAI_BASE_URL=http://127.0.0.1:")
        base_url = line.split("=", 1)[1]
        reply = httpx2.post(f"{base_url}/chat/completions", json=body({"role": "user", "content": "x"}), timeout=10)
        assert reply.json()["choices"][0]["message"]["content"] == "from the cli"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert json.loads(log.read_text())["index"] == 1


async def test_the_readme_example_script_is_valid_and_plays() -> None:
    """docs/agent.md documents the step format with one script holding every field; it must parse and answer."""
    readme = (REPO / "docs" / "agent.md").read_text()
    script = Script.parse(readme.split("Every field of a step, in one script:\n\n```json\n", 1)[1].split("```", 1)[0])
    assert len(script.steps) == 6
    tools = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in ("unit_inspect", "x")]
    async with ScriptedModel(script) as model, httpx2.AsyncClient(base_url=model.base_url) as http:
        asked = body({"role": "user", "content": "what is counter?"}, tools=tools)
        answer = (await http.post("/chat/completions", json=asked)).json()["choices"][0]["message"]
        assert answer["content"] == "Let me look."
        assert answer["tool_calls"][0]["function"] == {"name": "unit_inspect", "arguments": '{"unit_id": "counter"}'}
        refused = await http.post("/chat/completions", json=body({"role": "user", "content": "hi"}))
        assert refused.status_code == 429 and refused.json()["error"]["message"] == "scripted model: slow down"

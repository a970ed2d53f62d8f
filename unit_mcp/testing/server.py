"""ScriptedModel: an OpenAI-compatible model server on loopback that answers from a script.

It answers chat completions (JSON or SSE chunks) and, from the same script, the Responses, Anthropic and Gemini
APIs; every request is logged with the step that answered it. Use it as `async with ScriptedModel(steps)` in an
event loop, or `with ScriptedModel(steps)` from synchronous code (it serves from a thread of its own).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.from_thread
from pydantic import BaseModel, Field, TypeAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from unit_mcp.loopback import LoopbackServer

from . import anthropic, chat, gemini, responses
from .script import Mark, Script, ScriptError, Step, message_text, offered_tools, render, render_value

STEPS = TypeAdapter(list[Step])


def api_of(path: str) -> str:
    """Which API a request path speaks: "chat", "responses", "anthropic" or "gemini"."""
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/messages"):
        return "anthropic"
    if path.endswith("enerateContent"):
        return "gemini"
    return "chat"


def chat_view(path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """Any API's request as a chat-completions body: what matches, templates and usage read."""
    api = api_of(path)
    if api == "chat":
        return dict(body)
    face = {"responses": responses, "anthropic": anthropic, "gemini": gemini}[api]
    model: Any
    if api == "gemini":  # the model and whether to stream are in the path
        model, stream = gemini.model_of(path), path.endswith(":streamGenerateContent")
    else:
        model, stream = body.get("model"), bool(body.get("stream"))
    return {
        "model": model,
        "messages": face.chat_messages(body),
        "tools": [{"type": "function", "function": {"name": name}} for name in face.offered(body)],
        "stream": stream,
    }


class ScriptedModelError(RuntimeError):
    """The scripted model cannot serve as asked (a host that is not loopback, a port in use)."""


class RecordedRequest(BaseModel):
    """One request as the scripted model saw it, and how it answered."""

    index: int
    path: str
    body: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    step: int | None = None
    label: str | None = None
    status: int = 200
    error: str | None = None
    received_at: float = Field(default_factory=time.time)
    api_key: str | None = None
    finished: bool = False
    disconnected: bool = False

    @property
    def api(self) -> str:
        return api_of(self.path)

    @property
    def responses_api(self) -> bool:
        return self.api == "responses"

    @property
    def messages(self) -> list[dict[str, Any]]:
        """Chat-completion messages (a Responses, Messages or Gemini request seen as such)."""
        return list(chat_view(self.path, self.body).get("messages") or [])

    @property
    def last_message(self) -> dict[str, Any]:
        return self.messages[-1] if self.messages else {}

    @property
    def last_text(self) -> str:
        return message_text(self.last_message)

    @property
    def tool_names(self) -> list[str]:
        if self.api == "responses":
            return list(responses.offered(self.body))
        return offered_tools(chat_view(self.path, self.body))


def _usage(step: Step, body: Mapping[str, Any], text: str, arguments: list[str]) -> dict[str, int]:
    if step.usage is not None:
        prompt, completion = step.usage.prompt_tokens, step.usage.completion_tokens
    else:
        prompt = max(1, len(json.dumps(body.get("messages") or [])) // 4)
        completion = max(1, math.ceil((len(text) + sum(map(len, arguments))) / 4))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Answer(Protocol):
    """What a step renders to for one request, in the API it goes out in."""

    def body(self) -> dict[str, Any]:
        """The whole answer, for a request that does not stream."""

    def stream(self, chunk_size: int) -> Iterator[str | Mark]:
        """The answer's server-sent events, with the places a step's timing applies."""


def _in_api(
    record: RecordedRequest, model: str, text: str, calls: list[dict[str, str]], usage: dict[str, int]
) -> Answer:
    """A rendered step in the API of the request it answers."""
    created, n, reply = int(record.received_at), record.index, (model, text, calls, usage)
    if record.api == "responses":
        return responses.ResponseAnswer(*reply, response_id=f"resp_scripted_{n}", created_at=created)
    if record.api == "anthropic":
        return anthropic.MessageAnswer(*reply, message_id=f"msg_scripted_{n}")
    if record.api == "gemini":
        return gemini.ContentAnswer(*reply)
    stream_usage = bool((record.body.get("stream_options") or {}).get("include_usage"))
    return chat.CompletionAnswer(
        *reply, completion_id=f"chatcmpl-scripted-{n}", created=created, stream_usage=stream_usage
    )


def _api_key(request: Request) -> str | None:
    """The key the client authenticated with, whichever API's header carries it (to test which key was used)."""
    authorization = request.headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[7:]
    return request.headers.get("x-api-key") or request.headers.get("x-goog-api-key") or request.query_params.get("key")


class ScriptedModel:
    def __init__(
        self,
        script: Script | Iterable[Step] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "scripted",
        log_path: str | Path | None = None,
    ) -> None:
        steps = script.steps if isinstance(script, Script) else list(script or [])
        self.steps: list[Step] = list(steps)
        self.model = model
        self.log_path = Path(log_path) if log_path is not None else None
        self.requests: list[RecordedRequest] = []
        self._used: set[int] = set()
        self._lock = threading.Lock()
        self._loopback = LoopbackServer(host=host, port=port, error=ScriptedModelError)
        self._thread_cm: AbstractContextManager[ScriptedModel] | None = None
        self._portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] | None = None
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._serve, methods=["POST"]),
                Route("/chat/completions", self._serve, methods=["POST"]),
                Route("/v1/responses", self._serve, methods=["POST"]),
                Route("/responses", self._serve, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/models", self._models, methods=["GET"]),
                Route("/v1/messages", self._serve, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
                Route("/v1beta/models/{name:path}", self._gemini, methods=["POST"]),
                Route("/_scripted/requests", self._requests, methods=["GET"]),
                Route("/_scripted/steps", self._add_steps, methods=["POST"]),
            ]
        )

    # -- script ---------------------------------------------------------------------------------

    def add(self, *steps: Step) -> None:
        with self._lock:
            self.steps.extend(steps)

    @property
    def remaining(self) -> list[Step]:
        """Steps not used yet (repeat steps excluded)."""
        with self._lock:
            return [step for i, step in enumerate(self.steps) if i not in self._used and not step.repeat]

    def assert_done(self) -> None:
        """Fail if some scripted steps were never asked for (the agent stopped early or went elsewhere)."""
        left = self.remaining
        if left:
            labels = ", ".join(step.label or (step.text or "tool calls")[:40] for step in left)
            raise AssertionError(f"{len(left)} scripted step(s) were never used: {labels}")

    def _choose(self, body: Mapping[str, Any]) -> tuple[int, Step] | None:
        with self._lock:
            for index, step in enumerate(self.steps):
                if index in self._used and not step.repeat:
                    continue
                if step.applies(body):
                    if not step.repeat:
                        self._used.add(index)
                    return index, step
        return None

    # -- serving --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._loopback.base_url

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as `base_url`."""
        return f"{self._loopback.base_url}/v1"

    async def __aenter__(self) -> ScriptedModel:
        await self._loopback.start(self.app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._loopback.stop()

    def __enter__(self) -> ScriptedModel:
        """Serve from a thread with its own event loop, for synchronous tests and scripts."""
        self._portal_cm = anyio.from_thread.start_blocking_portal()
        portal = self._portal_cm.__enter__()
        try:
            self._thread_cm = portal.wrap_async_context_manager(self)
            self._thread_cm.__enter__()
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._thread_cm is not None:
                self._thread_cm.__exit__(None, None, None)
        finally:
            if self._portal_cm is not None:
                self._portal_cm.__exit__(None, None, None)
            self._thread_cm = self._portal_cm = None

    # -- endpoints ------------------------------------------------------------------------------

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "unit-mcp"}]})

    async def _requests(self, request: Request) -> Response:
        return JSONResponse([record.model_dump(mode="json") for record in self.requests])

    async def _add_steps(self, request: Request) -> Response:
        try:
            steps = STEPS.validate_json(await request.body())
        except ValueError as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "invalid_steps"}}, status_code=400)
        self.add(*steps)
        return JSONResponse({"added": len(steps), "steps": len(self.steps)})

    async def _answer(self, request: Request) -> tuple[RecordedRequest, Step, Answer] | Response:
        """Record the request, choose its step and render it; a refusal comes back as the HTTP response."""
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as exc:
            return JSONResponse({"error": {"message": f"invalid JSON body: {exc}", "type": "invalid_request"}}, 400)
        record = RecordedRequest(
            index=len(self.requests) + 1, path=request.url.path, body=body, api_key=_api_key(request)
        )
        view = chat_view(record.path, body)
        record.stream = bool(view.get("stream"))
        self.requests.append(record)
        responses_api = record.api == "responses"
        chosen = self._choose(view)
        if chosen is None:
            return await self._refuse(
                record, f"no scripted step matches request #{record.index} (last: {record.last_text[:200]!r})"
            )
        record.step, step = chosen
        record.label = step.label
        if step.error is not None:
            return await self._refuse(record, step.error.message, status=step.error.status, kind=step.error.type)
        try:
            text = render(step.text or "", view)
            calls = [
                {
                    "id": call.id or f"call_{record.index}_{position}",
                    "name": call.name,
                    "arguments": json.dumps(render_value(call.arguments, view))
                    if isinstance(call.arguments, dict)
                    else render(call.arguments, view),
                    **({"namespace": responses.namespace_of(call, body) or ""} if responses_api else {}),
                }
                for position, call in enumerate(step.tool_calls)
            ]
        except ScriptError as exc:
            return await self._refuse(record, str(exc))
        usage = _usage(step, view, text, [c["arguments"] for c in calls])
        if step.after is not None and not await self._seen_label(step.after, step.after_timeout):
            return await self._refuse(
                record, f"step {step.label or record.step} waited {step.after_timeout:g} s for step {step.after!r}"
            )
        if step.delay:
            await anyio.sleep(step.delay)
        return record, step, _in_api(record, str(view.get("model") or self.model), text, calls, usage)

    async def _seen_label(self, label: str, timeout: float) -> bool:
        """Whether a request answered by the step labelled `label` arrives within `timeout` seconds."""
        with anyio.move_on_after(timeout):
            while not any(r.label == label for r in self.requests):
                await anyio.sleep(0.02)
            return True
        return False

    async def _serve(self, request: Request) -> Response:
        """Any API's request answered from the script, whole or streamed."""
        answer = await self._answer(request)
        if isinstance(answer, Response):
            return answer
        record, step, scripted = answer
        if record.stream:
            events = self._stream(record, step, scripted.stream(step.chunk_size))
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        record.finished = True
        await self._log(record)
        return JSONResponse(scripted.body())

    async def _count_tokens(self, request: Request) -> Response:
        """An estimate (a quarter of the request's length), never recorded: clients ask it on the side."""
        return JSONResponse({"input_tokens": max(1, len(await request.body()) // 4)})

    async def _gemini(self, request: Request) -> Response:
        path = request.url.path
        if path.endswith(":countTokens"):
            return JSONResponse({"totalTokens": max(1, len(await request.body()) // 4)})
        if not path.endswith("enerateContent"):
            return JSONResponse(gemini.error(f"scripted model: no such method {path}", 404, "not_found"), 404)
        return await self._serve(request)

    async def _refuse(
        self, record: RecordedRequest, message: str, *, status: int = 400, kind: str = "script_error"
    ) -> Response:
        record.status, record.error, record.finished = status, message, True
        await self._log(record)
        text = f"scripted model: {message}"
        if record.api == "anthropic":
            return JSONResponse(anthropic.error(text, kind), status_code=status)
        if record.api == "gemini":
            return JSONResponse(gemini.error(text, status, kind), status_code=status)
        return JSONResponse({"error": {"message": text, "type": kind}}, status_code=status)

    async def _stream(self, record: RecordedRequest, step: Step, events: Iterator[str | Mark]) -> AsyncIterator[str]:
        """Send an answer's events, waiting the step's `chunk_delay` at each pause and ending at the first cut if the
        step breaks off; logged once however it ends (a client gone mid-stream is recorded as disconnected)."""
        try:
            for event in events:
                if event is Mark.PAUSE:
                    if step.chunk_delay:
                        await anyio.sleep(step.chunk_delay)
                elif event is Mark.CUT:
                    if step.break_off:
                        record.error = "the stream was broken off, as scripted"
                        return
                else:
                    yield event
            record.finished = True
        finally:
            record.disconnected = not record.finished and record.error is None
            with anyio.CancelScope(shield=True):
                await self._log(record)

    async def _log(self, record: RecordedRequest) -> None:
        path = self.log_path
        if path is None:
            return
        line = record.model_dump_json() + "\n"

        def append() -> None:
            with path.open("a", encoding="utf-8") as out:
                out.write(line)

        await anyio.to_thread.run_sync(append)

"""OpenAIAgent: an OpenAI-compatible chat-completions model driving the client-side tool loop.

The `openai` SDK is used directly with a `base_url`, so any compatible endpoint works. A client per turn keeps
connections inside the turn's event loop; the TLS context they share is built once (bench/RESULTS.md).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import ssl
import threading
from collections.abc import AsyncIterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import httpx2
import openai.resources.chat.chat  # noqa: F401  (the SDK imports it lazily, inside the first request)
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from ._loop import LoopAgent
from .hooks import ModelRequest, ModelResponse, ToolCall, new_call_id
from .items import MessageItem, Usage

if TYPE_CHECKING:
    from ._context import TurnContext

_turn_client: ContextVar[AsyncOpenAI | None] = ContextVar("unit_mcp_openai_turn_client", default=None)


_tls_context: concurrent.futures.Future[ssl.SSLContext] = concurrent.futures.Future()


def _build_tls() -> None:
    """The TLS context every turn's client verifies with: the one the SDK builds by default, built once."""
    try:
        _tls_context.set_result(httpx2.create_ssl_context())
    except BaseException as exc:
        _tls_context.set_exception(exc)


threading.Thread(target=_build_tls, name="unit-mcp-openai-tls", daemon=True).start()


class OpenAIAgent(LoopAgent):
    def __init__(
        self,
        *,
        model: str,
        client: AsyncOpenAI | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        id: str = "openai",
        provider: str = "openai",
        stream: bool = True,
        parallel_tool_calls: bool | None = True,
        request_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        """`client` wins over `base_url`/`api_key`; a local `base_url` needs no real key."""
        super().__init__(id=id, **options)
        self._client = client
        self.base_url = base_url
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or ("unused" if base_url else None)
        self.model = model
        self.provider = provider
        self.stream = stream
        self.parallel_tool_calls = parallel_tool_calls
        self.request_options = dict(request_options or {})

    @property
    def client(self) -> AsyncOpenAI:
        client = self._client or _turn_client.get()
        if client is None:
            raise RuntimeError("OpenAIAgent.client is only available inside a turn")
        return client

    @contextlib.asynccontextmanager
    async def turn_scope(self, ctx: TurnContext) -> AsyncIterator[object]:
        """A client of its own for the turn (closed at its end), unless one was given."""
        if self._client is not None:
            yield self._client
            return
        http = DefaultAsyncHttpxClient(verify=_tls_context.result())
        async with AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, http_client=http) as client:
            token = _turn_client.set(client)
            try:
                yield client
            finally:
                _turn_client.reset(token)

    async def request(self, request: ModelRequest, ctx: TurnContext) -> ModelResponse:
        kwargs: dict[str, Any] = {"model": self.model, "messages": request.messages, **self.request_options}
        if request.tools:
            kwargs["tools"] = request.tools
            if self.parallel_tool_calls is not None:
                kwargs["parallel_tool_calls"] = self.parallel_tool_calls
        if self.stream:
            return await self._streamed(kwargs, ctx)
        completion = await self.client.chat.completions.create(**kwargs)
        message = completion.choices[0].message
        calls = [
            ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments or "{}")
            for call in message.tool_calls or []
            if call.type == "function"
        ]
        usage = completion.usage
        return ModelResponse(
            content=message.content or "",
            tool_calls=calls,
            usage=Usage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens) if usage else None,
            model=completion.model,
            provider=self.provider,
        )

    async def _streamed(self, kwargs: dict[str, Any], ctx: TurnContext) -> ModelResponse:
        stream = await self.client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
        parts: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage: Usage | None = None
        model: str | None = None
        message_id: str | None = None
        async with stream:
            async for chunk in stream:
                model = chunk.model or model
                if chunk.usage is not None:
                    usage = Usage(input_tokens=chunk.usage.prompt_tokens, output_tokens=chunk.usage.completion_tokens)
                for choice in chunk.choices:
                    delta = choice.delta
                    if delta.content:
                        parts.append(delta.content)
                        message_id = await self._partial(ctx, message_id, "".join(parts), model)
                    for call in delta.tool_calls or []:
                        slot = calls.setdefault(call.index, {"id": None, "name": "", "arguments": []})
                        slot["id"] = slot["id"] or call.id
                        if call.function is not None:
                            slot["name"] = slot["name"] or call.function.name or ""
                            slot["arguments"].append(call.function.arguments or "")
        return ModelResponse(
            content="".join(parts),
            tool_calls=[
                ToolCall(
                    id=slot["id"] or new_call_id(), name=slot["name"], arguments="".join(slot["arguments"]) or "{}"
                )
                for _, slot in sorted(calls.items())
            ],
            usage=usage,
            model=model,
            provider=self.provider,
            message_id=message_id,
        )

    async def _partial(self, ctx: TurnContext, message_id: str | None, text: str, model: str | None) -> str:
        if message_id is None:
            item = await ctx.turn.append_item(
                MessageItem(role="assistant", content=text, partial=True, provider=self.provider, model=model)
            )
            return item.id
        await ctx.turn.update_item(message_id, content=text, persist=False)
        return message_id

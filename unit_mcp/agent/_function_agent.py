"""FunctionAgent: the step loop with a Python function in place of the model.

Deterministic agents (and tests of agent code) need no network: the function sees the same request a
model would (chat messages and offered tools) and answers with text or tool calls. Everything else (tools,
approvals, steering, hooks, persistence) is the real loop.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ._loop import LoopAgent
from .hooks import ModelRequest, ModelResponse

if TYPE_CHECKING:
    from ._context import TurnContext

ModelFunction = Callable[[ModelRequest, "TurnContext"], "ModelResponse | str | Awaitable[ModelResponse | str]"]


class FunctionAgent(LoopAgent):
    def __init__(self, fn: ModelFunction, *, id: str = "function", model: str | None = None, **options: Any) -> None:
        super().__init__(id=id, **options)
        self.fn = fn
        self.model = model or getattr(fn, "__name__", "function")

    async def request(self, request: ModelRequest, ctx: TurnContext) -> ModelResponse:
        value = self.fn(request, ctx)
        if inspect.isawaitable(value):
            value = await value
        response = ModelResponse(content=value) if isinstance(value, str) else value
        return response.model_copy(
            update={"provider": response.provider or "function", "model": response.model or self.model}
        )

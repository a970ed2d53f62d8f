"""TurnRecorder: how every agent writes what happens in its turn into the session, in one place.

A tool call is opened once as it starts and closed once with its result; streamed text is one partial message
made final in place, and text nothing confirmed is labelled so it is never taken for an answer. `drive` is the
one choreography of a turn run by an external process (Codex, OpenCode).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from .errors import TurnClosed
from .items import Item, MessageItem, ToolCallItem, ToolResultItem

if TYPE_CHECKING:
    from .toolsurface import AgentToolSurface, ToolOutput
    from .turns import CancelHook, TurnController

T = TypeVar("T")


class TurnRecorder:
    def __init__(self, turn: TurnController, tools: AgentToolSurface, *, provider: str | None = None) -> None:
        self.turn = turn
        self.tools = tools
        self.provider = provider
        self._calls: dict[str, ToolCallItem] = {}  # call id -> its item
        self._closed: set[str] = set()
        self._partials: dict[str, str] = {}  # the provider's message id -> the partial item streaming it

    async def open_call(
        self, call_id: str, name: str, arguments: str, *, source: str | None = None, parent_id: str | None = None
    ) -> ToolCallItem | None:
        """Record a call as it starts; None if it was recorded already. `source` defaults to the tool's."""
        if call_id in self._calls:
            return None
        known = self.tools.get(name)
        item = await self.turn.append_item(
            ToolCallItem(
                name=name,
                arguments=arguments,
                call_id=call_id,
                risk=known.risk if known is not None else None,
                source=source if source is not None or known is None else known.source,
                provider=self.provider,
                parent_id=parent_id,
            )
        )
        assert isinstance(item, ToolCallItem)
        self._calls[call_id] = item
        return item

    async def close_call(self, call_id: str, output: ToolOutput) -> None:
        """Record an opened call's result, once."""
        call = self._calls.get(call_id)
        if call is None or call_id in self._closed:
            return
        self._closed.add(call_id)
        await self.turn.append_item(
            ToolResultItem(
                name=call.name,
                call_id=call_id,
                output=output.text,
                is_error=output.is_error,
                structured=output.structured,
                parent_id=call.id,
            )
        )

    async def stream(self, message_id: str, text: str, *, model: str | None = None) -> None:
        """The partial message streaming the provider's message `message_id` now shows `text`."""
        item_id = self._partials.get(message_id)
        if item_id is None:
            partial = MessageItem(role="assistant", content=text, partial=True, provider=self.provider, model=model)
            self._partials[message_id] = (await self.turn.append_item(partial)).id
        else:
            await self.turn.update_item(item_id, content=text, persist=False)

    async def put_message(self, message: MessageItem, message_id: str | None) -> Item:
        """A complete message: into the partial that streamed it (keeping its place), else appended."""
        streamed = self._partials.pop(message_id, None) if message_id is not None else None
        if streamed is None:
            return await self.turn.append_item(message)
        fields: dict[str, Any] = message.model_dump(include={"content", "kind", "provider", "model", "usage"})
        return await self.turn.update_item(streamed, partial=False, **fields)

    async def close_partials(self, kind: str) -> None:
        """Streamed text nothing confirmed stays as it was streamed, labelled with `kind`."""
        for message_id, item_id in list(self._partials.items()):
            self._partials.pop(message_id)
            with contextlib.suppress(TurnClosed):
                await self.turn.update_item(item_id, partial=False, kind=kind)


async def drive(
    recorder: TurnRecorder,
    work: Callable[[], Awaitable[T]],
    *,
    cancel: CancelHook,
    settle: Callable[[], Awaitable[None]],
    alongside: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (),
    catch_up: Callable[[], Awaitable[None]] | None = None,
    timeout: float = math.inf,
) -> T | None:
    """Drive an external process through a turn: `work` runs beside the `alongside` tasks, within `timeout`
    (None if it ran out). `cancel` interrupts the process; cancelled or out of time, `settle` records what it
    still did; failing, `catch_up` lets followers record what it sent. Unconfirmed text is labelled after."""
    recorder.turn.set_cancel(cancel)
    try:
        async with anyio.create_task_group() as tg:
            for task in alongside:
                tg.start_soon(task)
            try:
                with anyio.move_on_after(timeout) as deadline:
                    result = await work()
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    await settle()
                raise
            except Exception:
                if catch_up is not None:
                    await catch_up()
                raise
            else:
                if deadline.cancelled_caught:
                    await settle()
            finally:
                tg.cancel_scope.cancel()
    except BaseException as exc:
        kind = "interrupted" if isinstance(exc, anyio.get_cancelled_exc_class()) else "unconfirmed"
        with anyio.CancelScope(shield=True):
            await recorder.close_partials(kind)
        raise
    return None if deadline.cancelled_caught else result

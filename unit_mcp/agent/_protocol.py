"""The agent contract: `Agent.run(input, session, ctx)` drives one turn, reporting only through `ctx`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ._context import TurnContext
    from .items import Session


@runtime_checkable
class Agent(Protocol):
    """A runtime object built by a factory. `run` drives the turn and ends it with `ctx.turn.finish/fail`."""

    id: str
    name: str

    async def run(self, input: str, session: Session, ctx: TurnContext) -> None: ...

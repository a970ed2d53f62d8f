"""What the runner hands an agent on every turn: `TurnContext`.

The context is narrow on purpose: the turn controller, the shared tool surface, the session's approvals and
inbox, the agents by id (`agents`, the runner's registry) and delegation as a callable. It never holds the
runner, so agents, tools and the runner do not import each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from ._inbox import Inbox
from ._turnapprovals import TurnApprovals
from .items import Session
from .sessions import SessionStore
from .turns import TurnController, TurnHandle

if TYPE_CHECKING:
    from .presets import PresetInfo
    from .toolsurface import AgentToolSurface, ToolDef, ToolOutput

Delegate = Callable[[str, str, str, str | None], Awaitable[TurnHandle]]
"""`(agent_id, input, title, child_session_id)`: start a turn of `agent_id` in a child session of this one (a new
one, or the given id: an existing child of this session for that agent, or a new child created with that id);
its handle."""


class NamedAgent(Protocol):
    id: str


class Agents(Protocol):
    """The runner's `AgentRegistry` as a turn sees it: agents by id (a protocol here: the registry imports the
    agent contract, which imports this module)."""

    def get(self, agent_id: str) -> NamedAgent | None: ...

    def require(self, agent_id: str) -> NamedAgent: ...


@dataclass
class TurnContext:
    session_id: str
    turn: TurnController
    tools: AgentToolSurface
    approvals: TurnApprovals
    inbox: Inbox
    store: SessionStore
    delegate: Delegate
    agents: Agents
    """The registered agents by id (`agents.require("helper")`): whom this turn can delegate to."""

    @property
    def session(self) -> Session:
        return self.store.require(self.session_id)

    async def save_data(self, **values: Any) -> None:
        """Merge `values` into the session's data (what survives a restart: a provider's session id, say)."""
        data = {**self.store.require(self.session_id).data, **values}
        await anyio.to_thread.run_sync(lambda: self.store.update(self.session_id, data=data))

    def visible_tools(self) -> list[ToolDef]:
        return self.tools.visible(self.approvals.grants(), interactive=True)

    @property
    def presets(self) -> list[PresetInfo]:
        """The active capability presets (their tools and highest risk); empty when the surface has none."""
        return self.tools.preset_infos(active_only=True)

    async def activate_preset(self, name: str) -> ToolOutput:
        """Activate a preset as the `preset_activate` tool does: above `normal` risk it is an approval request
        (recorded, answerable through the runner), and the change is a session item. An error output says why not."""
        from .presets import ACTIVATE

        return await self.tools.call(ACTIVATE, {"name": name}, self)

    async def deactivate_preset(self, name: str) -> ToolOutput:
        from .presets import DEACTIVATE

        return await self.tools.call(DEACTIVATE, {"name": name}, self)

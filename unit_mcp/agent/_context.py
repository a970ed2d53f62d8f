"""What the runner hands an agent on every turn: `TurnContext`.

The context is narrow on purpose: the turn controller, the shared tool surface, the session's approvals and
inbox, and delegation as a callable. It never holds the runner, so agents, tools and the runner do not
import each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._inbox import Inbox
from ._turnapprovals import TurnApprovals, save_session_data
from .items import Session
from .sessions import SessionStore
from .turns import TurnController, TurnHandle

if TYPE_CHECKING:
    from .presets import PresetInfo
    from .toolsurface import AgentToolSurface, ToolDef, ToolOutput

Delegate = Callable[[str, str, str], Awaitable[TurnHandle]]
"""`(agent_id, input, title)`: start a turn of `agent_id` in a new child session of this one; its handle."""


@dataclass
class TurnContext:
    session_id: str
    turn: TurnController
    tools: AgentToolSurface
    approvals: TurnApprovals
    inbox: Inbox
    store: SessionStore
    delegate: Delegate

    @property
    def session(self) -> Session:
        return self.store.require(self.session_id)

    async def save_data(self, **values: Any) -> None:
        await save_session_data(self.store, self.session_id, **values)

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

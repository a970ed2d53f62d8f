"""AgentRegistry: stable agent ids mapped to factories, built lazily on first use and then cached.

Factories close over what an agent needs (provider clients, models, policies) and receive the registry's
shared deps, so agents never look anything up globally.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from ._protocol import Agent
from .errors import UnknownAgent

AgentFactory = Callable[[Mapping[str, Any]], Agent]


class AgentInfo(BaseModel):
    id: str
    name: str
    built: bool


class AgentRegistry:
    def __init__(self, deps: Mapping[str, Any] | None = None) -> None:
        self.deps: dict[str, Any] = dict(deps or {})
        self._factories: dict[str, tuple[str, AgentFactory]] = {}
        self._agents: dict[str, Agent] = {}

    def register(self, agent_id: str, factory: AgentFactory, *, name: str | None = None) -> None:
        """Register (or replace) a factory; a replaced agent is rebuilt on its next `get`."""
        self._factories[agent_id] = (name or agent_id, factory)
        self._agents.pop(agent_id, None)

    def unregister(self, agent_id: str) -> bool:
        self._agents.pop(agent_id, None)
        return self._factories.pop(agent_id, None) is not None

    def get(self, agent_id: str) -> Agent | None:
        """The agent, built on first call; None if no such id. A failing factory raises `UnknownAgent`."""
        agent = self._agents.get(agent_id)
        if agent is not None:
            return agent
        entry = self._factories.get(agent_id)
        if entry is None:
            return None
        try:
            agent = entry[1](self.deps)
        except Exception as exc:
            raise UnknownAgent(f"the factory of agent {agent_id!r} failed: {type(exc).__name__}: {exc}") from exc
        self._agents[agent_id] = agent
        return agent

    def require(self, agent_id: str) -> Agent:
        agent = self.get(agent_id)
        if agent is None:
            known = ", ".join(sorted(self._factories)) or "none"
            raise UnknownAgent(f"no agent registered as {agent_id!r} (registered: {known})")
        return agent

    def list(self) -> list[AgentInfo]:
        return [
            AgentInfo(id=agent_id, name=name, built=agent_id in self._agents)
            for agent_id, (name, _) in sorted(self._factories.items())
        ]

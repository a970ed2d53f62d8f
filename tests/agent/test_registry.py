"""AgentRegistry: lazy, cached factories that receive the registry's deps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from unit_mcp.agent import AgentRegistry, FunctionAgent
from unit_mcp.agent.errors import UnknownAgent


def test_factories_are_lazy_cached_and_get_the_deps() -> None:
    built: list[Mapping[str, Any]] = []

    def factory(deps: Mapping[str, Any]) -> FunctionAgent:
        built.append(deps)
        return FunctionAgent(lambda request, ctx: "hi", id="greeter")

    registry = AgentRegistry({"app": "the app"})
    registry.register("greeter", factory, name="Greeter")
    assert built == [] and [(a.id, a.name, a.built) for a in registry.list()] == [("greeter", "Greeter", False)]

    agent = registry.get("greeter")
    assert agent is registry.get("greeter") is registry.require("greeter")
    assert built == [{"app": "the app"}] and registry.list()[0].built

    registry.register("greeter", factory)  # replacing rebuilds on the next get
    assert registry.get("greeter") is not agent
    assert registry.unregister("greeter") and not registry.unregister("greeter")
    assert registry.get("greeter") is None


def test_unknown_agents_and_failing_factories_fail_loudly() -> None:
    registry = AgentRegistry()
    registry.register("a", lambda deps: FunctionAgent(lambda r, c: "", id="a"))
    with pytest.raises(UnknownAgent, match=r"no agent registered as 'b' \(registered: a\)"):
        registry.require("b")

    def broken(deps: Mapping[str, Any]) -> FunctionAgent:
        raise KeyError("model")

    registry.register("broken", broken)
    with pytest.raises(UnknownAgent, match="the factory of agent 'broken' failed: KeyError"):
        registry.get("broken")
    assert not registry.list()[1].built

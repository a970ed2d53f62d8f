"""Agents from a file: `[[agent]]` tables (TOML) or a JSON list, registered with a runner's `AgentRegistry`.

Each entry names its provider (openai, codex or opencode), model and endpoint; a key is named by its variable,
never written in the file. `start_agents` builds them all at once, so a broken entry fails at start in one line.
The file format: docs/agent.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..wire import validation_problems
from ._registry import AgentRegistry
from .errors import AgentError, UnknownAgent
from .presets import PresetError, read_config_file
from .prompts import PERSONA

if TYPE_CHECKING:
    from .toolsurface import AgentToolSurface

OPENCODE_PROVIDER = "unit-mcp"
"""The provider name an opencode agent's model gets in its node's config (`unit-mcp/<model>`)."""
_KEY_VARIABLE = "UNIT_MCP_AGENT_API_KEY"


class AgentFileError(AgentError):
    """An agents file that cannot be read or used; the message says what to change."""


class AgentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    provider: Literal["openai", "codex", "opencode"]
    model: str = Field(min_length=1)
    base_url: str | None = None
    api_key_env: str | None = Field(None, description="The environment variable holding the API key.")
    system_prompt: str | None = None
    presets: list[str] = Field(default_factory=list, description="Presets a new session of it starts with.")
    max_steps: int = Field(20, ge=1)


def parse_agents(data: Any, *, origin: str = "agents") -> list[AgentSpec]:
    """`{"agent": [...]}` (TOML's `[[agent]]`), `{"agents": [...]}` or a bare list of agent tables."""
    if isinstance(data, dict):
        unknown = set(data) - {"agent", "agents"}
        if unknown:
            raise AgentFileError(f"{origin}: unknown top-level key(s) {', '.join(sorted(unknown))}; use [[agent]]")
        data = data.get("agent", data.get("agents", []))
    if not isinstance(data, list) or not data:
        raise AgentFileError(f"{origin}: expected a non-empty list of agents ([[agent]] tables)")
    specs: list[AgentSpec] = []
    for index, entry in enumerate(data):
        try:
            spec = AgentSpec.model_validate(entry)
        except ValidationError as exc:
            problems = validation_problems(exc.errors(), "agent")
            raise AgentFileError(f"{origin}: agent #{index + 1} is invalid: {problems}") from None
        specs.append(spec)
    ids = [spec.id for spec in specs]
    twice = sorted({agent_id for agent_id in ids if ids.count(agent_id) > 1})
    if twice:
        raise AgentFileError(f"{origin}: agent id(s) given twice: {', '.join(twice)}")
    return specs


def load_agents(path: str | os.PathLike[str]) -> list[AgentSpec]:
    path = Path(path)
    return parse_agents(read_config_file(path, "agents file", AgentFileError), origin=path.name)


async def start_agents(
    stack: AsyncExitStack,
    registry: AgentRegistry,
    specs: Sequence[AgentSpec],
    *,
    surface: AgentToolSurface,
    base_url: str | None = None,
    api_key: str | None = None,
    stream: bool = True,
    env: Mapping[str, str] | None = None,
) -> None:
    """Register every agent (`base_url`/`api_key`: the defaults of an agent that names none), start the nodes of
    the opencode ones on `stack`, and build every agent now."""
    env = os.environ if env is None else env
    for spec in specs:
        for name in spec.presets:
            if surface.presets is None:
                raise AgentFileError(f"agent {spec.id} names presets, but no preset file declares them (--presets)")
            try:
                surface.presets.require(name)
            except PresetError as exc:
                raise AgentFileError(f"agent {spec.id}: {exc}") from None
    for spec in specs:
        url = spec.base_url or base_url
        if url is None:
            raise AgentFileError(f"agent {spec.id} has no base_url: give it one in the file, or --base-url")
        key = api_key
        if spec.api_key_env is not None:
            key = env.get(spec.api_key_env)
            if not key:
                raise AgentFileError(f"agent {spec.id}: its key variable {spec.api_key_env} is not set")
        if spec.provider == "opencode":
            await _start_opencode(stack, registry, spec, surface, url, key)
        else:
            _register(registry, spec, url, key, stream)
    for spec in specs:
        try:
            registry.require(spec.id)
        except UnknownAgent as exc:
            raise AgentFileError(f"agent {spec.id} cannot be built: {exc}") from exc


async def _start_opencode(
    stack: AsyncExitStack,
    registry: AgentRegistry,
    spec: AgentSpec,
    surface: AgentToolSurface,
    url: str,
    key: str | None,
) -> None:
    """An isolated node of the agent's own, configured with its model and an endpoint over `surface`."""
    from .opencode import IsolatedRoot, NodeProcess, OpenCodeAgent, OpenCodeError, opencode_endpoint

    root = IsolatedRoot()
    stack.callback(root.cleanup)
    endpoint = await stack.enter_async_context(opencode_endpoint(surface, config_root=root.config_home))
    model = f"{OPENCODE_PROVIDER}/{spec.model}"
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": spec.id,
        "options": {"baseURL": url, "apiKey": f"{{env:{_KEY_VARIABLE}}}"},
        "models": {spec.model: {"name": spec.model, "tool_call": True}},
    }
    root.add_config({"provider": {OPENCODE_PROVIDER: provider}, "model": model, "small_model": model})
    try:
        process = NodeProcess(root=root, env={_KEY_VARIABLE: key or "unused"})
        await process.start()
    except OpenCodeError as exc:
        raise AgentFileError(f"agent {spec.id}: its OpenCode node did not start: {exc}") from exc
    stack.push_async_callback(process.stop)
    client = await stack.enter_async_context(process.client())
    instructions = spec.system_prompt or PERSONA
    registry.register(
        spec.id,
        lambda deps: OpenCodeAgent(client, model=model, endpoint=endpoint, id=spec.id, instructions=instructions),
    )


def _register(registry: AgentRegistry, spec: AgentSpec, url: str, key: str | None, stream: bool) -> None:
    instructions = spec.system_prompt or PERSONA
    if spec.provider == "codex":
        from .codex import CodexModel, register

        model = CodexModel(name=spec.model, base_url=url, api_key=key)
        register(registry, model=model, id=spec.id, name=spec.id, instructions=instructions)
        return
    from ._openai_agent import OpenAIAgent

    registry.register(
        spec.id,
        lambda deps: OpenAIAgent(
            id=spec.id,
            model=spec.model,
            base_url=url,
            api_key=key,
            stream=stream,
            instructions=instructions,
            max_steps=spec.max_steps,
        ),
    )

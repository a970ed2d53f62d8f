"""Capability presets: named bundles of tools an agent is offered only while the bundle is active.

A preset names tools (exact or `unit_read_*` patterns) and its risk is the highest of theirs, so activating one
through `preset_activate` is an ordinary approval request. Every change resyncs the endpoints and is recorded in
the session; a preset's `contexts` narrow what is offered, never activate it. Files and options: docs/agent.md.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..paths import write_file
from ..wire import validation_problems
from ._listeners import ChangeListener, Listeners
from .approvals import RISKS, Risk, normalise_risk
from .errors import AgentError


class NamedTool(Protocol):
    """What a preset needs of a tool (`toolsurface.ToolDef` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def risk(self) -> str: ...


log = logging.getLogger("unit_mcp.agent.presets")

ACTIVATE = "preset_activate"
DEACTIVATE = "preset_deactivate"
CONTROL_TOOLS = (ACTIVATE, DEACTIVATE)


class PresetError(AgentError):
    """An unknown preset, or a preset file that cannot be read."""


class Preset(BaseModel):
    """A named bundle of tools; `active` is whether it starts active, `prompt` guidance while it is."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    description: str = ""
    tools: list[str] = Field(min_length=1)
    prompt: str | None = None
    active: bool = False
    contexts: list[str] = Field(default_factory=list)
    """The application contexts the preset is offered in (any when empty)."""


class PresetInfo(BaseModel):
    """A preset as it stands: the tools its names resolve to on the surface, their highest risk, whether active."""

    name: str
    description: str
    risk: Risk
    tools: list[str]
    missing: list[str] = Field(default_factory=list)  # names or patterns that match no tool right now
    active: bool  # offered now: activated, and declared for the current context (or for any)
    prompt: str | None = None
    contexts: list[str] = Field(default_factory=list)
    out_of_context: bool = False  # activated, but not offered in the current context


def highest_risk(risks: Iterable[str]) -> Risk:
    """The highest of the risks (an unknown label counts as `destructive`); `normal` for none."""
    return max((normalise_risk(risk) for risk in risks), key=RISKS.index, default="normal")


def _matches(pattern: str, name: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern) if any(c in pattern for c in "*?[") else pattern == name


class PresetManager:
    def __init__(self, presets: Iterable[Preset] = (), *, state_path: str | os.PathLike[str] | None = None) -> None:
        """`state_path` keeps the active set on disk (JSON, written atomically): a preset activated in one
        process is active in the next; without it the `active` flags of the presets decide at start."""
        self._presets: dict[str, Preset] = {}
        self._active: set[str] = set()
        self._context: str | None = None
        self._listeners = Listeners("preset change")
        self.state_path = Path(state_path) if state_path is not None else None
        for preset in presets:
            self.add(preset)
        self._load_state()

    # -- the presets ------------------------------------------------------------------------------

    def add(self, preset: Preset) -> None:
        if preset.name in self._presets:
            raise PresetError(f"a preset named {preset.name!r} is already declared")
        if preset.name in CONTROL_TOOLS:
            raise PresetError(f"{preset.name!r} is the name of a preset control tool; choose another")
        self._presets[preset.name] = preset
        if preset.active:
            self._active.add(preset.name)

    def names(self) -> list[str]:
        return list(self._presets)

    def require(self, name: str) -> Preset:
        preset = self._presets.get(name)
        if preset is None:
            known = ", ".join(self._presets) or "none"
            raise PresetError(f"no preset named {name!r} (declared: {known})")
        return preset

    def active(self) -> list[str]:
        """The presets offered now (activated, and for the current context), in declaration order."""
        return [name for name in self._presets if self.is_active(name)]

    def is_active(self, name: str) -> bool:
        return name in self._active and self._in_context(name)

    def _in_context(self, name: str) -> bool:
        contexts = self._presets[name].contexts
        return not contexts or self._context in contexts

    @property
    def context(self) -> str | None:
        return self._context

    def set_context(self, context: str | None) -> tuple[list[str], list[str]]:
        """The application's current context: (presets now offered, presets withdrawn). Listeners hear of it (the
        endpoints resync) when the context changed."""
        before = self.active()
        if context == self._context:
            return [], []
        self._context = context
        after = self.active()
        self._listeners.notify()
        return [n for n in after if n not in before], [n for n in before if n not in after]

    # -- changes ----------------------------------------------------------------------------------

    def activate(self, name: str) -> bool:
        """Activate without asking anyone (the application's or the user's own decision); True if it changed.
        An agent asks through the `preset_activate` tool or `TurnContext.activate_preset` instead."""
        self.require(name)
        return self._set(name, True)

    def deactivate(self, name: str) -> bool:
        self.require(name)
        return self._set(name, False)

    def on_change(self, listener: ChangeListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def _set(self, name: str, active: bool) -> bool:
        if (name in self._active) == active:
            return False
        (self._active.add if active else self._active.discard)(name)
        self._save_state()
        self._listeners.notify()
        return True

    # -- resolution against a tool list ----------------------------------------------------------

    def includes(self, tool: str) -> bool:
        """Whether an active preset offers the tool (the control tools are always offered)."""
        return tool in CONTROL_TOOLS or any(
            _matches(pattern, tool) for name in self.active() for pattern in self._presets[name].tools
        )

    def owners(self, tool: str) -> list[str]:
        """The presets (active or not) that name the tool."""
        return [p.name for p in self._presets.values() if any(_matches(pattern, tool) for pattern in p.tools)]

    def describe(self, tools: Sequence[NamedTool], name: str) -> PresetInfo:
        preset = self.require(name)
        found = [tool for tool in tools if any(_matches(pattern, tool.name) for pattern in preset.tools)]
        missing = [pattern for pattern in preset.tools if not any(_matches(pattern, t.name) for t in tools)]
        return PresetInfo(
            name=preset.name,
            description=preset.description,
            risk=highest_risk(tool.risk for tool in found),
            tools=[tool.name for tool in found],
            missing=missing,
            active=self.is_active(name),
            prompt=preset.prompt,
            contexts=preset.contexts,
            out_of_context=name in self._active and not self._in_context(name),
        )

    # -- persistence -------------------------------------------------------------------------------

    def _load_state(self) -> None:
        if self.state_path is None or not self.state_path.exists():
            return
        try:
            saved = json.loads(self.state_path.read_text(encoding="utf-8"))
            names = [str(name) for name in saved["active"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PresetError(
                f"the preset state file {self.state_path.name} cannot be read ({exc}); delete it to start over"
            ) from exc
        unknown = [name for name in names if name not in self._presets]
        if unknown:
            log.warning("active presets %s are no longer declared; they stay inactive", ", ".join(unknown))
        self._active = {name for name in names if name in self._presets}

    def _save_state(self) -> None:
        path = self.state_path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        chosen = [name for name in self._presets if name in self._active]
        write_file(path.parent, path.name, json.dumps({"active": chosen}).encode())


def parse_presets(data: Any, *, origin: str = "presets") -> list[Preset]:
    """`{"preset": [...]}` (TOML's `[[preset]]`), `{"presets": [...]}` or a bare list of preset tables."""
    if isinstance(data, dict):
        unknown = set(data) - {"preset", "presets"}
        if unknown:
            raise PresetError(f"{origin}: unknown top-level key(s) {', '.join(sorted(unknown))}; use [[preset]]")
        data = data.get("preset", data.get("presets", []))
    if not isinstance(data, list):
        raise PresetError(f"{origin}: expected a list of presets")
    presets: list[Preset] = []
    for index, entry in enumerate(data):
        try:
            presets.append(Preset.model_validate(entry))
        except ValidationError as exc:
            problems = validation_problems(exc.errors(), "preset")
            raise PresetError(f"{origin}: preset #{index + 1} is invalid: {problems}") from None
    names = [preset.name for preset in presets]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise PresetError(f"{origin}: preset(s) declared twice: {', '.join(duplicates)}")
    return presets


def read_config_file(path: Path, what: str, error: type[AgentError]) -> Any:
    """The data of a `.toml` file, or else a `.json` one; `error` says in one line why it cannot be had."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"cannot read the {what} {path}: {exc.strerror or exc}") from exc
    try:
        return tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
        raise error(f"the {what} {path.name} is not valid {kind}: {exc}") from exc


def load_presets(path: str | os.PathLike[str]) -> list[Preset]:
    """Presets from a `.toml` file (`[[preset]]` tables) or a `.json` file."""
    path = Path(path)
    return parse_presets(read_config_file(path, "preset file", PresetError), origin=path.name)

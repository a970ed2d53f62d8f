"""Public names a package imports on first use, so importing the package stays cheap."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's module `__getattr__`: `name` comes from `package.<exports[name]>` and is kept once loaded."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    return __getattr__


LEAN_PACKAGES = ("mcp", "mcp.server")
"""Packages of the MCP SDK whose `__init__` imports far more than a server uses: `mcp` imports the whole client
(and through it the high-level `MCPServer`, httpx2, ...), `mcp.server` imports `MCPServer`. Together about a
third of the SDK's import time, for modules the unit server never runs."""


def lean_packages(names: tuple[str, ...] = LEAN_PACKAGES) -> None:
    """Import each package in `names` without running its `__init__` until a name only it defines is asked for.

    Its submodules import as usual (`from mcp.server.lowlevel import Server` loads only what it imports); the
    first `from mcp import Client` or `mcp.Client` runs the package's real `__init__` in the same module object,
    so every caller still gets what it asked for. A package already imported, or not installed, is left alone."""
    for name in names:
        if name in sys.modules:
            continue
        parent, _, child = name.rpartition(".")
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            continue
        module = importlib.util.module_from_spec(spec)
        module.__dict__["__getattr__"] = _run_init_on_demand(module, spec)
        sys.modules[name] = module
        if parent:
            setattr(sys.modules[parent], child, module)


def _run_init_on_demand(module: ModuleType, spec: ModuleSpec) -> Callable[[str], Any]:
    def __getattr__(attribute: str) -> Any:
        if attribute.startswith("__") and attribute != "__all__":  # probes (copy, inspect) need none of its names
            raise AttributeError(f"module {module.__name__!r} has no attribute {attribute!r}")
        submodule = f"{module.__name__}.{attribute}"
        if submodule in sys.modules or importlib.util.find_spec(submodule) is not None:
            return importlib.import_module(submodule)  # `from mcp import types` needs no __init__
        del module.__dict__["__getattr__"]  # once: the real __init__ defines every other name
        assert spec.loader is not None
        spec.loader.exec_module(module)
        return getattr(module, attribute)

    return __getattr__

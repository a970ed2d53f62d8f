"""Import units from any `Loader`: a meta path finder for `<namespace>.<unit>[.sub…]` and a module loader.

Source comes from `Loader.read` every time (no bytecode cache, so a same-second, same-size edit is never missed),
and its name from `Loader.origin`. The module loader answers `get_source`, so tracebacks and `inspect.getsource`
show the real lines whether the unit is a file or a database row.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import linecache
import types
from typing import Any

from .loader import Loader, LoaderError, UnitKind, UnsafeSource
from .paths import hash_bytes


class UnitModuleLoader:
    """Executes one unit module from the bytes its finder read (a loader by its methods: no `importlib.abc` base,
    whose import pulls in importlib.resources and tempfile)."""

    def __init__(self, fullname: str, origin: str, data: bytes, codes: dict[tuple[str, str], types.CodeType]) -> None:
        self.name = fullname
        self.path = origin
        self.data = data
        self.codes = codes

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        linecache.cache.pop(self.path, None)  # a traceback must show this version's lines, not a cached older one
        code = self.codes.pop((self.path, hash_bytes(self.data)), None)
        if code is None:
            code = compile(self.data, self.path, "exec", dont_inherit=True)
        exec(code, module.__dict__)

    def get_source(self, fullname: str) -> str:
        return importlib.util.decode_source(self.data)

    def get_filename(self, fullname: str) -> str:
        return self.path

    def is_package(self, fullname: str) -> bool:
        return self.path.endswith("/__init__.py")


class UnitFinder:
    """Finds unit modules in the loader only: nothing under the namespace is ever looked up on sys.path."""

    def __init__(self, namespace: str, loader: Loader) -> None:
        self.namespace = namespace
        self.loader = loader
        self.codes: dict[tuple[str, str], types.CodeType] = {}
        self.names: dict[str, set[str]] = {}  # unit id → module names imported for it (no scan of sys.modules)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self.namespace + "."):
            return None
        parts = fullname.split(".")[1:]
        unit_id = parts[0]
        self.names.setdefault(unit_id, set()).add(fullname)
        kind = self.loader.kind(unit_id)
        if kind is None:
            return None
        for source_id, package in _candidates(unit_id, kind, parts[1:]):
            try:
                data = self.loader.read(unit_id, kind, source_id)
            except UnsafeSource:
                raise ImportError(f"{fullname}: symlinked or irregular source refused", name=fullname) from None
            except (LoaderError, ValueError, OSError):
                continue
            origin = self.loader.origin(unit_id, kind, source_id)
            spec = importlib.machinery.ModuleSpec(
                fullname,
                UnitModuleLoader(fullname, origin, data, self.codes),  # type: ignore[arg-type]  # a loader by its methods
                origin=origin,
                is_package=package,
            )
            spec.has_location = True
            if package:
                spec.submodule_search_locations = [origin.rsplit("/", 1)[0]]
            return spec
        return None

    def remember(self, origin: str, data: bytes, code: types.CodeType) -> None:
        if len(self.codes) > 64:
            self.codes.clear()
        self.codes[(origin, hash_bytes(data))] = code


def _candidates(unit_id: str, kind: UnitKind, rest: list[str]) -> list[tuple[str, bool]]:
    """(source id, is package) that may hold the module, in the order Python's path finder tries them."""
    if kind == "file":
        return [] if rest else [(f"{unit_id}.py", False)]
    if not rest:
        return [("__init__.py", True)]
    folder = "/".join(rest)
    return [(f"{folder}/__init__.py", True), (f"{folder}.py", False)]

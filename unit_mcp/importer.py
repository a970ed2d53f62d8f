"""Import units from any `Loader`: a meta path finder for `<namespace>.<unit>[.sub…]` and a module loader.

Source comes from `Loader.read` every time and its name from `Loader.origin`. Compiled code is found by the source's
content hash, never by its time or size (so a same-second, same-size edit is never missed): the code the service
compiled for a write, or at a full start the `BytecodeCache` of the previous start. The module loader answers
`get_source`, so tracebacks and `inspect.getsource` show the real lines whether the unit is a file or a database row.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import linecache
import marshal
import os
import sys
import types
from collections.abc import Iterator
from importlib import _bootstrap
from pathlib import Path
from typing import IO, Any

from .loader import Loader, LoaderError, MissingSource, Source, UnitKind, UnsafeSource
from .paths import UnsafePath, hash_bytes, open_private, private_dir, write_file


class BytecodeCache:
    """The unit modules compiled at the last full start, in one file of the host's data dir, read at the next.

    An entry's key is the module's origin (its code's file name) and the `sha256:` hash of its source: a source
    that changed never gets old code. The file starts with Python's bytecode magic number, so another Python
    version (or a damaged file) is ignored and everything is compiled. Saving keeps only this start's entries.
    Each entry stays marshalled bytes until its module is executed: unmarshalling all of them up front would put
    every module's top-level code (run once, then garbage) among the objects that live on, and its holes would
    keep the server's resident memory up (about 8 MB at 10,000 units)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._loaded: dict[tuple[str, str], bytes] = {}
        self.used: dict[tuple[str, str], bytes] = {}
        self._compiled = False

    def load(self) -> BytecodeCache:
        try:
            with os.fdopen(open_private(self.path, os.O_RDONLY), "rb") as handle:
                blob = handle.read()
        except (OSError, UnsafePath):  # a symlink planted in its place is never followed
            return self
        magic = importlib.util.MAGIC_NUMBER
        if blob[: len(magic)] != magic:
            return self
        try:
            entries = marshal.loads(memoryview(blob)[len(magic) :])
        except (EOFError, ValueError, TypeError):
            return self
        if isinstance(entries, dict):
            self._loaded = entries
        return self

    def get(self, origin: str, digest: str) -> types.CodeType | None:
        marshalled = self._loaded.get((origin, digest))
        if not isinstance(marshalled, bytes):  # an older file's entry: compiled again, saved in this form
            return None
        try:
            code = marshal.loads(marshalled)
        except (EOFError, ValueError, TypeError):
            return None
        if not isinstance(code, types.CodeType):
            return None
        self.used[(origin, digest)] = marshalled
        return code

    def put(self, origin: str, digest: str, code: types.CodeType) -> None:
        self.used[(origin, digest)] = marshal.dumps(code)
        self._compiled = True

    def save(self) -> None:
        """Write the entries this start used, when they differ from the file's (no fsync: it is a cache)."""
        if not self._compiled and len(self.used) == len(self._loaded):
            return
        private_dir(self.path.parent)
        blob = importlib.util.MAGIC_NUMBER + marshal.dumps(self.used)
        write_file(self.path.parent, self.path.name, blob, durable=False)


class UnitModuleLoader:
    """Executes one unit module from the bytes its finder read (a loader by its methods: no `importlib.abc` base,
    whose import pulls in importlib.resources and tempfile)."""

    def __init__(
        self,
        fullname: str,
        origin: str,
        data: bytes,
        codes: dict[tuple[str, str], types.CodeType],
        files: UnitFiles | None = None,
        bytecode: BytecodeCache | None = None,
    ) -> None:
        self.name = fullname
        self.path = origin
        self.data = data
        self.codes = codes
        self.files = files
        self.bytecode = bytecode
        self.digest: str | None = None
        """The `sha256:` hash of `data`, once executed (the unit's version when it declares none)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        linecache.cache.pop(self.path, None)  # a traceback must show this version's lines, not a cached older one
        self.digest = digest = hash_bytes(self.data)  # the unit's version, unless it declares one (`version_of`)
        code = self.codes.get((self.path, digest))
        if code is None and self.bytecode is not None:
            code = self.bytecode.get(self.path, digest)
        if code is None:
            code = compile(self.data, self.path, "exec", dont_inherit=True)
            if self.bytecode is not None:
                self.bytecode.put(self.path, digest, code)
            else:  # a reload: the unit's modules it did not change are not compiled again on the next one
                keep_code(self.codes, (self.path, digest), code)
        # The start's cache holds every unit's module code: a loader kept on `__spec__` must not keep it alive.
        self.bytecode = None
        exec(code, module.__dict__)

    def get_source(self, fullname: str) -> str:
        return importlib.util.decode_source(self.data)

    def get_filename(self, fullname: str) -> str:
        return self.path

    def is_package(self, fullname: str) -> bool:
        return self.path.endswith("/__init__.py")

    def get_resource_reader(self, fullname: str) -> UnitFiles | None:
        """`importlib.resources.files(__package__)`: the package's data files, read through the unit's loader."""
        return self.files


class UnitSpec(importlib.machinery.ModuleSpec):
    """A unit module's spec. `cached` is None: its code comes from the host's bytecode cache or a compile, never
    from a `__pycache__` file (importlib would compute that file's name for every module it sets up, and set it as
    `__cached__`)."""

    cached = None  # type: ignore[assignment]  # a plain attribute in place of ModuleSpec's computed property


class UnitFiles:
    """A folder of a directory unit as an `importlib.resources` Traversable (and its own resource reader)."""

    def __init__(self, loader: Loader, unit_id: str, kind: UnitKind, folder: str) -> None:
        self._loader = loader
        self._unit = (unit_id, kind)
        self._id = folder  # source id of this entry, '' for the unit itself

    def files(self) -> UnitFiles:
        return self

    @property
    def name(self) -> str:
        return self._id.rsplit("/", 1)[-1]

    def _ids(self) -> list[str]:
        return self._loader.source_ids(*self._unit)

    def joinpath(self, *descendants: str) -> UnitFiles:
        parts = [p for d in descendants for p in str(d).split("/") if p]
        return UnitFiles(self._loader, *self._unit, "/".join([self._id, *parts] if self._id else parts))

    __truediv__ = joinpath

    def is_file(self) -> bool:
        return self._id in self._ids()

    def is_dir(self) -> bool:
        return not self._id or any(i.startswith(self._id + "/") for i in self._ids())

    def iterdir(self) -> Iterator[UnitFiles]:
        prefix = self._id + "/" if self._id else ""
        names = sorted({i[len(prefix) :].split("/")[0] for i in self._ids() if i.startswith(prefix)})
        return iter([self.joinpath(name) for name in names])

    def read_bytes(self) -> bytes:
        try:
            return self._loader.read(Source(*self._unit, self._id))
        except LoaderError:
            raise FileNotFoundError(f"no resource {self._id!r} in unit {self._unit[0]!r}") from None

    def read_text(self, encoding: str | None = None) -> str:
        return self.read_bytes().decode(encoding or "utf-8")

    def open(self, mode: str = "r", *args: Any, **kwargs: Any) -> IO[Any]:
        if "w" in mode or "a" in mode or "+" in mode:
            raise PermissionError("unit resources are read-only; change sources with the unit tools")
        data = io.BytesIO(self.read_bytes())
        return data if "b" in mode else io.TextIOWrapper(data, *args, **kwargs)


class UnitFinder:
    """Finds unit modules in the loader only: nothing under the namespace is ever looked up on sys.path."""

    def __init__(self, namespace: str, loader: Loader) -> None:
        self.namespace = namespace
        self.loader = loader
        self.codes: dict[tuple[str, str], types.CodeType] = {}
        # unit id → module names imported for it (no scan of sys.modules); a tuple, not a set: most units have
        # one name, and 10,000 sets would hold about 2 MB more
        self.names: dict[str, tuple[str, ...]] = {}
        self.kinds: dict[str, UnitKind] | None = None  # while the host starts: what it just discovered
        self.bytecode: BytecodeCache | None = None  # while the host starts all units
        # while the host starts all units: every Python source, read in one query (a loader that offers it)
        self.prefetched: dict[tuple[str, str], bytes] | None = None

    def _read(self, source: Source) -> bytes:
        if self.prefetched is not None and source.source_id.endswith(".py"):
            data = self.prefetched.get((source.unit_id, source.source_id))
            if data is None:
                raise MissingSource()
            return data
        return self.loader.read(source)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self.namespace + "."):
            return None
        parts = fullname.split(".")[1:]
        unit_id = parts[0]
        known = self.names.get(unit_id, ())
        if fullname not in known:
            self.names[unit_id] = (*known, fullname)
        kind = self.kinds.get(unit_id) if self.kinds is not None else self.loader.kind(unit_id)
        if kind is None:
            return None
        for source, package in _candidates(unit_id, kind, parts[1:]):
            try:
                data = self._read(source)
            except UnsafeSource:
                raise ImportError(f"{fullname}: linked, irregular or outside source refused", name=fullname) from None
            except (LoaderError, ValueError, OSError):
                continue
            origin = self.loader.origin(source)
            folder = source.source_id.rpartition("/")[0]
            files = UnitFiles(self.loader, unit_id, kind, folder) if package else None
            spec = UnitSpec(
                fullname,
                UnitModuleLoader(fullname, origin, data, self.codes, files, self.bytecode),  # type: ignore[arg-type]  # a loader by its methods
                origin=origin,
                is_package=package,
            )
            spec.has_location = True
            if package:
                spec.submodule_search_locations = [origin.rsplit("/", 1)[0]]
            return spec
        return None

    def load(self, fullname: str) -> types.ModuleType:
        """Import `fullname`, a module not in sys.modules, as `importlib.import_module` would (its module lock held,
        so another thread importing it meanwhile waits for it; set in sys.modules before it runs, so a unit it
        imports may import it back; bound to its package), without the walk of `sys.meta_path` (this finder
        answers for its namespace) and importlib's generic set-up of the module's attributes: the host's start
        loads thousands of units this way."""
        with _bootstrap._ModuleLockManager(fullname):  # type: ignore[attr-defined]  # the lock an import takes
            spec = self.find_spec(fullname)
            if spec is None:
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
            loader = spec.loader
            assert isinstance(loader, UnitModuleLoader)
            module = types.ModuleType(fullname)
            # What importlib's `module_from_spec` sets for a module with a location:
            attributes = module.__dict__
            attributes.update(__loader__=loader, __package__=spec.parent, __spec__=spec, __file__=loader.path)
            if spec.submodule_search_locations is not None:
                attributes["__path__"] = spec.submodule_search_locations
            spec._initializing = True  # type: ignore[attr-defined]  # before sys.modules: `import` reads it there
            try:
                sys.modules[fullname] = module
                try:
                    loader.exec_module(module)
                except BaseException:
                    sys.modules.pop(fullname, None)
                    raise
                module = sys.modules.pop(fullname)  # what the module left there (it may have replaced itself)
                sys.modules[fullname] = module
            finally:
                spec._initializing = False  # type: ignore[attr-defined]
        parent, _, child = fullname.rpartition(".")
        setattr(sys.modules[parent], child, module)
        return module

    def remember(self, origin: str, data: bytes, code: types.CodeType) -> None:
        keep_code(self.codes, (origin, hash_bytes(data)), code)


KEPT_CODES = 64
"""Module code kept between imports, by source name and hash: what a write compiled, what a reload compiled."""


def keep_code(codes: dict[tuple[str, str], types.CodeType], key: tuple[str, str], code: types.CodeType) -> None:
    """Keep `code` for the next import of the same bytes under the same name (all are dropped past KEPT_CODES)."""
    if len(codes) >= KEPT_CODES:
        codes.clear()
    codes[key] = code


def _candidates(unit_id: str, kind: UnitKind, rest: list[str]) -> list[tuple[Source, bool]]:
    """(source, is package) that may hold the module, in the order Python's path finder tries them. The ids are
    built from a module name, not given by a client: the loader keeps whatever name reaches it inside its store."""
    if kind == "file":
        return [] if rest else [(Source(unit_id, kind, f"{unit_id}.py"), False)]
    if not rest:
        return [(Source(unit_id, kind, "__init__.py"), True)]
    folder = "/".join(rest)
    return [(Source(unit_id, kind, f"{folder}/__init__.py"), True), (Source(unit_id, kind, f"{folder}.py"), False)]

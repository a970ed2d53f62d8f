"""Stores by address: `open_loader` opens a units folder (`DIR`), a database (`sqlite:PATH`) or a PostgreSQL
database (`postgresql://…`), and `unit-mcp units copy SRC DST [--replace]` copies units between two stores
(docs/loaders.md). It sits above the loaders it picks from (they import only `loader.py`), so no import circle.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .commandline import CommandParser, print_error
from .errors import StoreUnavailable
from .loader import (
    SQLITE_PREFIX,
    STORES_PREFIX,
    ForeignStore,
    Loader,
    LoaderError,
    Source,
    SourceExists,
    member_addresses,
)
from .pgconnect import PREFIXES as POSTGRES_PREFIXES
from .pgconnect import address_problem as postgres_problem
from .pgconnect import shown_address

if TYPE_CHECKING:
    from .githistory import GitMode


class UnusableStore(Exception):
    """A `--units` address that cannot be served, said in one line (never with a password)."""


def open_loader(units: str | os.PathLike[str], *, read_only: bool = False, git_history: GitMode = "ref") -> Loader:
    """`sqlite:PATH` opens (or creates) a database, `postgresql://…` a PostgreSQL one (`UnusableStore` when it
    cannot be served); anything else is a units folder (`git_history`: where a folder inside a git work tree
    records its history)."""
    text = os.fspath(units)
    if text.startswith(STORES_PREFIX):
        return _open_stores(member_addresses(text), read_only=read_only, git_history=git_history)
    if text.startswith(POSTGRES_PREFIXES):
        problem = postgres_problem(text)
        if problem:
            raise UnusableStore(f"{shown_address(text)} {problem}")
        from .pgloader import PostgresLoader

        try:
            return PostgresLoader(text, read_only=read_only)
        except (LoaderError, StoreUnavailable) as exc:
            raise UnusableStore(f"{text} {exc.message if isinstance(exc, StoreUnavailable) else exc}") from None
    if text.startswith(SQLITE_PREFIX):
        from .sqliteloader import SqliteLoader

        return SqliteLoader(text[len(SQLITE_PREFIX) :], read_only=read_only)
    from .folderloader import FilesystemLoader

    return FilesystemLoader(text, read_only=read_only, git_history=git_history)


def _open_stores(addresses: list[str], *, read_only: bool, git_history: GitMode) -> Loader:
    """Several stores served as one (`stores.Stores`), refused when two hold a unit of the same id."""
    from .stores import DuplicateUnits, Stores

    members: list[Loader] = []
    try:
        for address in addresses:
            members.append(open_loader(address, read_only=read_only, git_history=git_history))
        return Stores(members)
    except DuplicateUnits as exc:
        for member in members:
            member.close()
        raise UnusableStore(f"{' and '.join(shown_address(a) for a in addresses)} {exc}") from None
    except BaseException:
        for member in members:
            member.close()
        raise


def copy_units(source: Loader, target: Loader, *, replace: bool = False) -> list[str]:
    """Copy every unit of `source` into `target`; the unit ids copied. Refuses (SourceExists naming the units)
    before copying anything if some exist in `target` and not `replace`."""
    units = source.discover()
    if not replace:
        clashes = [unit_id for unit_id in units if target.kind(unit_id) is not None]
        if clashes:
            raise SourceExists(", ".join(clashes))
    for unit_id, kind in units.items():
        files = {sid: source.read(Source(unit_id, kind, sid)) for sid in source.source_ids(unit_id, kind)}
        target.put_unit(unit_id, kind, files, replace=replace)
    return list(units)


PROG = "unit-mcp units"


def command_parser(prog: str = PROG) -> CommandParser:
    parser = CommandParser(
        prog=prog,
        description="Copy units between stores: a units folder, sqlite:PATH or postgresql://USER@HOST:PORT/DB.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    copy = commands.add_parser(
        "copy",
        help="copy every unit of SRC into DST (a units folder, sqlite:PATH or postgresql://…)",
        description="Copy every unit of SRC into DST. Each is a units folder, sqlite:PATH or "
        "postgresql://USER@HOST:PORT/DB (its password from PGPASSWORD or PGPASSFILE, never in the address).",
    )
    copy.add_argument("src", help="units folder, sqlite:PATH or postgresql://USER@HOST:PORT/DB to copy from")
    copy.add_argument("dst", help="units folder, sqlite:PATH or postgresql://… to copy into (a database is set up)")
    copy.add_argument("--replace", action="store_true", help="replace units that already exist in DST")
    copy.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    parser = command_parser(prog)
    args = parser.parse_args(argv)
    try:
        source = open_loader(args.src, read_only=True)
    except FileNotFoundError:
        parser.error(f"{args.src} is neither a units folder nor an existing sqlite:PATH database")
    except (ForeignStore, UnusableStore) as exc:
        parser.error(str(exc))
    try:
        target = open_loader(args.dst)
    except FileNotFoundError:
        parser.error(f"{args.dst} is not a folder (create it first), sqlite:PATH nor postgresql://…")
    except (ForeignStore, UnusableStore) as exc:
        source.close()
        parser.error(str(exc))
    try:
        copied = copy_units(source, target, replace=args.replace)
    except (SourceExists, StoreUnavailable) as exc:
        if args.debug:
            raise
        if isinstance(exc, SourceExists):
            problem = f"{args.dst} already has units {exc}; nothing copied (--replace overwrites)"
        else:
            problem = f"{exc.message} Nothing more was copied; run the copy again."
        print_error(prog, problem)
        return 1
    finally:
        source.close()
        target.close()
    print(f"copied {len(copied)} units: {', '.join(copied)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

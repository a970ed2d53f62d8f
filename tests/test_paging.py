"""Results that fit every client (issue 24): no tool result above 80 KB of text (structured content and its text
mirror together, about 20,000 tokens), and what can be longer paged by an opaque cursor that reassembles exactly."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import mcp_types as types
import pytest
from conftest import copy_units, sqlite_copy
from hypothesis import HealthCheck, given, settings
from mcp import Client
from pydantic import BaseModel

from unit_mcp import Host, UnitService
from unit_mcp.arguments import ReadSourceArgs
from unit_mcp.errors import UnitError
from unit_mcp.paging import json_size, text_json_size, text_page
from unit_mcp.service import QUICK_READ_BYTES
from unit_mcp.tools import UnitTools

BOUND = 80_000
"""Bytes of one result on the wire: its text content plus its structured content (or its error `_meta`)."""


def wire_size(result: types.CallToolResult) -> int:
    text = sum(len(c.text.encode()) for c in result.content if isinstance(c, types.TextContent))
    extra = result.structured_content if not result.is_error else result.meta
    return text + len(json.dumps(extra, ensure_ascii=False).encode())


def model_size(result: BaseModel) -> int:
    """What `UnitTools.call_tool` sends for a service result: the JSON text mirror and the structured content."""
    return len(result.model_dump_json().encode()) + len(
        json.dumps(result.model_dump(mode="json"), ensure_ascii=False).encode()
    )


class Calls:
    """A connected client whose every answer is checked against the bound."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.sizes: list[int] = []

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        result = await self.client.call_tool(name, arguments)
        self.sizes.append(wire_size(result))
        assert self.sizes[-1] <= BOUND, (name, self.sizes[-1])
        return result

    async def ok(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await self.call(name, arguments)
        assert not result.is_error, result.content
        assert result.structured_content is not None
        return dict(result.structured_content)

    async def refused(self, name: str, arguments: dict[str, Any]) -> str:
        result = await self.call(name, arguments)
        assert result.is_error and isinstance(result.content[0], types.TextContent)
        return result.content[0].text

    async def pages(self, name: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        """Every page, following next_cursor to the end."""
        out = [await self.ok(name, arguments)]
        while out[-1].get("next_cursor") is not None:  # left out on the last page
            assert len(out) < 2000, "paging does not end"
            out.append(await self.ok(name, {**arguments, "cursor": out[-1]["next_cursor"]}))
        return out


@asynccontextmanager
async def connected(service: UnitService) -> AsyncIterator[Calls]:
    async with Client(UnitTools(service).server()) as client:
        yield Calls(client)


def many_units(root: Path, count: int, *, docstring: str = "A generated unit.") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        (root / f"gen_{n:05d}.py").write_text(f'"""{docstring} number {n}"""\n\n\ndef widget_{n}():\n    return {n}\n')
    return root


@pytest.fixture
def big_source() -> bytes:
    """10 MB of text with every kind of line a page can be cut at: short, long, CRLF, non-ASCII, control
    characters (six bytes each in JSON) and one line of 200 KB with no break in it."""
    parts = []
    control = "\x01"
    for n in range(60_000):
        parts.append(f"line {n} {'é' * (n % 50)} {control * (n % 7)} {'x' * (n % 300)}".encode())
        parts.append(b"\r\n" if n % 5 == 0 else b"\n")
    parts.append("€".encode() * 70_000)  # 210 KB of three-byte characters without a newline
    parts.append(b"\n")
    data = b"".join(parts)
    data += b"tail " * ((10 * 1024 * 1024 - len(data)) // 5)
    assert len(data) > 10_000_000
    return data


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_ten_megabyte_source_read_by_cursor_reassembles_byte_identical(
    tmp_path: Path, big_source: bytes
) -> None:
    root = copy_units(tmp_path / "units")
    (root / "counter" / "big.txt").write_bytes(big_source)
    digest = "sha256:" + hashlib.sha256(big_source).hexdigest()
    with Host(root, tmp_path / "data") as host:
        async with connected(UnitService(host)) as calls:
            args = {"unit_id": "counter", "source_id": "big.txt"}
            pages = await calls.pages("unit_read_source", args)
            assert len(pages) > 100
            assert "".join(page["content"] for page in pages).encode() == big_source
            assert {(page["hash"], page["size"]) for page in pages} == {(digest, len(big_source))}
            assert [page["offset"] for page in pages[1:]] == [
                page.get("offset", 0) + len(page["content"].encode()) for page in pages[:-1]
            ]
            assert all(page["truncated"] for page in pages[:-1]) and not pages[-1].get("truncated")
            cut_in_a_line = [p for p in pages[:-1] if not p["content"].endswith("\n")]
            assert 0 < len(cut_in_a_line) <= 10, "pages end after a line unless a single line is longer than a page"

            # A cursor of a source that changed since is refused; one of another source, or a made-up one, too.
            cursor = pages[1]["next_cursor"]
            (root / "counter" / "big.txt").write_bytes(big_source + b"more\n")
            assert (await calls.refused("unit_read_source", {**args, "cursor": cursor})).startswith("[stale_hash]")
            other = {"unit_id": "counter", "source_id": "panel.py", "cursor": cursor}
            assert (await calls.refused("unit_read_source", other)).startswith("[invalid_argument]")
            forged = {**args, "cursor": "eyJ0b29sIjoidW5pdF9yZWFkX3NvdXJjZSJ9"}
            assert (await calls.refused("unit_read_source", forged)).startswith("[invalid_argument]")
            assert (await calls.refused("unit_read_source", {**args, "cursor": "%%%"})).startswith("[invalid_argument]")


@pytest.mark.anyio
async def test_a_small_source_is_one_page_as_before(service: UnitService) -> None:
    async with connected(service) as calls:
        page = await calls.ok("unit_read_source", {"unit_id": "greeter", "source_id": "greeter.py"})
    assert not {"truncated", "next_cursor", "offset"} & page.keys()  # at their defaults: left out
    assert page["content"].encode() == service.loader.read(service.source("greeter", "greeter.py"))


@pytest.mark.anyio
async def test_only_a_small_first_page_from_a_folder_is_read_on_the_loop(units_root: Path, tmp_path: Path) -> None:
    """The event loop answers a folder's source of one page at once; a larger one, a cursor's page and a database's
    source go to a worker thread, and every answer is the one `read_source` gives."""
    small = "".join(f"line {n}\n" for n in range(QUICK_READ_BYTES // 20))
    large = "".join(f"line {n}\n" for n in range(QUICK_READ_BYTES // 5))
    (units_root / "counter" / "small.txt").write_text(small)
    (units_root / "counter" / "large.txt").write_text(large)
    store = sqlite_copy(units_root, tmp_path / "units.db")
    with Host(units_root, tmp_path / "data") as folder, Host(store, tmp_path / "db-data", namespace="db") as db:
        service, database = UnitService(folder), UnitService(db)
        quick = service.read_source_at_once(ReadSourceArgs(unit_id="counter", source_id="small.txt"))
        assert quick is not None and quick.content == small
        assert service.read_source_at_once(ReadSourceArgs(unit_id="counter", source_id="large.txt")) is None
        first = service.read_source("counter", "large.txt")
        assert first.next_cursor is not None
        later = ReadSourceArgs(unit_id="counter", source_id="large.txt", cursor=first.next_cursor)
        assert service.read_source_at_once(later) is None
        assert database.read_source_at_once(ReadSourceArgs(unit_id="counter", source_id="small.txt")) is None
        with pytest.raises(UnitError, match="There is no unit"):
            service.read_source_at_once(ReadSourceArgs(unit_id="nosuch", source_id="x.py"))
        for one in (service, database):
            async with connected(one) as calls:
                for name, text in (("small.txt", small), ("large.txt", large)):
                    pages = await calls.pages("unit_read_source", {"unit_id": "counter", "source_id": name})
                    assert "".join(page["content"] for page in pages) == text
                    assert pages[0] == one.read_source("counter", name).model_dump(mode="json", exclude_defaults=True)


@pytest.mark.anyio
async def test_the_log_pages_back_and_forward_by_cursor(units_root: Path, tmp_path: Path) -> None:
    with Host(units_root, tmp_path / "data", log_max_bytes=64 * 1024 * 1024) as host:
        logger = host.unit_logger("greeter")
        for n in range(1000):
            logger.info("entry %04d %s", n, "y" * 3900)
        async with connected(UnitService(host)) as calls:
            back = await calls.pages("unit_read_log", {"grep": "entry ", "lines": 1000})
            forward = await calls.pages("unit_read_log", {"grep": "entry ", "offset": 1, "limit": 1000})
            wrong = {"grep": "other", "cursor": back[0]["next_cursor"]}
            assert (await calls.refused("unit_read_log", wrong)).startswith("[invalid_argument]")
    assert len(back) > 1 and back[0]["truncated"] and back[0]["has_more"]
    newest_first = [line for page in back for line in reversed(page["lines"])]
    assert [int(line.split("entry ")[1][:4]) for line in newest_first] == list(range(999, -1, -1))
    oldest_first = [line for page in forward for line in page["lines"]]
    assert [int(line.split("entry ")[1][:4]) for line in oldest_first] == list(range(1000))
    assert not back[-1].get("has_more") and back[-1].get("next_cursor") is None and not forward[-1].get("has_more")


@pytest.mark.anyio
async def test_unit_list_pages_by_cursor_in_unit_id_order(tmp_path: Path) -> None:
    root = many_units(tmp_path / "units", 600)
    with Host(root, tmp_path / "data") as host:
        async with connected(UnitService(host)) as calls:
            pages = await calls.pages("unit_list", {})
            assert (await calls.refused("unit_list", {"cursor": "bm90IGEgY3Vyc29y"})).startswith("[invalid_argument]")
    ids = [unit["unit_id"] for page in pages for unit in page["units"]]
    assert len(pages) > 1 and ids == [f"gen_{n:05d}" for n in range(600)]
    assert all(page["truncated"] for page in pages[:-1]) and not pages[-1].get("truncated")


@pytest.mark.anyio
async def test_unit_resolve_pages_in_the_order_of_one_ranking(tmp_path: Path) -> None:
    root = many_units(tmp_path / "units", 300, docstring="Widget gadget " + "widgetry " * 20)
    with Host(root, tmp_path / "data") as host:
        service = UnitService(host)
        async with connected(service) as calls:
            pages = await calls.pages("unit_resolve", {"description": "widget gadget", "limit": 100})
            moved = {"description": "something else", "cursor": pages[0]["next_cursor"]}
            assert (await calls.refused("unit_resolve", moved)).startswith("[invalid_argument]")
        whole = [c.unit_id for c in service.index_now().query("widget gadget", 1000)]
    ids = [c["unit_id"] for page in pages for c in page["candidates"]]
    assert len(pages) > 3 and ids == whole and len(ids) == 300


@pytest.mark.anyio
async def test_unit_history_pages_by_cursor_and_new_versions_do_not_shift_it(units_root: Path, tmp_path: Path) -> None:
    with Host(sqlite_copy(units_root, tmp_path / "units.db"), tmp_path / "data") as host:
        service = UnitService(host)
        for n in range(7):
            current = service.read_source("greeter", "greeter.py")
            service.apply_patch("greeter", "greeter.py", old=current.content, new=current.content + f"# {n}\n")
        async with connected(service) as calls:
            args = {"unit_id": "greeter", "source_id": "greeter.py", "limit": 3}
            first = await calls.ok("unit_history", args)
            current = service.read_source("greeter", "greeter.py")
            service.apply_patch("greeter", "greeter.py", old=current.content, new=current.content + "# later\n")
            rest = await calls.pages("unit_history", {**args, "cursor": first["next_cursor"]})
    versions = [v["version"] for page in [first, *rest] for v in page["versions"]]
    assert versions == sorted(versions, reverse=True) and len(versions) == len(set(versions)) >= 8
    assert [len(page["versions"]) for page in [first, *rest]][:2] == [3, 3] and not rest[-1].get("truncated")
    assert all(v["version"] < first["versions"][-1]["version"] for page in rest for v in page["versions"])


# -- every tool's largest answer ----------------------------------------------------------------------------------

text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=300)


@st.composite
def big_texts(draw: st.DrawFn) -> str:
    """A text up to a few hundred KB, from a drawn line repeated (fast to generate, any characters)."""
    line = draw(text)
    return (line + draw(st.sampled_from(["\n", "\r\n", ""]))) * draw(st.integers(0, 3000))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    source=big_texts(),
    doc=big_texts(),
    log_line=text,
    log_count=st.integers(0, 1200),
    unit_count=st.integers(0, 300),
    symbols=st.integers(0, 1500),
)
def test_every_tool_answers_within_the_bound(
    tmp_path_factory: pytest.TempPathFactory,
    source: str,
    doc: str,
    log_line: str,
    log_count: int,
    unit_count: int,
    symbols: int,
) -> None:
    tmp = tmp_path_factory.mktemp("bound")
    root = many_units(tmp / "units", unit_count)
    unit = root / "wide"
    unit.mkdir()
    functions = "".join(f"def widget_{'w' * 60}_{n}():\n    pass\n\n\n" for n in range(symbols))
    (unit / "__init__.py").write_text(f'"""{doc.replace(chr(92), "/").replace(chr(34), "_")}"""\n\n{functions}')
    (unit / "data.txt").write_text(source, newline="")
    for n in range(min(symbols, 400)):
        (unit / f"test_{'t' * 50}_{n}.py").write_text("def main():\n    pass\n")
    state = json.dumps({"blob": source * 3})
    (unit / "__init__.py").write_text(
        (unit / "__init__.py").read_text() + f"import json\n\n\ndef snapshot():\n    return json.loads({state!r})\n"
    )
    with Host(root, tmp / "data", log_max_bytes=64 * 1024 * 1024) as host:
        logger = host.unit_logger("wide")
        for n in range(log_count):
            logger.info("%d %s", n, log_line * 20)
        service = UnitService(host)
        checkpoint = service.checkpoint().checkpoint_id
        created = service.create_source("wide", "made.txt", source)
        assert created.change_id is not None
        assert service.resolve("zzzz qqqq").candidates, "resolve answers while units exist"
        results = [
            service.changes(),
            service.changes(unit_id="wide", limit=200),
            service.rollback(checkpoint, dry_run=True),
            service.revert_change(created.change_id, dry_run=True),
            service.list(),
            service.resolve("widget " + log_line, limit=100),
            service.resolve("zzzz qqqq", limit=100),
            service.inspect("wide"),
            service.read_source("wide", "data.txt"),
            service.read_source("wide", "__init__.py"),
            service.read_log(lines=1000),
            service.read_log(offset=1, limit=1000),
            service.read_log(grep=log_line[:50] or None, lines=1000),
            service.snapshot("wide"),
            service.reload("wide"),
        ]
    for result in results:
        assert model_size(result) <= BOUND, (type(result).__name__, model_size(result))


@pytest.mark.anyio
async def test_the_largest_test_output_and_refusal_fit(units_root: Path, tmp_path: Path) -> None:
    """A test that prints 10 MB, one that runs past its timeout (its output is in the refusal), an edit that
    rewrites a 2 MB source (its diff) and a log line of a unit that logs megabytes: each one result under the bound."""
    big = "".join(f"value_{n} = {n}  # {'c' * 200}\n" for n in range(9000))
    (units_root / "counter" / "table.py").write_text(big)
    with Host(units_root, tmp_path / "data") as host:
        service = UnitService(host, test_timeout=60)
        async with connected(service) as calls:
            chatty = await calls.ok("unit_run_tests", {"unit_id": "looper", "test_name": "chatty"})
            assert chatty["truncated"] and chatty["passed"]
            timeout = await calls.refused("unit_run_tests", {"unit_id": "looper", "test_name": "init", "timeout": 2})
            assert timeout.startswith("[test_timeout]")
            edit = {"unit_id": "counter", "source_id": "table.py", "old": "#", "new": "# edited", "replace_all": True}
            patched = await calls.ok("unit_apply_patch", edit)
            assert patched["changed"] and "characters left out" in patched["diff"]
            host.unit_logger("counter").info("%s", "m" * 5_000_000)
            log = await calls.ok("unit_read_log", {"lines": 1000})
            assert log["returned"] >= 1
    assert max(calls.sizes) <= BOUND


def test_a_bad_cursor_is_refused_in_one_line_and_reading_goes_on(service: UnitService) -> None:
    for call in (
        lambda: service.list(cursor="x"),
        lambda: service.resolve("counter", cursor="e30"),
        lambda: service.read_log(cursor="eyJ0b29sIjoidW5pdF9saXN0IiwiYWZ0ZXIiOiIifQ"),  # unit_list's, not the log's
    ):
        with pytest.raises(UnitError) as caught:
            call()
        assert caught.value.code == "invalid_argument" and "\n" not in caught.value.message and caught.value.hint
    assert service.list().units


@pytest.fixture(autouse=True)
def _quiet_units() -> Iterator[None]:
    """The generated log lines stay in the app log (the units logger propagates to pytest's capture otherwise)."""
    units = logging.getLogger("units")
    before = units.propagate
    units.propagate = False
    yield
    units.propagate = before


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=400), st.integers(14, 200))
def test_pages_of_any_text_reassemble_within_their_budget(content: str, budget: int) -> None:
    """Pages cut after a line, else at a character boundary (three-byte characters right at the budget, escapes
    that take six bytes), each within the budget, and always a step forward."""
    data = content.encode()
    start, pages = 0, []
    while start < len(data):
        end = text_page(data, start, budget)
        assert end > start and json_size(data[start:end].decode()) <= budget
        pages.append(data[start:end])
        start = end
    assert b"".join(pages) == data


@settings(max_examples=500, deadline=None)
@given(
    st.text(st.characters(codec="utf-8"), max_size=300)
    | st.text(alphabet='\x00\x01\x08\x0c\x1f\x7f"\\\n\r\t a\u00e9\u2028\U0001f600', max_size=60)
)
def test_the_json_size_counted_in_bytes_is_the_encoded_size(content: str) -> None:
    """A page is measured without encoding it: the count must be the JSON's size for any text (quotes, backslashes,
    every control character, DEL, line separators, characters of two to four bytes)."""
    assert text_json_size(content.encode()) == json_size(content)

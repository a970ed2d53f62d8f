"""Results that fit every client: the byte budget of one tool result, opaque cursors, and pages cut to the budget.

Claude Code refuses a tool result over 25,000 tokens and other clients are stricter, so no result goes above
`RESULT_BYTES` of JSON; what can be longer is paged with a `cursor` the previous page handed out as `next_cursor`.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

from .errors import InvalidArgument
from .paths import KEPT_BYTES

RESULT_BYTES = 40_000
"""The most bytes of a result's JSON text. Its structured content is as large again, so a whole result stays under
80 KB, about 20,000 tokens."""
PAGE_OVERHEAD = 4_000
"""Bytes a page leaves for its other fields and its cursor (ids up to 1 KB are echoed in both)."""
MAX_FIELD_BYTES = 4_000
"""The most bytes one free-text field of a listed item (a load error, a list of names) takes."""
CLIP_MARK = "\n… [{} characters left out] …\n"

T = TypeVar("T")


def json_size(value: Any) -> int:
    """The bytes `value` takes in a result's JSON (pydantic writes non-ASCII as is, control characters escaped)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


_ESCAPED_LONG = bytes(c for c in range(0x20) if c not in b"\n\r\t")
"""Control characters `json.dumps` writes as six bytes (`\\u0000`) or as `\\b`/`\\f`: rare in a source."""
_ESCAPED_SHORT = b'"\\\n\r\t'
"""Bytes `json.dumps` writes with one backslash before (or in place of) them: two bytes each."""


def text_json_size(data: bytes) -> int:
    """`json_size` of the UTF-8 text `data`, counted in its bytes (two C passes, a third of encoding it): the bytes,
    the quotes, and a byte more for each `"`, `\\`, newline, carriage return and tab (non-ASCII is written as is).
    Text with any other control character is encoded to count it. A source read again unchanged is not counted
    again: the size of text of `KEPT_BYTES` is kept by content, as its hash is."""
    if type(data) is bytes and KEPT_BYTES[0] <= len(data) <= KEPT_BYTES[1]:
        return _kept_json_size(data)
    return _json_size_of(data)


def _json_size_of(data: bytes) -> int:
    if len(data.translate(None, _ESCAPED_LONG)) != len(data):
        return json_size(data.decode())
    return 2 * len(data) + 2 - len(data.translate(None, _ESCAPED_SHORT))


_kept_json_size = functools.lru_cache(maxsize=64)(_json_size_of)


def size_of(model: BaseModel) -> int:
    return len(model.model_dump_json().encode())


def encode_cursor(tool: str, **state: Any) -> str:
    """An opaque cursor for the next page of `tool`; it holds only positions and what binds them, never content."""
    raw = json.dumps({"tool": tool, **state}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def binding(*values: str | None) -> str:
    """A short digest of the arguments a cursor continues (a description, a grep, a source), which a cursor
    holds instead of the arguments themselves."""
    return hashlib.sha256(json.dumps(values).encode()).hexdigest()[:16]


def decode_cursor(cursor: str, tool: str, fields: Mapping[str, type | tuple[type, ...]]) -> dict[str, Any]:
    """The state of a cursor `encode_cursor` made for `tool`, each of `fields` of its type; else `InvalidArgument`."""
    try:
        state = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        state = None
    if (
        not isinstance(state, dict)
        or state.get("tool") != tool
        or any(not isinstance(state.get(name), kind) or type(state.get(name)) is bool for name, kind in fields.items())
    ):
        raise InvalidArgument(
            f"cursor is not one that {tool} handed out.",
            hint="Pass next_cursor from the previous page unchanged, or call without cursor to start again.",
        )
    return state


def clip(text: str, budget: int) -> str:
    """`text` cut to at most `budget` bytes of JSON, keeping its start and its end (where a test's or a diff's
    verdict is) around a note of how much was left out."""
    if json_size(text) <= budget:
        return text

    def clipped(keep: int) -> str:
        head = (keep + 1) // 2
        return text[:head] + CLIP_MARK.format(len(text) - keep) + text[len(text) - (keep - head) :]

    low, high = 0, min(len(text) - 1, budget)
    while low < high:  # the most characters kept whose clipped form fits
        mid = (low + high + 1) // 2
        if json_size(clipped(mid)) <= budget:
            low = mid
        else:
            high = mid - 1
    return clipped(low)


MAX_ESCAPE = 6
"""The most bytes of JSON one byte of UTF-8 text takes (a control character as `\\u001f`; other characters take as
many bytes as in UTF-8, or two when escaped with a backslash)."""


def text_page(data: bytes, start: int, budget: int) -> int:
    """Where a page of UTF-8 `data` from byte `start` ends so its text takes at most `budget` bytes of JSON: after
    the last whole line that fits, or mid-line (at a character boundary) when not even one line does."""
    if (len(data) - start) * MAX_ESCAPE + 2 <= budget:  # fits however it is escaped: no need to encode it to know
        return len(data)
    end = min(len(data), start + budget)  # JSON takes at least a byte per byte
    while True:
        if end < len(data):
            newline = data.rfind(b"\n", start, end)
            if newline >= start:
                end = newline + 1
            else:
                while end > start + 1 and data[end] & 0xC0 == 0x80:
                    end -= 1
        size = text_json_size(data[start:end])
        if size <= budget:
            return end
        end = start + max(1, min(end - start - 1, (end - start) * budget // size))  # escapes took room: shrink
        while end > start + 1 and data[end] & 0xC0 == 0x80:  # to a character boundary, always smaller
            end -= 1
        while end < len(data) and data[end] & 0xC0 == 0x80:  # only when the page is its first character
            end += 1


def fitting(items: Iterable[T], budget: int, size: Callable[[T], int]) -> Iterator[T]:
    """The leading `items` whose sizes (plus a separator each) add up to at most `budget`."""
    used = 0
    for item in items:
        used += size(item) + 1
        if used > budget:
            return
        yield item

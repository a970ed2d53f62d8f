"""The prompt's own message id (`message_id_after`): OpenCode's shape, after the session's newest message, and
before anything the node stamps later; the node's side (a prompt sent twice under it is answered once) is shown
on the real binary in `tests/durable/test_provider_turns.py`."""

from __future__ import annotations

import re
import secrets

from hypothesis import given
from hypothesis import strategies as st
from support.opencode_parts import message_id_after

SHAPE = re.compile(r"msg_[0-9a-f]{12}[0-9A-Za-z]{14}")
WRAP = 1 << 36  # OpenCode keeps 48 bits of `ms << 12`: its ids wrap every 2**36 ms (~795 days), its own limit
START = (1_796_000_000_000 // WRAP) * WRAP
MS = st.integers(min_value=START + 1, max_value=START + WRAP - 30_000)  # times clear of a wrap


def node_id(ms: int, counter: int = 1) -> str:
    """An id as the node mints it at `ms` (its `Identifier.ascending`)."""
    value = ((ms << 12) + counter) & ((1 << 48) - 1)
    return f"msg_{value:012x}{secrets.token_hex(7)}"


@given(created=MS, gap=st.integers(min_value=0, max_value=10_000), later=st.integers(min_value=1, max_value=10_000))
def test_a_minted_id_sorts_after_the_newest_message_and_before_the_reply(created: int, gap: int, later: int) -> None:
    newest = node_id(created + gap, counter=7)
    minted = message_id_after(newest, created_ms=created)
    assert SHAPE.fullmatch(minted)
    assert newest < minted < node_id(created + gap + later)


@given(created=MS, later=st.integers(min_value=1, max_value=10_000))
def test_a_new_sessions_first_id_is_its_creation_time(created: int, later: int) -> None:
    minted = message_id_after(None, created_ms=created)
    assert SHAPE.fullmatch(minted)
    assert node_id(created - 1) < minted < node_id(created + later)


def test_a_foreign_previous_id_falls_back_to_the_creation_time() -> None:
    assert (
        message_id_after("not-an-opencode-id", created_ms=1_800_000_000_000)[4:16] == node_id(1_800_000_000_000)[4:16]
    )

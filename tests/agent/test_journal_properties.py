"""Property: whatever mix of appends, item updates and session updates was written, and wherever the last
write was cut short, the journal loads to a prefix of what was written (all but a torn last record), and
the store keeps working after the repair."""

from __future__ import annotations

import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unit_mcp.agent import SessionStore
from unit_mcp.agent.items import MessageItem, Session

text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=24)
operation = st.one_of(
    st.tuples(st.just("append"), text),
    st.tuples(st.just("update_item"), st.integers(0, 64), text),
    st.tuples(st.just("update"), text),
)


def state(session: Session) -> tuple[str | None, list[tuple[str, str]]]:
    return session.title, [(item.id, item.content) for item in session.items if isinstance(item, MessageItem)]


def apply(store: SessionStore, session_id: str, op: tuple[Any, ...]) -> None:
    """Each operation writes exactly one journal record (an update with no items yet appends instead)."""
    session = store.require(session_id)
    if op[0] == "update" or (op[0] == "update_item" and not session.items):
        if op[0] == "update":
            store.update(session, title=op[1])
        else:
            store.append_item(session, MessageItem(role="user", content=op[2]))
    elif op[0] == "update_item":
        target = session.items[op[1] % len(session.items)]
        store.update_item(session, target.id, {"content": op[2]})
    else:
        store.append_item(session, MessageItem(role="user", content=op[1]))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(operation, min_size=1, max_size=30), cut=st.integers(0, 10_000), compact_after=st.integers(1, 6))
def test_a_torn_journal_loads_to_a_prefix_of_what_was_written(
    ops: list[tuple[Any, ...]], cut: int, compact_after: int
) -> None:
    with tempfile.TemporaryDirectory() as root:
        store = SessionStore(root, durability="never", compact_after=compact_after)
        session_id = store.create("a").id
        states = [state(store.require(session_id))]
        for op in ops:
            apply(store, session_id, op)
            states.append(state(store.require(session_id)))
        store.close()

        path = store.journal_path(session_id)
        data = path.read_bytes()
        last_line = len(data) - data.rstrip(b"\n").rfind(b"\n") - 1
        torn = cut % (last_line + 1)
        path.write_bytes(data[: len(data) - torn])

        reopened = SessionStore(root, durability="never")
        loaded = state(reopened.require(session_id))
        assert loaded in states
        assert loaded == (states[-2] if torn else states[-1])

        reopened.append_item(session_id, MessageItem(role="user", content="after"))
        reopened.close()
        title, items = state(SessionStore(root).require(session_id))
        assert (title, items[:-1]) == loaded and items[-1][1] == "after"

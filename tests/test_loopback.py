"""`CoalescedWrites`, the transport wrapper every loopback server's connections use: what is written in one turn
of the event loop leaves in one send, in order, and nothing is lost on close. Checked on a real socket pair."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from unit_mcp.loopback import CoalescedWrites

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def coalesced_pair() -> AsyncIterator[tuple[CoalescedWrites, socket.socket]]:
    ours, peer = socket.socketpair()
    peer.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    try:
        yield CoalescedWrites(transport, loop), peer
    finally:
        transport.abort()
        peer.close()


def received(peer: socket.socket) -> bytes:
    try:
        return peer.recv(1 << 16)
    except BlockingIOError:
        return b"<nothing yet>"


async def test_writes_of_one_turn_leave_together_at_the_next() -> None:
    async with coalesced_pair() as (writes, peer):
        writes.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n")
        writes.write(memoryview(b"body"))
        writes.write(b"")
        assert received(peer) == b"<nothing yet>"
        await asyncio.sleep(0)
        assert received(peer) == b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nbody"
        writes.write(b"next")
        await asyncio.sleep(0)
        assert received(peer) == b"next"
        assert writes.get_extra_info("socket") is not None  # everything else is the transport's


async def test_a_large_write_leaves_at_once_after_what_is_pending() -> None:
    async with coalesced_pair() as (writes, peer):
        large = b"x" * CoalescedWrites.JOIN_LIMIT
        writes.write(b"head:")
        writes.write(large)
        got = peer.recv(1 << 20)  # without a turn of the loop: the head was sent with it
        while len(got) < len(large) + 5:  # what the socket did not take at once the transport sends on
            await asyncio.sleep(0.01)
            with contextlib.suppress(BlockingIOError):
                got += peer.recv(1 << 20)
        assert got == b"head:" + large
        await asyncio.sleep(0)  # the flush scheduled for the head finds nothing left
        assert received(peer) == b"<nothing yet>"


async def test_close_sends_what_is_pending_first_and_abort_drops_it() -> None:
    async with coalesced_pair() as (writes, peer):
        writes.write(b"last words")
        writes.close()
        await asyncio.sleep(0.05)
        assert received(peer) == b"last words"
        assert received(peer) == b""  # then the end of the stream
    async with coalesced_pair() as (writes, peer):
        writes.write(b"never sent")
        writes.abort()
        await asyncio.sleep(0.05)
        assert received(peer) == b""
        assert writes.is_closing()

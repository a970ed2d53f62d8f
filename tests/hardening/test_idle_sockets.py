"""Idle sockets of another local user (issue 22, item 7): a process of uid 65534 holds hundreds of connections
to the bridge, or a thousand to the page, sends nothing and reconnects each one the server closes. The token
holder is served all the same (before the request deadline would have freed a slot), and the page's file
descriptors stay bounded."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from support.server_process import ServerProcess
from ui.conftest import page_client

from unit_mcp import Host
from unit_mcp.loopback import MAX_CONNECTIONS, REQUEST_TIMEOUT

from .clients import call, connect
from .conftest import serve
from .report import Report
from .test_transport import ping, port_of, section

pytestmark = pytest.mark.anyio
NOBODY = 65534
BOUND = REQUEST_TIMEOUT / 2  # generous; a slot freed only by the request deadline would come too late

# The attacker: stdlib only, run by the system Python as another user (the venv lives under /root).
HOLD = r"""
import selectors, socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
held = selectors.DefaultSelector()
def connect():
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    held.register(sock, selectors.EVENT_READ)
for _ in range(count):
    connect()
print("holding", flush=True)
while True:
    for key, _ in held.select():
        held.unregister(key.fileobj)
        key.fileobj.close()
        connect()
"""


@asynccontextmanager
async def idle_sockets(port: int, count: int) -> AsyncIterator[subprocess.Popen[str]]:
    """`count` connections to `port` held open by a process of uid 65534, each reopened once the server closes it."""
    attacker = subprocess.Popen(
        ["/usr/bin/python3", "-I", "-c", HOLD, str(port), str(count)],
        user=NOBODY,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (count + 64, count + 64)),
    )
    try:
        assert attacker.stdout is not None and attacker.stderr is not None
        ready = await anyio.to_thread.run_sync(attacker.stdout.readline)  # the bridge serves on this loop
        assert ready.strip() == "holding", attacker.stderr.read()
        yield attacker
        assert attacker.poll() is None, f"the attacker stopped holding: {attacker.stderr.read()}"
    finally:
        attacker.kill()
        attacker.wait()


async def test_idle_sockets_do_not_deny_the_token_holder(host: Host, front: str, figures: Report) -> None:
    count = MAX_CONNECTIONS + 44  # the 260 of the report (with the default limits)
    async with serve(host, front) as bridge:
        port = port_of(bridge)
        async with idle_sockets(port, count):
            waited = []
            for _ in range(5):  # a fresh connection each time: it has to find room among the held sockets
                started = time.perf_counter()
                with anyio.fail_after(BOUND):
                    async with httpx2.AsyncClient(timeout=BOUND) as http:
                        assert await ping(http, bridge.url or "", bridge.token) == 200
                waited.append(time.perf_counter() - started)
            with anyio.fail_after(BOUND):
                async with connect(bridge.url or "", bridge.token) as client:
                    assert not (await call(client, "unit_list", {})).is_error
    figures.record(
        section(front),
        idle_sockets_of_another_user=count,
        token_holder_served="5 of 5 fresh connections, and an MCP session",
        token_holder_slowest_s=round(max(waited), 2),
    )


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_idle_sockets_do_not_exhaust_the_page(tmp_path: Path, figures: Report) -> None:
    count = 1100  # the report's: above the usual 1,024 file descriptors
    options = ["--model", "m", "--base-url", "http://127.0.0.1:9/v1"]
    data = str(tmp_path / "agent-data")
    ui = ServerProcess("--data-dir", data, "ui", *options, tmp=tmp_path, module="unit_mcp.agent")
    try:
        url = (await anyio.to_thread.run_sync(lambda: ui.ready(60, last="AGENT_UI_URL")))["AGENT_UI_URL"]
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.prlimit(ui.proc.pid, resource.RLIMIT_NOFILE, (1024, hard))  # the usual soft limit
        port = int(url.split(":")[2].split("/")[0])
        async with idle_sockets(port, count):
            started = time.perf_counter()
            with anyio.fail_after(BOUND):
                async with page_client(url) as client:
                    page = await client.get("/")
                    assert page.status_code == 200 and "Nothing waits for an answer." in page.text
            served_after = time.perf_counter() - started
            fds = open_fds(ui.proc.pid)
            assert fds < MAX_CONNECTIONS + 64, f"the page holds {fds} file descriptors"
    finally:
        assert await anyio.to_thread.run_sync(ui.stop) == 0, ui.stderr()
    figures.record(
        "approval page",
        idle_sockets_of_another_user=count,
        page_served_after_s=round(served_after, 2),
        page_open_fds_under_attack=fds,
    )

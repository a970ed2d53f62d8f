"""A warm test host: a process started ahead of the test runs, with the test host's code imported, that forks one
child per `unit_run_tests` call.

Each child builds its own headless `Host` from the loader, so it sees the latest edit; strays a dead child left
are killed, and a child is reaped only once its caller closes the reply socket (no reused pid is ever hit).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import sys
from typing import Any

from .proctree import become_subreaper, kill_tree, reap_strays

MAX_REQUEST = 1 << 16


def serve(control: socket.socket) -> None:
    """The warm process's loop: fork a child per request, report its pid and, once reaped, its exit code.

    Over a SOCK_SEQPACKET pair (one message per datagram, descriptors passed with SCM_RIGHTS) the caller sends
    `{"argv": [...], "cwd": ..., "env": {...}}` with the child's stdout and stderr pipes and one end of a reply
    socket pair; the answers on the reply socket are `{"pid": N}` once forked and `{"exit": code}` once the child
    has ended. The loop ends when the caller's end of the control socket closes."""
    from . import testhost  # imported once, here, so that each child starts with it loaded

    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    children: set[int] = set()  # forked and not yet reaped: every other child of ours is a stray
    while True:
        for key, _ in selector.select():
            if selector.get_map().get(key.fileobj) is not key:
                continue  # re-registered by an earlier event of this round
            if key.fileobj is control:
                try:
                    message, fds, _, _ = socket.recv_fds(control, MAX_REQUEST, 3)
                except (ConnectionResetError, OSError):
                    message, fds = b"", []
                if not message:
                    return  # the caller closed its end: it is gone or shutting the warm host down
                children.add(_start(selector, testhost, json.loads(message), fds))
            elif key.data[0] == "ended":
                _, pid, reply = key.data
                selector.unregister(key.fd)
                os.close(key.fd)
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # keep the zombie: its pid stays ours
                assert info is not None
                code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
                reap_strays(children)  # what the test left behind, before the caller hears that it ended
                with contextlib.suppress(OSError):
                    reply.send(json.dumps({"exit": code}).encode())
                with contextlib.suppress(KeyError):
                    selector.unregister(reply)
                selector.register(reply, selectors.EVENT_READ, ("released", pid, reply))
            elif key.data[0] == "running":  # the caller closed the reply socket of a running child: gone or gave up
                selector.unregister(key.fileobj)
                kill_tree(key.data[1])  # its end is reported as "ended" next, and the child reaped at once
            else:
                _, pid, reply = key.data
                selector.unregister(reply)
                reply.close()
                os.waitpid(pid, 0)
                children.discard(pid)


def _start(selector: selectors.BaseSelector, testhost: Any, request: dict[str, Any], fds: list[int]) -> int:
    out, err, reply_fd = fds
    reply = socket.socket(fileno=reply_fd)
    pid = os.fork()
    if pid == 0:
        _child(testhost, request, out, err)
    os.close(out)
    os.close(err)
    try:
        reply.send(json.dumps({"pid": pid}).encode())
    except OSError:
        kill_tree(pid)  # the caller gave up: nobody would watch or kill this test; it is still reaped below
    selector.register(os.pidfd_open(pid), selectors.EVENT_READ, ("ended", pid, reply))
    selector.register(reply, selectors.EVENT_READ, ("running", pid, reply))
    return pid


def _child(testhost: Any, request: dict[str, Any], out: int, err: int) -> None:
    """In the forked child: become a session of its own, take the caller's pipes as stdout and stderr, run the
    test host; never return."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024)  # the control socket too
        if sys.path and sys.path[0] == os.getcwd():  # `-m` put the warm host's folder first: a cold run has its own
            sys.path[0] = request["cwd"]
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv[:] = [testhost.__file__, *request["argv"]]
        code = _exit_code(testhost.main, request["argv"])
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _exit_code(main: Any, argv: list[str]) -> int:
    """What `sys.exit(main(argv))` would make the exit status of a cold test host."""
    try:
        return int(main(argv))
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1


def main() -> None:
    become_subreaper()
    control = socket.socket(fileno=int(sys.argv[1]))
    serve(control)


if __name__ == "__main__":
    main()

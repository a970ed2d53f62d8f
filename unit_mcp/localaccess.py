"""The escape hatch (`--allow-local-access`): a person lets an isolated OpenCode use its own read and edit tools in
one unit's folder for a while (docs/local-access.md).

A grant is a link to the unit's folder that a launched OpenCode may use; when it ends the link leads nowhere.
Grants, their end, and the edits made meanwhile go to the change log.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .changelog import GRANT_PREFIX, NOBODY, Caller, iso_time
from .host import Host
from .opencode_isolation import local_access_dir, write_local_grants

log = logging.getLogger("unit_mcp.localaccess")
LOCAL_ACCESS_CLIENT = "local access"
"""The client name of a change made in a granted folder; its session id is the grant's id."""
TOOL = "unit_request_local_access"
ATTRIBUTION_GRACE_S = 10.0
"""An outside change seen this long after a grant ended is still its own (the watcher reports after a debounce)."""


@dataclass
class LocalGrant:
    """Local access to one unit's folder through `link`, until `expires` (epoch seconds) or an earlier end."""

    id: str
    unit_id: str
    folder: Path
    link: Path
    reason: str
    client: str | None
    expires: float
    ended: float | None = None
    end: str | None = None
    """How it ended: 'revoked' or 'expired' (None while it lasts)."""


class LocalAccess:
    """The grants of one server; their links live under `config_home` (the isolated OpenCode's config home)."""

    def __init__(self, config_home: Path, host: Host, *, clock: Callable[[], float] = time.time) -> None:
        self.config_home = config_home
        self.folder = local_access_dir(config_home)
        self.host = host
        self.clock = clock
        self.version = 0
        """Bumped on every grant and end (the page redraws on it)."""
        self._grants: dict[str, LocalGrant] = {}
        self._timers: dict[str, threading.Timer] = {}
        self._lock = threading.Lock()
        shutil.rmtree(self.folder, ignore_errors=True)  # links of an earlier run lead nowhere any more
        self.folder.mkdir(parents=True, mode=0o700)
        write_local_grants(config_home, [])
        host.outside_caller = self.caller_for

    def grant(self, unit_id: str, folder: Path, reason: str, minutes: float, caller: Caller) -> LocalGrant:
        """Open `folder` (a real folder, checked by the caller) to OpenCode's read and edit tools for `minutes`."""
        with self._lock:
            grant_id = f"{GRANT_PREFIX}{secrets.token_hex(6)}"
            link = self.folder / grant_id
            grant = LocalGrant(grant_id, unit_id, folder, link, reason, caller.name, self.clock() + minutes * 60)
            os.symlink(folder, grant.link, target_is_directory=True)
            self._grants[grant.id] = grant
            self._publish()
            timer = threading.Timer(minutes * 60, self._expire, (grant.id,))
            timer.daemon = True
            self._timers[grant.id] = timer
            timer.start()
        self._record(grant, caller, f"granted until {iso_time(grant.expires)} to {grant.link}: {reason}")
        log.info("local access %s to unit %s for client %r until %s", grant.id, unit_id, caller.name, grant.expires)
        return grant

    def grants(self) -> list[LocalGrant]:
        """The grants that last, oldest first."""
        with self._lock:
            return sorted((g for g in self._grants.values() if g.ended is None), key=lambda g: g.expires)

    def revoke(self, grant_id: str, caller: Caller) -> bool:
        """End a lasting grant now; False when there is none by that id."""
        return self._end(grant_id, "revoked", caller)

    def _expire(self, grant_id: str) -> None:
        self._end(grant_id, "expired", Caller(name=LOCAL_ACCESS_CLIENT))

    def _end(self, grant_id: str, how: str, caller: Caller) -> bool:
        with self._lock:
            grant = self._grants.get(grant_id)
            if grant is None or grant.ended is not None:
                return False
            grant.ended, grant.end = self.clock(), how
            timer = self._timers.pop(grant_id, None)
            if timer is not None:
                timer.cancel()
            self._close_link(grant)
            self._publish()
        self._record(grant, caller, f"{how}: {grant.link} leads nowhere now")
        log.info("local access %s to unit %s %s", grant_id, grant.unit_id, how)
        return True

    def _close_link(self, grant: LocalGrant) -> None:
        """Replace the link by an empty read-only file: a running OpenCode still holding the rule can neither reach
        the folder nor create one in its place."""
        placeholder = grant.link.with_name(f".{grant.id}.ended")
        placeholder.touch(mode=0o400)
        os.replace(placeholder, grant.link)

    def _publish(self) -> None:
        self.version += 1
        write_local_grants(self.config_home, [(g.id, g.expires) for g in self._grants.values() if g.ended is None])

    def _record(self, grant: LocalGrant, caller: Caller, message: str) -> None:
        self.host.changes.record(
            caller=caller, tool=TOOL, unit_id=grant.unit_id, source_id=None, outcome="applied", message=message
        )

    def caller_for(self, unit_id: str) -> Caller:
        """Who made an outside change of `unit_id`: the grant open on it (or just ended), else nobody known."""
        now = self.clock()
        with self._lock:
            for grant in sorted(self._grants.values(), key=lambda g: g.expires, reverse=True):
                if grant.unit_id == unit_id and (grant.ended is None or now - grant.ended <= ATTRIBUTION_GRACE_S):
                    return Caller(name=LOCAL_ACCESS_CLIENT, version=None, session_id=grant.id)
        return NOBODY

    def close(self) -> None:
        """End every grant (the server stops)."""
        for grant in self.grants():
            self._end(grant.id, "revoked", Caller(name=LOCAL_ACCESS_CLIENT))

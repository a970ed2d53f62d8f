"""A host's activities: what units registered (a name and a factory of live sessions) and the one active session.

Not thread-safe on its own: `Host` calls it under its lock (or from the reload worker, which runs while the
caller holds that lock).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Activity:
    name: str
    factory: Callable[[], Any]
    unit_id: str | None


class Activities:
    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._registered: dict[str, Activity] = {}
        self._active: Activity | None = None
        self.session: Any = None
        """The active activity's live session, or None."""

    def __contains__(self, name: str) -> bool:
        return name in self._registered

    @property
    def active(self) -> str | None:
        return self._active.name if self._active else None

    def owned_by(self, unit_id: str) -> bool:
        """The active activity is one of `unit_id`'s."""
        return self._active is not None and self._active.unit_id == unit_id

    def register(self, name: str, factory: Callable[[], Any], unit_id: str | None) -> None:
        existing = self._registered.get(name)
        if existing is not None and existing.unit_id != unit_id:
            raise ValueError(f"activity {name!r} is already registered by unit {existing.unit_id!r}")
        self._registered[name] = Activity(name, factory, unit_id)

    def names(self, unit_id: str | None = None) -> list[str]:
        registered = list(self._registered.items())
        return sorted(n for n, a in registered if unit_id is None or a.unit_id == unit_id)

    def forget(self, unit_id: str) -> None:
        """Unregister the unit's activities (after its drop, or after a failed import or init)."""
        for name in [n for n, a in self._registered.items() if a.unit_id == unit_id]:
            del self._registered[name]

    def activate(self, name: str) -> Any:
        activity = self._registered.get(name)
        if activity is None:
            raise KeyError(f"no activity named {name!r} is registered")
        self.deactivate()
        self.session = activity.factory()
        self._active = activity
        self.logger.info("activity %s activated", name)
        return self.session

    def deactivate(self) -> None:
        session, self.session, self._active = self.session, None, None
        close = getattr(session, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                self.logger.exception("closing the active session failed")

    def reactivate(
        self, unit_id: str, active_before: str | None, owned_active: bool, describe: Callable[[BaseException], str]
    ) -> dict[str, Any]:
        """After `unit_id` reloaded: activate again what was active if it was the unit's; the reload's evidence."""
        registered_after = active_before is not None and active_before in self
        error = None
        if owned_active and active_before is not None:
            if registered_after:
                try:
                    self.activate(active_before)
                except Exception as exc:
                    error = describe(exc)
                    self.logger.error("re-activating %s after reloading %s failed: %s", active_before, unit_id, error)
            else:
                error = f"activity {active_before!r} is no longer registered by unit {unit_id!r}"
        return {
            "active_activity_before": active_before,
            "active_activity_after": self.active,
            "reactivation_attempted": owned_active,
            "registered_after": registered_after,
            "has_active_session_after": self.session is not None,
            "error": error,
        }

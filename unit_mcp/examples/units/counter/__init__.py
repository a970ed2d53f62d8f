"""A click counter: counts clicks, keeps its count across reloads and offers a "counter" activity."""

import logging

from .panel import Panel

log = logging.getLogger("units.counter")
count = 0
step = 1


def increment():
    """Add one step to the count and return the new count."""
    global count
    count += step
    log.info("count is now %d", count)
    return count


def init(host):
    host.register_activity("counter", lambda: Panel(lambda: count))
    log.info("counter ready at %d", count)


def drop():
    log.info("counter dropped at %d", count)


def snapshot():
    return {"count": count}


def restore(state):
    global count
    count = int(state.get("count", 0))

"""A file unit: greets people by name."""

import logging

log = logging.getLogger("units.greeter")


def greet(name):
    """Return a friendly greeting."""
    log.info("greeting %s", name)
    return f"Hello, {name}!"

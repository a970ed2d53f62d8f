"""Runs with main(): None, 0 or True is a pass."""

import units.counter as counter


def main():
    before = counter.count
    assert counter.increment() == before + counter.step
    assert counter.snapshot() == {"count": before + counter.step}

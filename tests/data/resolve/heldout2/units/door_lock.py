"""Locks and unlocks the front door with a PIN or a phone."""


def unlock(*args):
    return args


def lock(*args):
    return args

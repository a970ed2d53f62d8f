"""Keeps the room temperature near a target by switching the heater on and off."""


def set_target(*args):
    return args


def tick(*args):
    return args

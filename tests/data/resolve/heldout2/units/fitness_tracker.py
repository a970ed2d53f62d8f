"""Counts daily steps and burned calories from the wristband."""


def log_steps(*args):
    return args


def calories(*args):
    return args

"""Pushes alerts to installed mobile apps through their device tokens."""


def register_device(*args):
    return args


def push(*args):
    return args

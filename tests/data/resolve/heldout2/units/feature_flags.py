"""Turns features on for a percentage of users without a deploy."""


def is_enabled(*args):
    return args


def set_rollout(*args):
    return args

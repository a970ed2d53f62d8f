"""Masks rude and offensive words in user text."""


def clean(*args):
    return args

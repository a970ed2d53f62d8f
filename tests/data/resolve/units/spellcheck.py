"""Suggests corrections for misspelt words using edit distance to a dictionary."""


def suggest(*args):
    return args


def edit_distance(*args):
    return args

"""Scores whether a product review is positive or negative."""


def score_review(*args):
    return args

"""Stores cooking recipes with their ingredients and scales the portions."""


def scale_servings(*args):
    return args

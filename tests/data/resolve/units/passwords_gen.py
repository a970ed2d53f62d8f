"""Generates random strong passphrases from a word list."""


def generate(*args):
    return args

"""Translates interface strings into the user's language from message catalogues."""


def translate(*args):
    return args


def load_catalogue(*args):
    return args

"""Turns street addresses into latitude and longitude coordinates."""


class Coordinates:
    pass


def lookup(*args):
    return args

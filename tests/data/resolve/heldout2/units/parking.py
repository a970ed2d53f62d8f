"""Tracks free spaces in the car park and charges by the hour."""


def enter(*args):
    return args


def leave(*args):
    return args


def fee(*args):
    return args

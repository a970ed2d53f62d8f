"""Postage cost by parcel weight, destination zone and carrier."""


def quote(*args):
    return args

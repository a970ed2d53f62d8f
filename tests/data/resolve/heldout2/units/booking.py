"""Reserves tables at the restaurant for a party size and a time."""


def reserve(*args):
    return args


def cancel_reservation(*args):
    return args

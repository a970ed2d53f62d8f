"""Sends lift cars to the floors where they are requested."""


def call(*args):
    return args


def next_stop(*args):
    return args

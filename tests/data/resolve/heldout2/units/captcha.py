"""Challenges that tell humans from bots on the signup form."""


def new_challenge(*args):
    return args


def verify_answer(*args):
    return args

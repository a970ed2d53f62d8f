"""A chat room: users join, post messages and see who is online."""


def join(*args):
    return args


def post(*args):
    return args


def online_users(*args):
    return args

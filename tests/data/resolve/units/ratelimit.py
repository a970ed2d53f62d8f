"""Token bucket limiting how many requests a client may make per second."""


class Bucket:
    pass


def allow(*args):
    return args

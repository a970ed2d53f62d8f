"""Threaded replies under blog posts, with moderation."""


def post_comment(*args):
    return args


def hide_comment(*args):
    return args

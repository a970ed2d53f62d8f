"""Converts Markdown text to HTML for the help pages."""


def to_html(*args):
    return args

"""Fetches RSS and Atom news feeds and lists new articles."""


def fetch_feed(*args):
    return args


def new_articles(*args):
    return args

"""Reads printed text out of scanned images."""


def extract_text(*args):
    return args

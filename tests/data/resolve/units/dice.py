"""Rolls dice for tabletop games: parses expressions like 3d6+2."""


def roll(*args):
    return args


def parse_expression(*args):
    return args

"""Finds the shortest route between two points on a grid map with A*."""


def shortest_path(*args):
    return args


def heuristic(*args):
    return args

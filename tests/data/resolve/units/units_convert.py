"""Converts between metric and imperial measurements: metres, feet, kilograms, pounds."""


def convert(*args):
    return args

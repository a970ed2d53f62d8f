"""Stock levels of products in the warehouse; warns when an item runs low."""


def add_stock(*args):
    return args


def remove_stock(*args):
    return args


def low_items(*args):
    return args

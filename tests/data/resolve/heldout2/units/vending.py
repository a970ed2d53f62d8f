"""A vending machine: takes coins, gives change and dispenses snacks."""


def insert_coin(*args):
    return args


def dispense(*args):
    return args

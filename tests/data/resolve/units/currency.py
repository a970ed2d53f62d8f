"""Exchange rates between currencies; converts amounts from euros to dollars and back."""


def convert_amount(*args):
    return args


def rates(*args):
    return args

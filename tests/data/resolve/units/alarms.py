"""Sets and clears the warning lights on the control panel when a sensor crosses its threshold."""


def raise_alarm(*args):
    return args


def clear_alarm(*args):
    return args

"""Shows a month grid with the user's appointments."""


def month_grid(*args):
    return args


def appointments_on(*args):
    return args

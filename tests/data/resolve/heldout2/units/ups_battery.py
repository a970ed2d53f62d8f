"""Reports the charge level and the estimated runtime of the backup power supply."""


def charge(*args):
    return args


def runtime(*args):
    return args

"""Runs jobs at fixed times of day, like cron."""


class Job:
    pass


def every(*args):
    return args


def run_pending(*args):
    return args

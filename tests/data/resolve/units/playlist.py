"""An ordered list of songs with shuffle and repeat."""


class Playlist:
    pass


def shuffle(*args):
    return args


def next_track(*args):
    return args

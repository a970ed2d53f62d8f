"""Draws QR codes for links so phones can scan them."""


def make_qr(*args):
    return args

"""Sends text messages to mobile phone numbers through a gateway."""


def send_sms(*args):
    return args

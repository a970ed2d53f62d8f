"""Full-text search over documents, with ranked results."""


def index_document(*args):
    return args


def search(*args):
    return args

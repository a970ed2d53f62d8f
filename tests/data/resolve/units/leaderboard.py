"""High scores of players, ranked, with the top ten shown after each game."""


def submit_score(*args):
    return args


def top_ten(*args):
    return args

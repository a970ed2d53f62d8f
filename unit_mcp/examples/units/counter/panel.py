"""The live session object of the "counter" activity."""


class Panel:
    def __init__(self, read_count):
        self.read_count = read_count
        self.closed = False

    def render(self):
        return f"Clicks: {self.read_count()}"

    def close(self):
        self.closed = True

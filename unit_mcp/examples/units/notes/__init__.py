"""Notes kept in several languages: café, naïve, Grüße, 日本語 (CRLF line endings)."""

NOTES = ["café au lait", "naïve approach", "Grüße aus Köln"]


def search(word):
    """Return the notes that contain word."""
    return [note for note in NOTES if word in note]

"""Splitting a text into overlapping chunks of about `size` characters, cut at a
paragraph, a sentence or a space where one is near, so that a chunk rarely starts
or ends in the middle of a word. Characters rather than model tokens: the chunk
size then means the same whatever the embedding model (MiniLM reads ~256 tokens,
about 1000 characters of English)."""

import re

_BREAKS = ("\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " ")


def _cut(text, start, size):
    """The end of the chunk that starts at `start`: the last break in its second half."""
    end = start + size
    if end >= len(text):
        return len(text)
    window = text[start:end]
    for separator in _BREAKS:
        at = window.rfind(separator)
        if at >= size // 2:
            return start + at + len(separator)
    return end


def chunks(text, size, overlap):
    text = re.sub(r"[ \t]+\n", "\n", text).strip()
    if not text:
        return []
    pieces, start = [], 0
    while start < len(text):
        end = _cut(text, start, size)
        piece = text[start:end].strip()
        if piece:
            pieces.append(piece)
        if end >= len(text):
            break
        # The next chunk starts `overlap` characters back, at a space if there is one.
        back = max(start + 1, end - overlap)
        space = text.find(" ", back, end)
        start = space + 1 if overlap and space != -1 else back
    return pieces

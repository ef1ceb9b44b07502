"""Where every process of the bundle logs: one line a record to stderr (journald in
production). No Flask here: job workers and commands set it up too.

A record's message is escaped before it is written: control characters (C0, DEL, C1
such as NEL \\x85), the Unicode line and paragraph separators and the invisible
format characters that reorder or hide text become `\\n`, `\\x85`, `\\u2028`... So a
value a client chose (a path with %0a, a client error report) can never start a
line of its own that looks like the service's. Tracebacks, appended after the
message, keep their lines."""

import logging
import re
import sys

# C0 and DEL, C1, zero-width and direction marks, line/paragraph separators, bidi
# embeddings and isolates, the byte-order mark.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape(text: str) -> str:
    """`text` with every character of _UNSAFE written as an escape."""
    return _UNSAFE.sub(
        lambda m: _SHORT.get(m[0]) or (f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}"), text
    )


class EscapingFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)


def configure_logging() -> None:
    root = logging.getLogger()
    if not any(getattr(h, "_bundle", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(EscapingFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        handler._bundle = True  # type: ignore[attr-defined]  # our mark on the handler
        root.addHandler(handler)
    root.setLevel(logging.INFO)

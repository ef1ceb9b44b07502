"""JSON from clients (bodies, query and form values, websocket messages), parsed with
a cap on nesting. Flask-free: job workers and websocket handlers use it too.

`loads(text)` is json.loads that raises TooDeep (a ValueError, as malformed JSON is)
for JSON nested deeper than MAX_JSON_DEPTH, instead of the RecursionError json.loads
raises near 1,000 levels (a 500) or a structure deep enough to exhaust the stack of
the code below it (marshmallow, jsonify, the database's JSON functions).
"""

import json
from typing import Any

# No document a client sends is nested deeper.
MAX_JSON_DEPTH = 64


class TooDeep(ValueError):
    """JSON nested deeper than MAX_JSON_DEPTH: a ValueError, as malformed JSON is."""


def loads(text: str | bytes) -> Any:
    """json.loads(text), or TooDeep past MAX_JSON_DEPTH levels (see the module's text)."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise TooDeep(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    # Walked with a stack of its own, not recursively: its depth is what is in question.
    pending = [(data, 1)] if isinstance(data, (dict, list)) else []
    while pending:
        value, depth = pending.pop()
        children = value.values() if isinstance(value, dict) else value
        if depth > MAX_JSON_DEPTH:
            raise TooDeep(f"nested deeper than {MAX_JSON_DEPTH} levels")
        pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return data

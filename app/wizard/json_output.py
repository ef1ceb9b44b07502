"""The local repair of a model's JSON-mode output: it fixes JSON that the model
wrote, and never makes structure out of prose.

json-repair alone turns any text with a bracket in it into a value ("I think
[maybe] so" becomes ["maybe"]), and answering that with 200 would be a made-up
result. So a repaired value counts only when

- it comes from a span that starts at the model's own opener: the output's first
  character (after a code fence), or, after a sentence, the first `{` that goes on
  as JSON does (a quoted key or `}`); a `[` after prose is a citation or an aside,
  never the start of the answer;
- an opener is followed by a JSON token (`[maybe]`, `{the idea}` are prose);
- the value has the opener's type, is not empty, and every key of every object in
  it is written in the span as JSON writes a key: a quoted string and a colon.

What it does fix: code fences, a sentence before the object or prose after it,
trailing commas, missing closing brackets and braces, single quotes, a missing
quote around a value.
"""

import json
import re

import json_repair

_FENCE = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n?(.*?)(?:```|\Z)", re.S)
# A quoted string followed by a colon: how JSON (and a model's single-quoted JSON) writes a key.
_WRITTEN_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:|\'((?:[^\'\\]|\\.)*)\'\s*:', re.S)
_LITERAL = re.compile(r"(true|false|null)(?![A-Za-z0-9_])")
_STARTS_A_VALUE = set("\"'{[]-0123456789")


def repair(content):
    """The value the model meant by `content`, or None when it wrote no JSON to repair."""
    if not isinstance(content, str):
        return None
    text = _unfenced(content).strip()
    start = _opener(text)
    if start is None:
        return None
    span = text[start:]
    value = _leading_json(span)
    if value is None:
        try:
            value = json_repair.repair_json(span, return_objects=True)
        except Exception:  # json-repair gives up in its own ways; any of them means invalid
            return None
    expected = dict if span[0] == "{" else list
    if not isinstance(value, expected) or not value:
        return None
    return value if set(_keys(value)) <= _written_keys(span) else None


def _unfenced(content):
    """The inside of the first code fence, or the whole text when there is none."""
    fenced = _FENCE.search(content)
    return fenced.group(1) if fenced else content


def _opener(text):
    """Where the model's JSON starts in `text`, or None."""
    if text[:1] in ("{", "[") and _goes_on_as_json(text, 0):
        return 0
    position = text.find("{")
    while position != -1:
        if _goes_on_as_json(text, position):
            return position
        position = text.find("{", position + 1)
    return None


def _goes_on_as_json(text, position):
    rest = text[position + 1 :].lstrip()
    if not rest:
        return False
    if text[position] == "{":
        return rest[0] in "\"'}"
    return rest[0] in _STARTS_A_VALUE or bool(_LITERAL.match(rest))


def _leading_json(span):
    """The strict JSON value at the start of `span` (prose may follow it), or None."""
    try:
        value, _ = json.JSONDecoder().raw_decode(span)
    except ValueError:
        return None
    return value


def _keys(value):
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from _keys(item)


def _written_keys(span):
    """Every string that `span` writes as an object key."""
    keys = set()
    for double, single in _WRITTEN_KEY.findall(span):
        raw = double or single
        keys.add(raw)
        try:
            keys.add(json.loads(f'"{raw}"'))
        except ValueError:
            pass
    return keys

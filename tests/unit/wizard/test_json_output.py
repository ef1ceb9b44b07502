"""The local repair of JSON-mode output (app/wizard/json_output.py): JSON that the
model wrote is mended; prose is never turned into structure (acceptance check 4)."""

import json

import json_repair
import pytest

from app.wizard.json_output import repair

IDEAS = [{"title": f"Idea {n}", "description": f"About {n}."} for n in range(1, 6)]

REPAIRED = [
    # a code fence, with and without its language, and a trailing comma
    ('```json\n{"title": "Fenced", "items": [1, 2, 3],}\n```', {"title": "Fenced", "items": [1, 2, 3]}),
    ('```\n{"a": 1}\n```', {"a": 1}),
    # a sentence before the object, prose after it
    ('Here is the JSON you asked for:\n{"title": "x", "tags": ["a", "b"]}', {"title": "x", "tags": ["a", "b"]}),
    ('Sure! {"answer": "yes"} Hope this helps.', {"answer": "yes"}),
    # a missing closing brace or bracket (an answer cut short)
    ('{"title": "Cut", "tags": ["a", "b"', {"title": "Cut", "tags": ["a", "b"]}),
    ('{"outer": {"inner": [1, 2]', {"outer": {"inner": [1, 2]}}),
    # single quotes, a value missing its quotes
    ("{'title': 'Quoted'}", {"title": "Quoted"}),
    ('{"mood": calm}', {"mood": "calm"}),
    # an array written whole by the model, with a trailing comma
    ('["red", "green",]', ["red", "green"]),
    # braces in prose before the real object are skipped
    ('Use {curly} braces like this: {"k": true}', {"k": True}),
    # the ideas batch, fenced with a trailing comma
    ("```json\n" + json.dumps({"ideas": IDEAS})[:-1] + ",}\n```", {"ideas": IDEAS}),
    # keys in other scripts and with escapes
    ('{"título": "sí", "emoji\\u2764": 1,}', {"título": "sí", "emoji❤": 1}),
]

PROSE = [
    "I am sorry, but I would rather describe the answer in plain words today.",
    "I think the answer is [maybe] something else.",
    "Sure! {the best idea} is a quiet morning.",
    "prose with a {stray brace and nothing after it",
    "I would suggest [a calm palette] and {soft light, warm tones}, as in [1] and [2.",
    "See the notes (refs [1] and [2]) for more.",
    "[maybe] not",
    'He said {"so" to me} and left.',  # a quoted word is not a key without its colon
    '{"a": 1, and then b c d: 2}',  # a key the model never wrote as one
    "{}",
    "[]",
    "",
    "   ",
    "```json\n\n```",
    '"just a string"',
    "42",
]


@pytest.mark.parametrize("content, expected", REPAIRED)
def test_json_the_model_wrote_is_repaired(content, expected):
    assert repair(content) == expected


@pytest.mark.parametrize("content", PROSE)
def test_prose_is_never_made_into_structure(content):
    assert repair(content) is None


@pytest.mark.parametrize("content", [p for p in PROSE if "[" in p or "{" in p][:5])
def test_json_repair_alone_would_have_made_something_of_it(content):
    """The cases above are not straw men: the library on its own invents a value."""
    assert json_repair.repair_json(content, return_objects=True) not in ("", None)


def test_not_a_string_is_nothing_to_repair():
    assert repair(None) is None and repair(b'{"a": 1}') is None

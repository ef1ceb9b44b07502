"""The one OpenAI-compatible chat decoder (app.common.openai_chat), read with each
service's own wording: the wizard refuses a stream that is not whole, the notebook
reads past records without a chunk and takes an unfinished stream as ended."""

import json
import types

import pytest

from app.common.openai_chat import answer_of, deltas
from app.notebook.llm.openai import _ChatWording as NotebookWording
from app.wizard.generation import GenerationFailed
from app.wizard.generation import _Wording as WizardWording


def _records(*items):
    return [types.SimpleNamespace(data=item if isinstance(item, str) else json.dumps(item)) for item in items]


def _chunk(content, finish=None, model="m-1"):
    return {"model": model, "choices": [{"delta": {"content": content}, "finish_reason": finish}]}


WIZARD = WizardWording("the provider")
NOTEBOOK = NotebookWording("the provider")


@pytest.mark.parametrize("wording", [WIZARD, NOTEBOOK], ids=["wizard", "notebook"])
def test_a_whole_stream_gives_its_deltas_in_order(wording):
    got = list(deltas(_records(_chunk("Hel"), _chunk("lo", "stop"), "[DONE]", _chunk("after")), wording))
    assert "".join(d.content for d in got) == "Hello"
    assert [d.finished for d in got] == [False, True]
    assert {d.model for d in got} == {"m-1"}


def test_an_unfinished_stream_is_refused_by_the_wizard_and_taken_by_the_notebook():
    with pytest.raises(GenerationFailed, match="ended before it was complete") as failure:
        list(deltas(_records(_chunk("partial")), WIZARD))
    assert failure.value.status == 502
    assert "".join(d.content for d in deltas(_records(_chunk("partial")), NOTEBOOK)) == "partial"


def test_an_error_record_mid_stream_is_named_by_the_wizard():
    records = _records(_chunk("a"), {"error": {"message": "overloaded"}})
    with pytest.raises(GenerationFailed, match="error mid-stream: overloaded"):
        list(deltas(records, WIZARD))


@pytest.mark.parametrize("wording", [WIZARD, NOTEBOOK], ids=["wizard", "notebook"])
@pytest.mark.parametrize("record", ["not json", "[1, 2]"])
def test_a_record_that_is_not_a_json_object_is_a_502(wording, record):
    with pytest.raises(Exception) as failure:
        list(deltas(_records(record), wording))
    assert failure.value.status == 502


def test_a_stream_past_its_limit_is_refused_before_the_record_that_crosses_it():
    passed = []
    with pytest.raises(GenerationFailed, match="larger than the size cap"):
        for delta in deltas(_records(_chunk("12345"), _chunk("678"), "[DONE]"), WIZARD, limit=6):
            passed.append(delta.content)
    assert passed == ["12345"]


def test_a_whole_answer_gives_its_text_and_model_and_a_refusal_is_named():
    answer = answer_of({"model": " m-2 ", "choices": [{"message": {"content": "hi"}}]}, WIZARD)
    assert (answer.content, answer.model) == ("hi", "m-2")
    with pytest.raises(GenerationFailed, match="the model refused: no"):
        answer_of({"choices": [{"message": {"content": None, "refusal": "no"}}]}, WIZARD)
    for malformed in ({}, {"choices": []}, {"choices": {"0": 1}}, [1]):
        with pytest.raises(Exception, match="malformed") as failure:
            answer_of(malformed, NOTEBOOK)
        assert failure.value.status == 502

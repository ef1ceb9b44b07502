"""Request schemas of the deck review API (marshmallow). Unknown fields are errors."""

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.decks.layout import ID_PATTERN

VERDICTS = ("approve", "changes_requested", "reject")
EVENT_TYPES = ("note", "task", "task_done", "verdict", "transcript")


class Integer(fields.Integer):
    """A JSON integer: no strings, floats or booleans."""

    def _validated(self, value):
        if isinstance(value, bool):
            raise self.make_error("invalid")
        return super()._validated(value)

    def __init__(self, **kwargs):
        super().__init__(strict=True, **kwargs)


def _text(maximum, **kwargs):
    return fields.String(validate=validate.Length(min=1, max=maximum), **kwargs)


_deck_id = fields.String(required=True, validate=validate.Regexp(ID_PATTERN, error="must match [A-Za-z0-9_-]{{1,64}}"))


class ImportSchema(Schema):
    id = _deck_id
    md_path = _text(4096, required=True)
    copy_from = _text(4096, required=True)


class SessionCreateSchema(Schema):
    deck_id = fields.String(
        required=True, validate=validate.Regexp(ID_PATTERN, error="must match [A-Za-z0-9_-]{{1,64}}")
    )
    title = fields.String(validate=validate.Length(max=200), allow_none=True)


class _EventSchema(Schema):
    type = fields.String(required=True)
    author = fields.String(validate=validate.Length(max=80))


class _SlideEvent(_EventSchema):
    slide = Integer(required=True, validate=validate.Range(min=0))


class NoteSchema(_SlideEvent):
    text = _text(5000, required=True)


class TaskSchema(_SlideEvent):
    text = _text(2000, required=True)


class TaskDoneSchema(_EventSchema):
    task_seq = Integer(required=True, validate=validate.Range(min=1))


class VerdictSchema(_EventSchema):
    slide = Integer(validate=validate.Range(min=0), allow_none=True)  # none: the whole deck
    value = fields.String(required=True, validate=validate.OneOf(VERDICTS))
    text = fields.String(validate=validate.Length(max=2000))


class TranscriptSchema(_EventSchema):
    slide = Integer(validate=validate.Range(min=0), allow_none=True)
    text = _text(20000, required=True)
    speaker = fields.String(validate=validate.Length(max=80))
    start = fields.Float(validate=validate.Range(min=0), allow_nan=False)
    end = fields.Float(validate=validate.Range(min=0), allow_nan=False)

    @validates_schema
    def end_after_start(self, data, **kwargs):
        if "start" in data and "end" in data and data["end"] < data["start"]:
            raise ValidationError("must not be before start", field_name="end")


EVENT_SCHEMAS = {
    "note": NoteSchema(),
    "task": TaskSchema(),
    "task_done": TaskDoneSchema(),
    "verdict": VerdictSchema(),
    "transcript": TranscriptSchema(),
}


class ScribbleSchema(Schema):
    image = fields.String(required=True)
    slide = Integer(required=True, validate=validate.Range(min=0))
    author = fields.String(validate=validate.Length(max=80))

"""Request schemas of the audio API. A field out of bounds or of the wrong type is
a 400 naming it."""

from marshmallow import Schema, fields, validate


class Number(fields.Float):
    """A JSON number: no strings or booleans, no NaN."""

    def __init__(self, **kwargs):
        super().__init__(allow_nan=False, **kwargs)

    def _validated(self, value):
        if isinstance(value, (bool, str)):
            raise self.make_error("invalid")
        return super()._validated(value)


class SpeechSchema(Schema):
    text = fields.String(required=True, validate=validate.Length(min=1, max=180))
    voiceId = fields.String(required=True, validate=validate.Length(min=1, max=120))
    locale = fields.String(validate=validate.Length(max=35))
    rate = Number(load_default=1.0, validate=validate.Range(min=0.5, max=2))
    pitch = Number(load_default=1.0, validate=validate.Range(min=0, max=2))
    volume = Number(load_default=1.0, validate=validate.Range(min=0, max=1))

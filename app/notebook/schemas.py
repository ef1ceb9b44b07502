"""marshmallow schemas: the request schemas validate bodies and query strings,
the response schemas shape answers; /openapi.json is generated from both, so the
documentation is what the code checks. Unknown request fields are errors."""
import json

from marshmallow import Schema, ValidationError, fields, pre_load, validate, validates_schema

SOURCE_TYPES = ("upload", "link", "text")
STATUSES = ("new", "running", "completed", "failed", "canceled")
SORT_FIELDS = ("created", "updated", "title", "type")
NOTE_TYPES = ("human", "ai")

_id = fields.String(validate=validate.Length(min=1, max=100))


class _Strict(Schema):
    """Text fields are stripped of surrounding spaces before validation."""

    @pre_load
    def strip_strings(self, data, **kwargs):
        if isinstance(data, dict):
            return {k: v.strip() if isinstance(v, str) and k not in ("content",) else v
                    for k, v in data.items()}
        return data


# --------------------------------------------------------------------------- requests

class NotebookCreate(_Strict):
    name = fields.String(required=True, validate=validate.Length(min=1, max=200))
    description = fields.String(load_default="", validate=validate.Length(max=10000))


class NotebookUpdate(_Strict):
    name = fields.String(validate=validate.Length(min=1, max=200))
    description = fields.String(validate=validate.Length(max=10000))
    archived = fields.Boolean()

    @validates_schema
    def not_empty(self, data, **kwargs):
        if not data:
            raise ValidationError("give at least one of name, description, archived")


class NotebookListQuery(Schema):
    archived = fields.Boolean(metadata={"description": "only archived (true) or active (false) notebooks"})
    order_by = fields.String(load_default="updated desc", validate=validate.OneOf(
        ("updated desc", "updated asc", "created desc", "created asc", "name asc", "name desc")))


class SourceCreate(_Strict):
    type = fields.String(required=True, validate=validate.OneOf(SOURCE_TYPES))
    notebook_id = _id
    notebooks = fields.List(_id, validate=validate.Length(max=100))
    url = fields.String(validate=validate.Length(min=1, max=4096))
    content = fields.String(validate=validate.Length(min=1))
    title = fields.String(validate=validate.Length(max=500))
    async_processing = fields.Boolean(load_default=False)
    embed = fields.Boolean(load_default=True)
    delete_source = fields.Boolean(load_default=False,
                                   metadata={"description": "delete the uploaded file once processed"})
    transformations = fields.List(fields.String(), load_default=list,
                                  metadata={"description": "not available yet: must be empty"})

    @pre_load
    def form_values(self, data, **kwargs):
        """A multipart form carries `notebooks` as a JSON list in a string; blank
        form fields mean absent."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if not (isinstance(v, str) and v.strip() == "" and k != "content")}
        raw = data.get("notebooks")
        if isinstance(raw, str):
            try:
                data["notebooks"] = json.loads(raw)
            except ValueError:
                data["notebooks"] = [raw]  # a single id, as a plain form value
        return data

    @validates_schema
    def consistent(self, data, **kwargs):
        kind = data.get("type")
        if kind == "link" and not data.get("url"):
            raise ValidationError("is required for a link source", "url")
        if kind == "text" and not data.get("content"):
            raise ValidationError("is required for a text source", "content")
        if data.get("transformations"):
            raise ValidationError("transformations are not available yet", "transformations")


class SourceUpdate(_Strict):
    title = fields.String(validate=validate.Length(min=1, max=500))
    topics = fields.List(fields.String(validate=validate.Length(min=1, max=100)), validate=validate.Length(max=50))

    @validates_schema
    def not_empty(self, data, **kwargs):
        if not data:
            raise ValidationError("give at least one of title, topics")


class SourceListQuery(Schema):
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=100))
    offset = fields.Integer(load_default=0, validate=validate.Range(min=0, max=10_000_000))
    notebook_id = _id
    sort_by = fields.String(load_default="updated", validate=validate.OneOf(SORT_FIELDS))
    sort_order = fields.String(load_default="desc", validate=validate.OneOf(("asc", "desc")))


class NoteCreate(_Strict):
    title = fields.String(validate=validate.Length(max=500))
    content = fields.String(required=True, validate=validate.Length(min=1))
    note_type = fields.String(load_default="human", validate=validate.OneOf(NOTE_TYPES))
    notebook_id = fields.String(required=True, validate=validate.Length(min=1, max=100))

    @validates_schema
    def has_text(self, data, **kwargs):
        if not data.get("content", "").strip():
            raise ValidationError("must not be blank", "content")


class NoteUpdate(_Strict):
    title = fields.String(validate=validate.Length(max=500))
    content = fields.String(validate=validate.Length(min=1))
    note_type = fields.String(validate=validate.OneOf(NOTE_TYPES))

    @validates_schema
    def not_empty(self, data, **kwargs):
        if not data:
            raise ValidationError("give at least one of title, content, note_type")
        if "content" in data and not data["content"].strip():
            raise ValidationError("must not be blank", "content")


class NoteListQuery(Schema):
    notebook_id = _id


class CommandListQuery(Schema):
    status = fields.String(validate=validate.OneOf(STATUSES))
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=100))
    offset = fields.Integer(load_default=0, validate=validate.Range(min=0, max=10_000_000))


class SearchRequest(_Strict):
    query = fields.String(required=True, validate=validate.Length(min=1, max=1000))
    type = fields.String(load_default="text", validate=validate.OneOf(("text", "vector")))
    limit = fields.Integer(load_default=100, validate=validate.Range(min=1, max=1000))
    search_sources = fields.Boolean(load_default=True)
    search_notes = fields.Boolean(load_default=True)
    minimum_score = fields.Float(load_default=0.2, validate=validate.Range(min=-1, max=1), allow_nan=False,
                                 metadata={"description": "vector search: the lowest cosine similarity kept"})
    notebook_id = _id


# --------------------------------------------------------------------------- responses

class Error(Schema):
    detail = fields.String(required=True)
    field = fields.String()


class Health(Schema):
    status = fields.String(required=True)
    detail = fields.String()


class NotebookOut(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    description = fields.String(required=True)
    archived = fields.Boolean(required=True)
    created = fields.String(required=True)
    updated = fields.String(required=True)
    source_count = fields.Integer(required=True)
    note_count = fields.Integer(required=True)


class NotebookDeleted(Schema):
    deleted = fields.String(required=True)
    deleted_notes = fields.Integer(required=True)
    deleted_sources = fields.Integer(required=True)
    unlinked_sources = fields.Integer(required=True)


class Asset(Schema):
    file_name = fields.String(allow_none=True)
    url = fields.String(allow_none=True)


class SourceOut(Schema):
    id = fields.String(required=True)
    title = fields.String(required=True)
    type = fields.String(required=True)
    topics = fields.List(fields.String(), required=True)
    asset = fields.Nested(Asset, required=True)
    status = fields.String(required=True)
    command_id = fields.String(allow_none=True, required=True)
    error_message = fields.String(allow_none=True, required=True)
    embedded = fields.Boolean(required=True)
    embedded_chunks = fields.Integer(required=True)
    insights_count = fields.Integer(required=True)
    notebooks = fields.List(fields.String(), required=True)
    file_available = fields.Boolean(required=True)
    created = fields.String(required=True)
    updated = fields.String(required=True)


class SourceDetail(SourceOut):
    full_text = fields.String(required=True)
    chunk_count = fields.Integer(required=True)


class SourceQueued(Schema):
    id = fields.String(required=True)
    command_id = fields.String(required=True)
    status = fields.String(required=True)
    title = fields.String()


class SourceStatus(Schema):
    id = fields.String(required=True)
    status = fields.String(required=True)
    message = fields.String(required=True)
    command_id = fields.String(allow_none=True, required=True)
    error_message = fields.String(allow_none=True, required=True)
    processing_info = fields.Dict(allow_none=True, required=True)


class SourceDeleted(Schema):
    deleted = fields.String(required=True)
    chunks = fields.Integer(required=True)
    file_removed = fields.Boolean(required=True)
    canceled_command = fields.String(allow_none=True, required=True)


class NoteOut(Schema):
    id = fields.String(required=True)
    title = fields.String(required=True)
    content = fields.String(required=True)
    note_type = fields.String(required=True)
    notebook_id = fields.String(allow_none=True, required=True)
    embedded = fields.Boolean(required=True)
    created = fields.String(required=True)
    updated = fields.String(required=True)


class Deleted(Schema):
    deleted = fields.String(required=True)


class CommandOut(Schema):
    id = fields.String(required=True)
    type = fields.String(required=True)
    target = fields.String(required=True)
    status = fields.String(required=True, validate=validate.OneOf(STATUSES))
    progress = fields.Dict(allow_none=True, required=True)
    result = fields.Dict(allow_none=True, required=True)
    error_message = fields.String(allow_none=True, required=True)
    created = fields.String(required=True)
    updated = fields.String(required=True)


class CommandList(Schema):
    commands = fields.List(fields.Nested(CommandOut), required=True)
    total_count = fields.Integer(required=True)


class SearchHit(Schema):
    id = fields.String(required=True)
    parent_id = fields.String(required=True)
    type = fields.String(required=True)
    title = fields.String(required=True)
    score = fields.Float(required=True)
    relevance = fields.Float()
    similarity = fields.Float()
    matches = fields.List(fields.String(), required=True)


class SearchResponse(Schema):
    results = fields.List(fields.Nested(SearchHit), required=True)
    total_count = fields.Integer(required=True)
    search_type = fields.String(required=True)

"""marshmallow schemas: the request schemas validate bodies and query strings,
the response schemas shape answers; /openapi.json is generated from both, so the
documentation is what the code checks.

Unknown request fields: a field Open Notebook's API accepts on that request and we do
not use is declared with `ignored()` (its type still checked, then dropped, and the
OpenAPI document says so); any field neither API knows stays a 400 naming it
(docs/decisions/notebook.md)."""

import json

from marshmallow import Schema, ValidationError, fields, post_load, pre_load, validate, validates_schema

from app.notebook.core import podcast_profiles

SOURCE_TYPES = ("upload", "link", "text")
STATUSES = ("new", "running", "completed", "failed", "canceled")
SORT_FIELDS = ("created", "updated", "title", "type", "insights_count", "embedded")
NOTE_TYPES = ("human", "ai")

_id = fields.String(validate=validate.Length(min=1, max=100))


def refuse_nul(data, path=""):
    """A NUL character anywhere in a request's strings is a 400 naming its field: no
    text stored by either database may hold one (PostgreSQL's text cannot)."""
    if isinstance(data, str):
        if "\x00" in data:
            raise ValidationError({path or "_schema": ["must not contain NUL characters"]})
    elif isinstance(data, dict):
        for key, value in data.items():
            refuse_nul(key, path)
            refuse_nul(value, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for value in data:
            refuse_nul(value, path)


IGNORED = "ignored"


def ignored(field: fields.Field) -> fields.Field:
    """A field Open Notebook's API takes on this request and ours does not use: its
    type is checked like any field's (a wrong type is a 400), then it is dropped."""
    field.metadata = {
        **field.metadata,
        IGNORED: True,
        "description": "Open Notebook's field: accepted, checked and not used",
    }
    return field


class _Strict(Schema):
    """Text fields are stripped of surrounding spaces before validation; no string
    may hold a NUL character; fields declared with `ignored()` are dropped once checked."""

    @pre_load
    def strip_strings(self, data, **kwargs):
        refuse_nul(data)
        if isinstance(data, dict):
            return {k: v.strip() if isinstance(v, str) and k not in ("content",) else v for k, v in data.items()}
        return data

    @post_load
    def drop_ignored(self, data, **kwargs):
        return {key: value for key, value in data.items() if not self.fields[key].metadata.get(IGNORED)}


# --------------------------------------------------------------------------- requests


class NotebookCreate(_Strict):
    name = fields.String(required=True, validate=validate.Length(min=1, max=200))
    description = fields.String(load_default="", validate=validate.Length(max=10000))


class NotebookUpdate(_Strict):
    """Every field is optional and an empty body changes nothing (200), as in Open
    Notebook: its UI sends `{}` when a description is cleared."""

    name = fields.String(validate=validate.Length(min=1, max=200))
    description = fields.String(validate=validate.Length(max=10000))
    archived = fields.Boolean()


NOTEBOOK_ORDER_FIELDS = ("updated", "created", "name")


class NotebookListQuery(Schema):
    archived = fields.Boolean(metadata={"description": "only archived (true) or active (false) notebooks"})
    order_by = fields.String(
        load_default="updated desc",
        metadata={"description": "a field (updated, created, name) and a direction (asc, desc; asc when left out)"},
    )

    @validates_schema
    def known_order(self, data, **kwargs):
        words = data.get("order_by", "updated desc").lower().split()
        if (
            not 1 <= len(words) <= 2
            or words[0] not in NOTEBOOK_ORDER_FIELDS
            or words[1:] not in ([], ["asc"], ["desc"])
        ):
            raise ValidationError(
                "must be a field (updated, created, name) optionally followed by asc or desc", "order_by"
            )


class NotebookDeleteQuery(Schema):
    delete_exclusive_sources = fields.Boolean(
        load_default=False,
        metadata={
            "description": "also delete the sources that belong to this notebook only (else they are kept, "
            "in no notebook)"
        },
    )


class SourceCreate(_Strict):
    type = fields.String(required=True, validate=validate.OneOf(SOURCE_TYPES))
    notebook_id = _id
    notebooks = fields.List(_id, validate=validate.Length(max=100))
    url = fields.String(validate=validate.Length(min=1, max=4096))
    content = fields.String(validate=validate.Length(min=1))
    title = fields.String(validate=validate.Length(max=500))
    async_processing = fields.Boolean(load_default=False)
    embed = fields.Boolean(
        metadata={"description": "default: false when the setting default_embedding_option is never, else true"}
    )
    delete_source = fields.Boolean(
        load_default=False,
        metadata={"description": "delete the uploaded file once processed (also when auto_delete_files is yes)"},
    )
    file_path = fields.String(metadata={"description": "not taken: upload the file itself (multipart `file`)"})
    transformations = fields.List(
        fields.String(validate=validate.Length(min=1, max=100)),
        load_default=list,
        validate=validate.Length(max=20),
        metadata={
            "description": "transformation ids applied once the source is processed (insights, by the default model)"
        },
    )

    @pre_load
    def form_values(self, data, **kwargs):
        """A multipart form carries `notebooks` as a JSON list in a string; blank
        form fields mean absent."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if not (isinstance(v, str) and v.strip() == "" and k != "content")}
        for name in ("notebooks", "transformations"):
            raw = data.get(name)
            if isinstance(raw, str):
                try:
                    data[name] = json.loads(raw)
                except (ValueError, RecursionError):  # RecursionError: nested too deep (issue #32)
                    data[name] = [raw]  # a single id, as a plain form value
        return data

    @validates_schema
    def consistent(self, data, **kwargs):
        kind = data.get("type")
        if kind == "link" and not data.get("url"):
            raise ValidationError("is required for a link source", "url")
        if kind == "text" and not data.get("content"):
            raise ValidationError("is required for a text source", "content")
        if "file_path" in data:
            raise ValidationError(
                "this server does not read files from its own disk: upload the file as "
                "multipart/form-data (field `file`) to POST /sources",
                "file_path",
            )


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


_note_topics = ignored(fields.List(fields.String(), validate=validate.Length(max=100)))  # onb-mcp sends them


class NoteCreate(_Strict):
    title = fields.String(validate=validate.Length(max=500))
    topics = _note_topics
    content = fields.String(required=True, validate=validate.Length(min=1))
    note_type = fields.String(load_default="human", validate=validate.OneOf(NOTE_TYPES))
    notebook_id = fields.String(
        allow_none=True,
        validate=validate.Length(min=1, max=100),
        metadata={"description": "the notebook it belongs to; a note may belong to none"},
    )

    @validates_schema
    def has_text(self, data, **kwargs):
        if not data.get("content", "").strip():
            raise ValidationError("must not be blank", "content")


class NoteUpdate(_Strict):
    title = fields.String(validate=validate.Length(max=500))
    content = fields.String(validate=validate.Length(min=1))
    note_type = fields.String(validate=validate.OneOf(NOTE_TYPES))
    topics = _note_topics

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


class SettingsUpdate(_Strict):
    """Open Notebook's settings; null (or left out) keeps the value (its Python client
    sends every field, null included)."""

    default_content_processing_engine_doc = fields.String(
        allow_none=True, validate=validate.OneOf(("auto", "docling", "simple"))
    )
    default_content_processing_engine_url = fields.String(
        allow_none=True, validate=validate.OneOf(("auto", "firecrawl", "jina", "crawl4ai", "simple"))
    )
    default_embedding_option = fields.String(allow_none=True, validate=validate.OneOf(("ask", "always", "never")))
    auto_delete_files = fields.String(allow_none=True, validate=validate.OneOf(("yes", "no")))
    docling_ocr = fields.Boolean(allow_none=True)
    docling_formulas = fields.Boolean(allow_none=True)
    docling_vision = fields.Boolean(allow_none=True)
    youtube_preferred_languages = fields.List(
        fields.String(validate=validate.Length(min=1, max=20)), allow_none=True, validate=validate.Length(max=50)
    )


class SettingsOut(Schema):
    default_content_processing_engine_doc = fields.String(required=True)
    default_content_processing_engine_url = fields.String(required=True)
    default_embedding_option = fields.String(required=True)
    auto_delete_files = fields.String(required=True)
    docling_ocr = fields.Boolean(required=True)
    docling_formulas = fields.Boolean(required=True)
    docling_vision = fields.Boolean(required=True)
    youtube_preferred_languages = fields.List(fields.String(), required=True)


class EmbedRequest(_Strict):
    item_id = fields.String(required=True, validate=validate.Length(min=1, max=100))
    item_type = fields.String(required=True, validate=validate.OneOf(("source", "note")))
    async_processing = fields.Boolean(
        load_default=False, metadata={"description": "answer at once (else wait for the job, like a source add)"}
    )

    @pre_load
    def lower_type(self, data, **kwargs):
        """Open Notebook takes the type in any case."""
        if isinstance(data, dict) and isinstance(data.get("item_type"), str):
            return {**data, "item_type": data["item_type"].strip().lower()}
        return data


class EmbedOut(Schema):
    success = fields.Boolean(required=True)
    message = fields.String(required=True)
    item_id = fields.String(required=True)
    item_type = fields.String(required=True)
    command_id = fields.String(allow_none=True, required=True)


class RebuildRequest(_Strict):
    mode = fields.String(
        validate=validate.OneOf(("existing", "all")),
        metadata={
            "description": "existing (default of /embeddings/rebuild): what has vectors of another model; all "
            "(default of /rebuild): also what has none. What has the configured model's vectors is not embedded again"
        },
    )
    include_sources = fields.Boolean(load_default=True)
    include_notes = fields.Boolean(load_default=True)
    include_insights = ignored(fields.Boolean())
    notebook_id = fields.String(
        validate=validate.Length(min=1, max=100),
        metadata={"description": "only this notebook's sources and notes (onb-mcp's /rebuild sends it)"},
    )


class RebuildOut(Schema):
    command_id = fields.String(required=True)
    total_items = fields.Integer(required=True)
    estimated_items = fields.Integer(required=True, metadata={"description": "the same (the UI's name)"})
    message = fields.String(required=True)


class RebuildStatus(Schema):
    command_id = fields.String(required=True)
    status = fields.String(required=True, validate=validate.OneOf(("queued", "running", "completed", "failed")))
    progress = fields.Dict(allow_none=True, required=True)
    stats = fields.Dict(allow_none=True, required=True)
    started_at = fields.String(allow_none=True, required=True)
    completed_at = fields.String(allow_none=True, required=True)
    error_message = fields.String(allow_none=True, required=True)


class RecentlyViewedQuery(Schema):
    limit = fields.Integer(load_default=12, validate=validate.Range(min=1, max=50))


class RecentlyViewed(Schema):
    type = fields.String(required=True, validate=validate.OneOf(("notebook", "source")))
    id = fields.String(required=True)
    title = fields.String(required=True)
    last_viewed_at = fields.String(required=True)


class NotebookDeletePreview(Schema):
    notebook_id = fields.String(required=True)
    notebook_name = fields.String(required=True)
    note_count = fields.Integer(required=True)
    exclusive_source_count = fields.Integer(required=True)
    shared_source_count = fields.Integer(required=True)


class LinkChanged(Schema):
    message = fields.String(required=True)
    notebook_id = fields.String(required=True)
    source_id = fields.String(required=True)


class SearchRequest(_Strict):
    query = fields.String(required=True, validate=validate.Length(min=1, max=1000))
    type = fields.String(load_default="text", validate=validate.OneOf(("text", "vector")))
    limit = fields.Integer(load_default=100, validate=validate.Range(min=1, max=1000))
    search_sources = fields.Boolean(load_default=True)
    search_notes = fields.Boolean(load_default=True)
    minimum_score = fields.Float(
        load_default=0.2,
        validate=validate.Range(min=-1, max=1),
        allow_nan=False,
        metadata={"description": "vector search: the lowest cosine similarity kept"},
    )
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
    message = fields.String(required=True)
    deleted = fields.String(required=True)
    deleted_notes = fields.Integer(required=True)
    deleted_sources = fields.Integer(required=True)
    unlinked_sources = fields.Integer(required=True)
    deleted_chat_sessions = fields.Integer(required=True)
    kept_sources = fields.Integer(
        required=True,
        metadata={"description": "sources that belonged to this notebook only and were kept (in no notebook now)"},
    )


class Asset(Schema):
    file_path = fields.String(allow_none=True, metadata={"description": "the uploaded file's name"})
    file_name = fields.String(allow_none=True, metadata={"description": "the same (earlier name of the field)"})
    url = fields.String(allow_none=True)


class SourceOut(Schema):
    id = fields.String(required=True)
    title = fields.String(required=True)
    type = fields.String(required=True)
    topics = fields.List(fields.String(), required=True)
    asset = fields.Nested(Asset, allow_none=True, required=True, metadata={"description": "null for a text source"})
    status = fields.String(
        allow_none=True,
        required=True,
        metadata={"description": "new, running, completed, failed, canceled; null in the answer of a synchronous add"},
    )
    command_id = fields.String(
        allow_none=True,
        required=True,
        metadata={"description": "its processing job; null in the answer of a synchronous add"},
    )
    error_message = fields.String(allow_none=True, required=True)
    embedded = fields.Boolean(required=True)
    embedded_chunks = fields.Integer(required=True)
    insights_count = fields.Integer(required=True)
    notebooks = fields.List(fields.String(), required=True)
    file_available = fields.Boolean(required=True)
    created = fields.String(required=True)
    updated = fields.String(required=True)


class SourceDetail(SourceOut):
    full_text = fields.String(allow_none=True, required=True)
    chunk_count = fields.Integer(required=True)


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
    job_id = fields.String(required=True, metadata={"description": "the same id (Open Notebook's name)"})
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


# --------------------------------------------------------------------------- models, credentials

PROVIDERS = ("openai", "openai_compatible", "ollama", "anthropic")
MODEL_TYPES = ("language", "embedding", "text_to_speech", "speech_to_text")
DEFAULT_KEYS = (
    "default_chat_model",
    "default_transformation_model",
    "large_context_model",
    "default_embedding_model",
    "default_text_to_speech_model",
    "default_speech_to_text_model",
    "default_tools_model",
)
_url = fields.String(validate=[validate.Length(max=2048), validate.URL(schemes={"http", "https"}, require_tld=False)])
_model_ref = fields.String(
    allow_none=True,
    validate=validate.Length(min=1, max=100),
    metadata={"description": "a model id (model:<key>) that overrides the default"},
)


_modalities = fields.List(
    fields.String(validate=validate.OneOf(MODEL_TYPES)),
    validate=validate.Length(max=4),
    metadata={"description": "what the credential is for: language, embedding, text_to_speech, speech_to_text"},
)


def _other_text() -> fields.Field:
    return ignored(fields.String(allow_none=True, validate=validate.Length(max=2048)))


class _OpenNotebookCredentialFields(_Strict):
    """Ollama's context window, and the fields of Open Notebook's credential for
    providers we do not serve (Azure's endpoints, Vertex's project)."""

    num_ctx = fields.Integer(
        allow_none=True,
        strict=True,
        validate=validate.Range(min=0, max=10_000_000),
        metadata={
            "description": "an Ollama credential's context window, sent as options.num_ctx; 0 or null: the "
            "server's default"
        },
    )

    endpoint = _other_text()
    api_version = _other_text()
    endpoint_llm = _other_text()
    endpoint_embedding = _other_text()
    endpoint_stt = _other_text()
    endpoint_tts = _other_text()
    project = _other_text()
    location = _other_text()
    credentials_path = _other_text()


class CredentialCreate(_OpenNotebookCredentialFields):
    name = fields.String(required=True, validate=validate.Length(min=1, max=200))
    provider = fields.String(required=True, validate=validate.OneOf(PROVIDERS))
    api_key = fields.String(validate=validate.Length(min=1, max=2000))
    base_url = _url
    modalities = _modalities

    @validates_schema
    def compatible_needs_url(self, data, **kwargs):
        if data.get("provider") == "openai_compatible" and not data.get("base_url"):
            raise ValidationError("is required for an openai_compatible provider", "base_url")


class CredentialUpdate(_OpenNotebookCredentialFields):
    name = fields.String(validate=validate.Length(min=1, max=200))
    api_key = fields.String(
        allow_none=True,
        validate=validate.Length(min=1, max=2000),
        metadata={"description": "null removes the stored key"},
    )
    base_url = fields.String(
        allow_none=True,
        validate=[validate.Length(max=2048), validate.URL(schemes={"http", "https"}, require_tld=False)],
    )
    modalities = _modalities

    @validates_schema
    def not_empty(self, data, **kwargs):
        if not data:
            raise ValidationError("give at least one of name, api_key, base_url, modalities, num_ctx")


class CredentialListQuery(Schema):
    provider = fields.String(validate=validate.OneOf(PROVIDERS))


class CredentialDeleteQuery(Schema):
    delete_models = fields.Boolean(
        metadata={
            "description": "delete the models registered under it with it (the default; false refuses, 409, "
            "while there are any)"
        }
    )
    migrate_to = fields.String(
        validate=validate.Length(min=1, max=100),
        metadata={"description": "another credential of the same provider that takes over its models"},
    )
    force = fields.Boolean(metadata={"description": "the same as delete_models (our earlier name)"})

    @validates_schema
    def one_choice(self, data, **kwargs):
        if data.get("migrate_to") and (data.get("delete_models") or data.get("force")):
            raise ValidationError("give delete_models or migrate_to, not both", "migrate_to")


class ModelChoice(_Strict):
    """One model to register: Open Notebook's UI sends {name, provider, model_type},
    our earlier clients {name, type}."""

    name = fields.String(required=True, validate=validate.Length(min=1, max=300))
    type = fields.String(validate=validate.OneOf(MODEL_TYPES))
    model_type = fields.String(validate=validate.OneOf(MODEL_TYPES), metadata={"description": "the same as type"})
    provider = fields.String(
        validate=validate.OneOf(PROVIDERS), metadata={"description": "the credential's provider (any other is a 400)"}
    )

    @validates_schema
    def one_type(self, data, **kwargs):
        if "type" in data and "model_type" in data and data["type"] != data["model_type"]:
            raise ValidationError("differs from type: give one of them", "model_type")

    @post_load
    def merged_type(self, data, **kwargs):
        data["type"] = data.pop("model_type", None) or data.get("type") or "language"
        return data


class RegisterModels(_Strict):
    models = fields.List(fields.Nested(ModelChoice), required=True, validate=validate.Length(min=1, max=500))


class ModelCreate(_Strict):
    name = fields.String(required=True, validate=validate.Length(min=1, max=300))
    provider = fields.String(required=True, validate=validate.OneOf(PROVIDERS))
    type = fields.String(required=True, validate=validate.OneOf(MODEL_TYPES))
    credential = fields.String(allow_none=True, validate=validate.Length(min=1, max=100))


class ModelListQuery(Schema):
    type = fields.String(validate=validate.OneOf(MODEL_TYPES))
    provider = fields.String(validate=validate.OneOf(PROVIDERS))


class DefaultsUpdate(_Strict):
    default_chat_model = _model_ref
    default_transformation_model = _model_ref
    large_context_model = _model_ref
    default_embedding_model = _model_ref
    default_text_to_speech_model = _model_ref
    default_speech_to_text_model = _model_ref
    default_tools_model = _model_ref

    @validates_schema
    def not_empty(self, data, **kwargs):
        if not data:
            raise ValidationError("give at least one default: " + ", ".join(DEFAULT_KEYS))


class CredentialOut(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    provider = fields.String(required=True)
    base_url = fields.String(allow_none=True, required=True)
    modalities = fields.List(fields.String(), required=True)
    num_ctx = fields.Integer(allow_none=True, required=True)
    has_api_key = fields.Boolean(required=True)
    decryption_error = fields.String(
        allow_none=True,
        required=True,
        metadata={"description": "why the stored key cannot be decrypted (another NOTEBOOK_ENCRYPTION_KEY), else null"},
    )
    model_count = fields.Integer(required=True)
    created = fields.String(required=True)
    updated = fields.String(required=True)


class CredentialDeleted(Schema):
    message = fields.String(required=True)
    deleted = fields.String(required=True)
    deleted_models = fields.Integer(required=True)
    migrated_models = fields.Integer(required=True)


class CredentialTest(Schema):
    provider = fields.String(required=True)
    success = fields.Boolean(required=True)
    message = fields.String(required=True)


class DiscoveredModel(Schema):
    name = fields.String(required=True)
    provider = fields.String(required=True)
    model_type = fields.String(
        required=True, metadata={"description": "the type its name suggests (the register call may say otherwise)"}
    )
    description = fields.String(allow_none=True, required=True)
    registered = fields.Boolean(required=True, metadata={"description": "already registered under this credential"})


class Discovered(Schema):
    provider = fields.String(required=True)
    credential_id = fields.String(required=True)
    discovered = fields.List(fields.Nested(DiscoveredModel), required=True)


class ModelOut(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    provider = fields.String(required=True)
    type = fields.String(required=True)
    credential = fields.String(allow_none=True, required=True)
    created = fields.String(required=True)
    updated = fields.String(required=True)


class Registered(Schema):
    created = fields.Integer(required=True)
    existing = fields.Integer(required=True)
    models = fields.List(fields.Nested(ModelOut), required=True)


_SOURCES = ("database", "environment", "none")


class ProviderStatus(Schema):
    configured = fields.Boolean(required=True)
    source = fields.String(required=True, validate=validate.OneOf(_SOURCES))
    credentials = fields.Integer(required=True)


class CredentialsStatus(Schema):
    configured = fields.Dict(keys=fields.String(), values=fields.Boolean(), required=True)
    source = fields.Dict(keys=fields.String(), values=fields.String(validate=validate.OneOf(_SOURCES)), required=True)
    encryption_configured = fields.Boolean(required=True)
    providers = fields.Dict(
        keys=fields.String(),
        values=fields.Nested(ProviderStatus),
        required=True,
        metadata={"description": "the same per provider, with how many credentials it has"},
    )


# GET /credentials/env-status: {provider: whether its environment variables configure it}.
EnvStatus = {"type": "object", "additionalProperties": {"type": "boolean"}}


class ProviderInfo(Schema):
    name = fields.String(required=True)
    display_name = fields.String(required=True)
    modalities = fields.List(fields.String(), required=True)
    docs_url = fields.String(allow_none=True, required=True)
    env_configured = fields.Boolean(required=True)


class Capabilities(Schema):
    docling_available = fields.Boolean(required=True)
    crawl4ai_available = fields.Boolean(required=True)
    crawl4ai_remote_configured = fields.Boolean(required=True)


class AutoAssigned(Schema):
    assigned = fields.Dict(keys=fields.String(), values=fields.String(), required=True)
    skipped = fields.List(fields.String(), required=True, metadata={"description": "defaults set already"})
    missing = fields.List(fields.String(), required=True, metadata={"description": "no model of the type"})


class ModelTested(Schema):
    success = fields.Boolean(required=True)
    message = fields.String(required=True)
    details = fields.String(allow_none=True)


class Migrated(Schema):
    message = fields.String(required=True)
    not_configured = fields.List(fields.String(), required=True)
    migrated = fields.List(fields.String(), required=True)
    skipped = fields.List(fields.String(), required=True)
    errors = fields.List(fields.String(), required=True)
    credentials = fields.List(fields.Nested(CredentialOut), required=True)


class Defaults(Schema):
    default_chat_model = fields.String(allow_none=True, required=True)
    default_transformation_model = fields.String(allow_none=True, required=True)
    large_context_model = fields.String(allow_none=True, required=True)
    default_embedding_model = fields.String(allow_none=True, required=True)
    default_text_to_speech_model = fields.String(allow_none=True, required=True)
    default_speech_to_text_model = fields.String(allow_none=True, required=True)
    default_tools_model = fields.String(allow_none=True, required=True)


# --------------------------------------------------------------------------- transformations, insights


class TransformationCreate(_Strict):
    name = fields.String(required=True, validate=validate.Length(min=1, max=200))
    title = fields.String(load_default="", validate=validate.Length(max=500))
    description = fields.String(load_default="", validate=validate.Length(max=10000))
    prompt = fields.String(
        required=True,
        validate=validate.Length(min=1, max=100_000),
        metadata={"description": "sent to the model as it is (never a template)"},
    )
    apply_default = fields.Boolean(load_default=False)
    model_id = _model_ref


class TransformationUpdate(_Strict):
    name = fields.String(validate=validate.Length(min=1, max=200))
    title = fields.String(validate=validate.Length(max=500))
    description = fields.String(validate=validate.Length(max=10000))
    prompt = fields.String(validate=validate.Length(min=1, max=100_000))
    apply_default = fields.Boolean()
    model_id = fields.String(
        allow_none=True,
        validate=validate.Length(min=1, max=100),
        metadata={"description": "the model that runs it; null: the default"},
    )

    @validates_schema
    def not_empty(self, data, **kwargs):
        if not data:
            raise ValidationError("give at least one of name, title, description, prompt, apply_default, model_id")


class TransformationExecute(_Strict):
    transformation_id = fields.String(required=True, validate=validate.Length(min=1, max=100))
    input_text = fields.String(required=True, validate=validate.Length(min=1))
    model_id = _model_ref


class InsightCreate(_Strict):
    transformation_id = fields.String(required=True, validate=validate.Length(min=1, max=100))
    model_id = _model_ref


class TransformationOut(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    title = fields.String(required=True)
    description = fields.String(required=True)
    prompt = fields.String(required=True)
    apply_default = fields.Boolean(required=True)
    model_id = fields.String(allow_none=True, required=True)
    created = fields.String(required=True)
    updated = fields.String(required=True)


class TransformationExecuted(Schema):
    output = fields.String(required=True)
    transformation_id = fields.String(required=True)
    model_id = fields.String(required=True)


class InsightOut(Schema):
    id = fields.String(required=True)
    source_id = fields.String(required=True)
    transformation_id = fields.String(allow_none=True, required=True)
    insight_type = fields.String(required=True)
    content = fields.String(required=True)
    model = fields.String(required=True)
    created = fields.String(required=True)
    updated = fields.String(required=True)


class InsightQueued(Schema):
    status = fields.String(required=True, metadata={"description": "pending (as Open Notebook answers)"})
    message = fields.String(required=True)
    command_id = fields.String(required=True)
    source_id = fields.String(required=True)
    transformation_id = fields.String(required=True)
    model_id = fields.String(required=True)


# --------------------------------------------------------------------------- chat, ask


class ChatSessionCreate(_Strict):
    notebook_id = _id
    title = fields.String(load_default="", validate=validate.Length(max=500))
    model_override = _model_ref


class ChatSessionUpdate(_Strict):
    title = fields.String(validate=validate.Length(max=500))
    model_override = _model_ref

    @validates_schema
    def not_empty(self, data, **kwargs):
        if not data:
            raise ValidationError("give at least one of title, model_override")


class ChatSessionQuery(Schema):
    notebook_id = _id


class ContextConfig(Schema):
    sources = fields.Dict(keys=fields.String(validate=validate.Length(max=100)), values=fields.String())
    notes = fields.Dict(keys=fields.String(validate=validate.Length(max=100)), values=fields.String())


class ChatContextRequest(_Strict):
    notebook_id = fields.String(required=True, validate=validate.Length(min=1, max=100))
    context_config = fields.Nested(
        ContextConfig,
        metadata={
            "description": "per id: 'full content' (default), 'insights', or 'not in context' ('not in', as Open "
            "Notebook's UI sends it)"
        },
    )


class NotebookContextRequest(_Strict):
    """Open Notebook's POST /notebooks/{id}/context (its Python client's): answered from
    the same context as /chat/context/build."""

    notebook_id = fields.String(
        validate=validate.Length(min=1, max=100), metadata={"description": "the path's (its client repeats it)"}
    )
    context_config = fields.Nested(
        ContextConfig, allow_none=True, metadata={"description": "per id: its mode; without it, every item in full"}
    )


class NotebookContextOut(Schema):
    notebook_id = fields.String(required=True)
    sources = fields.List(fields.Dict(), required=True)
    notes = fields.List(fields.Dict(), required=True)
    total_tokens = fields.Integer(required=True)
    char_count = fields.Integer(required=True)


class ContextItem(Schema):
    id = fields.String(required=True)
    title = fields.String(load_default="")
    content = fields.String(required=True)
    mode = fields.String()
    chars = fields.Integer()
    truncated = fields.Boolean()


class ChatContext(Schema):
    sources = fields.List(fields.Nested(ContextItem), load_default=list)
    notes = fields.List(fields.Nested(ContextItem), load_default=list)


class ChatExecute(_Strict):
    session_id = fields.String(required=True, validate=validate.Length(min=1, max=100))
    message = fields.String(required=True, validate=validate.Length(min=1, max=100_000))
    context = fields.Nested(
        ChatContext, metadata={"description": "as /chat/context/build answers it; default: the session's notebook"}
    )
    model_override = _model_ref
    stream = fields.Boolean(load_default=False)

    @validates_schema
    def has_text(self, data, **kwargs):
        if not data.get("message", "").strip():
            raise ValidationError("must not be blank", "message")


class SourceChatCreate(_Strict):
    source_id = fields.String(
        validate=validate.Length(min=1, max=100),
        metadata={
            "description": "the path's source again (Open Notebook's UI sends its key): another source is a 400, "
            "an unknown one 404"
        },
    )
    title = fields.String(validate=validate.Length(max=500))
    model_override = _model_ref


class SourceChatUpdate(ChatSessionUpdate):
    pass


class SourceChatMessage(_Strict):
    message = fields.String(required=True, validate=validate.Length(min=1, max=100_000))
    model_override = _model_ref

    @validates_schema
    def has_text(self, data, **kwargs):
        if not data.get("message", "").strip():
            raise ValidationError("must not be blank", "message")


class AskAnswer(Schema):
    answer = fields.String(required=True)
    question = fields.String(required=True)


class AskRequest(_Strict):
    question = fields.String(required=True, validate=validate.Length(min=1, max=10_000))
    strategy_model = _model_ref
    answer_model = _model_ref
    final_answer_model = _model_ref
    notebook_id = _id

    @validates_schema
    def has_text(self, data, **kwargs):
        if not data.get("question", "").strip():
            raise ValidationError("must not be blank", "question")


class ChatMessageOut(Schema):
    id = fields.String(required=True)
    type = fields.String(required=True)
    content = fields.String(required=True)
    timestamp = fields.String(required=True)


class ChatSessionOut(Schema):
    id = fields.String(required=True)
    title = fields.String(required=True)
    notebook_id = fields.String(allow_none=True, required=True)
    source_id = fields.String(
        allow_none=True, required=True, metadata={"description": "the source of a source chat session, else null"}
    )
    model_override = fields.String(allow_none=True, required=True)
    message_count = fields.Integer(required=True)
    created = fields.String(required=True)
    updated = fields.String(required=True)
    messages = fields.List(fields.Nested(ChatMessageOut))


class ContextIndicators(Schema):
    sources = fields.List(fields.String(), required=True)
    insights = fields.List(fields.String(), required=True)
    notes = fields.List(fields.String(), required=True)


class SourceChatSessionOut(ChatSessionOut):
    context_indicators = fields.Nested(
        ContextIndicators,
        allow_none=True,
        metadata={"description": "with the messages: what the context holds (ids), null before the first message"},
    )


class SourceChatDeleted(Schema):
    success = fields.Boolean(required=True)
    message = fields.String(required=True)
    deleted = fields.String(required=True)


class DefaultPrompt(_Strict):
    transformation_instructions = fields.String(
        required=True,
        validate=validate.Length(max=100_000),
        metadata={"description": "put before every transformation's prompt (empty: nothing)"},
    )


class ConfigOut(Schema):
    version = fields.String(required=True)
    latestVersion = fields.String(allow_none=True, required=True)  # Open Notebook's field names (camelCase)
    hasUpdate = fields.Boolean(required=True)
    dbStatus = fields.String(required=True, validate=validate.OneOf(("online", "offline")))


class AuthStatus(Schema):
    auth_enabled = fields.Boolean(required=True)
    message = fields.String(required=True)


class ChatReply(Schema):
    session_id = fields.String(required=True)
    model_id = fields.String(required=True)
    messages = fields.List(fields.Nested(ChatMessageOut), required=True)


class ChatContextOut(Schema):
    notebook_id = fields.String(required=True)
    context = fields.Nested(ChatContext, required=True)
    char_count = fields.Integer(required=True)
    token_count = fields.Integer(required=True)


# --------------------------------------------------------------------------- podcasts


class PodcastCreate(_Strict):
    """Ours (`notebook_id`, `speakers`, `length`) or Open Notebook's (`episode_profile`,
    `speaker_profile` and the material as `content`): a profile stands for a length or
    a number of speakers (app.notebook.core.podcast_profiles), and overrides them."""

    notebook_id = fields.String(validate=validate.Length(min=1, max=100))
    episode_name = fields.String(required=True, validate=validate.Length(min=1, max=200))
    speakers = fields.Integer(
        load_default=podcast_profiles.DEFAULT_SPEAKERS,
        strict=True,
        validate=validate.Range(min=1, max=podcast_profiles.MAX_SPEAKERS),
    )
    length = fields.String(load_default="short", validate=validate.OneOf(podcast_profiles.LENGTHS))
    model_id = _model_ref
    episode_profile = fields.String(
        validate=validate.Length(min=1, max=100), metadata={"description": "an episode profile's id or name"}
    )
    speaker_profile = fields.String(
        validate=validate.Length(min=1, max=100), metadata={"description": "a speaker profile's id or name"}
    )
    content = fields.String(
        validate=validate.Length(min=1),
        metadata={"description": "the material to talk about, instead of a notebook's sources and notes"},
    )
    briefing_suffix = fields.String(
        allow_none=True,
        validate=validate.Length(max=10000),
        metadata={"description": "instructions for this episode, added to the script's prompt"},
    )

    @validates_schema
    def material_and_profiles(self, data, **kwargs):
        if not data.get("notebook_id") and not data.get("content"):
            raise ValidationError("give a notebook_id or the content to talk about", "notebook_id")
        if "episode_profile" in data and podcast_profiles.length_of(data["episode_profile"]) is None:
            known = ", ".join(podcast_profiles.LENGTHS)
            raise ValidationError(f"unknown episode profile; known: {known}", "episode_profile")
        if "speaker_profile" in data and podcast_profiles.speakers_of(data["speaker_profile"]) is None:
            raise ValidationError("unknown speaker profile (GET /speaker-profiles lists them)", "speaker_profile")

    @post_load
    def profiles_to_knobs(self, data, **kwargs):
        if "episode_profile" in data:
            data["length"] = podcast_profiles.length_of(data.pop("episode_profile"))
        if "speaker_profile" in data:
            data["speakers"] = podcast_profiles.speakers_of(data.pop("speaker_profile"))
        return data


class Queued(Schema):
    job_id = fields.String(required=True)
    command_id = fields.String(required=True)
    message = fields.String(required=True)


class PodcastQueued(Schema):
    command_id = fields.String(required=True)
    job_id = fields.String(required=True, metadata={"description": "Open Notebook's name for command_id"})
    episode_id = fields.String(required=True)
    episode_name = fields.String(required=True)
    episode_profile = fields.String(required=True, metadata={"description": "the episode profile (its length)"})
    model_id = fields.String(required=True)
    status = fields.String(required=True)
    message = fields.String(required=True)


class TurnOut(Schema):
    speaker = fields.String(required=True)
    text = fields.String(required=True)


class SpeakerOut(Schema):
    name = fields.String(required=True)
    voice_id = fields.String(required=True)
    backstory = fields.String(required=True)
    personality = fields.String(required=True)


class SpeakerProfileOut(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    description = fields.String(required=True)
    voice_model = fields.String(required=True, metadata={"description": "the text_to_speech default, or espeak-ng"})
    speakers = fields.List(fields.Nested(SpeakerOut), required=True)


class EpisodeProfileOut(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True, metadata={"description": "the episode's length"})
    description = fields.String(required=True)
    speaker_config = fields.String(required=True)
    speaker_config_name = fields.String(required=True)
    outline_llm = fields.String(allow_none=True, required=True)
    transcript_llm = fields.String(allow_none=True, required=True)
    language = fields.String(required=True)
    default_briefing = fields.String(required=True)
    num_segments = fields.Integer(required=True)
    max_tokens = fields.Integer(allow_none=True, required=True)


class LanguageOut(Schema):
    code = fields.String(required=True)
    name = fields.String(required=True)


class EpisodeOut(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    notebook_id = fields.String(allow_none=True, required=True)
    speakers = fields.Integer(required=True)
    length = fields.String(required=True)
    command_id = fields.String(allow_none=True, required=True)
    job_status = fields.String(
        allow_none=True,
        required=True,
        metadata={"description": "Open Notebook's words: submitted, running, completed, failed"},
    )
    error_message = fields.String(allow_none=True, required=True)
    transcript = fields.List(fields.Nested(TurnOut), allow_none=True, required=True)
    audio_available = fields.Boolean(required=True)
    audio_url = fields.String(allow_none=True, required=True, metadata={"description": "the MP3's path, once made"})
    briefing = fields.String(required=True)
    episode_profile = fields.Nested(EpisodeProfileOut, required=True)
    speaker_profile = fields.Nested(SpeakerProfileOut, required=True)
    created = fields.String(required=True)
    updated = fields.String(required=True)

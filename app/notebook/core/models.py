"""The notebook's data (peewee): notebooks, sources (linked to notebooks), their
chunks with embeddings, notes, commands (background jobs) and the full-text index.

Primary keys are random 20-character strings; the API shows them as
`<table>:<key>` (see ids.py). Timestamps are naive UTC.
"""

from datetime import UTC, datetime

from peewee import (
    AutoField,
    BlobField,
    BooleanField,
    CharField,
    DatabaseProxy,
    DateTimeField,
    ForeignKeyField,
    IntegerField,
    Model,
    SqliteDatabase,
    TextField,
)

from app.common.db import JSONField
from app.common.db import write_transaction as common_write_transaction

database = DatabaseProxy()


def now():
    return datetime.now(UTC).replace(tzinfo=None)


class BaseModel(Model):
    class Meta:
        database = database


class Notebook(BaseModel):
    id = CharField(primary_key=True, max_length=20)
    name = CharField(max_length=200)
    # Lower case, for sorting by name. Not unique: two notebooks may share a name, as in
    # Open Notebook (unique until schema step 6).
    name_key = CharField(index=True)
    description = TextField(default="")
    archived = BooleanField(default=False)
    created = DateTimeField(default=now)
    updated = DateTimeField(default=now, index=True)
    last_viewed_at = DateTimeField(null=True, index=True)  # GET /notebooks/{id} stamps it (/recently-viewed)


class Source(BaseModel):
    id = CharField(primary_key=True, max_length=20)
    kind = CharField(max_length=10)  # upload | link | text
    title = CharField(max_length=500, default="")
    url = TextField(null=True)  # link sources
    file_name = CharField(null=True)  # the stored basename under DATA_DIR/uploads
    original_name = CharField(null=True)  # as the client sent it (shown, never used as a path)
    content_type = CharField(null=True)
    full_text = TextField(default="")
    topics = JSONField(default=list)
    status = CharField(max_length=10, default="new", index=True)  # new|running|completed|failed|canceled
    error_message = TextField(null=True)
    command_id = CharField(null=True)  # the last processing command (key only)
    embed = BooleanField(default=True)
    delete_file = BooleanField(default=False)  # delete_source: drop the file once processed
    created = DateTimeField(default=now, index=True)
    updated = DateTimeField(default=now, index=True)
    last_viewed_at = DateTimeField(null=True, index=True)  # GET /sources/{id} stamps it (/recently-viewed)


class SourceNotebook(BaseModel):
    source = ForeignKeyField(Source, backref="links", on_delete="CASCADE")
    notebook = ForeignKeyField(Notebook, backref="links", on_delete="CASCADE")

    class Meta:
        indexes = ((("source", "notebook"), True), (("notebook",), False))


class Chunk(BaseModel):
    id = AutoField()
    source = ForeignKeyField(Source, backref="chunks", on_delete="CASCADE")
    ordinal = IntegerField()
    text = TextField()
    # The vector, float32 little-endian, and the model that made it: vectors of
    # another model (or dimension) are never compared with a query's.
    embedding = BlobField(null=True)
    embedding_model = CharField(null=True, index=True)
    embedding_dim = IntegerField(null=True)


class Note(BaseModel):
    id = CharField(primary_key=True, max_length=20)
    title = CharField(max_length=500, default="")
    content = TextField()
    note_type = CharField(max_length=10, default="human")  # human | ai
    notebook = ForeignKeyField(Notebook, backref="notes", on_delete="CASCADE", null=True)
    embedding = BlobField(null=True)
    embedding_model = CharField(null=True, index=True)
    embedding_dim = IntegerField(null=True)
    created = DateTimeField(default=now, index=True)
    updated = DateTimeField(default=now)


class Command(BaseModel):
    id = CharField(primary_key=True, max_length=20)
    kind = CharField(max_length=30)  # process_source | embed_note
    target = CharField()  # the public id of what it works on
    status = CharField(max_length=10, default="new", index=True)  # new|running|completed|failed|canceled
    progress = JSONField(null=True)
    result = JSONField(null=True)
    error_message = TextField(null=True)
    created = DateTimeField(default=now, index=True)
    updated = DateTimeField(default=now)


class SearchDoc(BaseModel):
    """One row of the full-text index (search_fts has the same rowid): which
    parent (`source:…`, `note:…`) a piece of indexed text belongs to."""

    id = AutoField()
    parent = CharField(index=True)
    part = CharField(max_length=10)  # source | note


class Generation(BaseModel):
    """Counters that say "this changed": `vectors` is bumped in every transaction that
    adds, replaces or removes embeddings, so that a web worker knows when the vectors
    it holds in memory for vector search are stale (one tiny read per query)."""

    key = CharField(primary_key=True)
    value = IntegerField(default=0)


def bump_vectors():
    """Call inside the transaction that changes embeddings."""
    updated = Generation.update(value=Generation.value + 1).where(Generation.key == "vectors").execute()
    if not updated:
        Generation.insert(key="vectors", value=1).on_conflict_ignore().execute()


def vectors_generation():
    return Generation.select(Generation.value).where(Generation.key == "vectors").scalar() or 0


class Credential(BaseModel):
    """A provider's API key (Fernet-encrypted with NOTEBOOK_ENCRYPTION_KEY, never
    answered) and base URL."""

    id = CharField(primary_key=True, max_length=20)
    name = CharField(max_length=200)
    provider = CharField(max_length=30, index=True)
    base_url = TextField(null=True)
    api_key_encrypted = TextField(null=True)
    modalities = TextField(null=True)  # a JSON list: language, embedding, ... (null: none; schema step 2)
    num_ctx = IntegerField(null=True)  # an Ollama credential's context window (null: Ollama's default; step 4)
    created = DateTimeField(default=now, index=True)
    updated = DateTimeField(default=now)


class LanguageModel(BaseModel):
    """A registered model of a provider (`model:<key>`), language, embedding or speech."""

    id = CharField(primary_key=True, max_length=20)
    name = CharField(max_length=300)
    provider = CharField(max_length=30)
    type = CharField(max_length=20, index=True)
    credential = ForeignKeyField(Credential, null=True, backref="models", on_delete="SET NULL")
    created = DateTimeField(default=now, index=True)
    updated = DateTimeField(default=now)

    class Meta:
        table_name = "model"
        indexes = ((("provider", "name", "type"), False),)


class DefaultModel(BaseModel):
    """One row per default (default_chat_model, …): the model it names."""

    key = CharField(primary_key=True, max_length=40)
    model = ForeignKeyField(LanguageModel, null=True, on_delete="SET NULL")


class Transformation(BaseModel):
    id = CharField(primary_key=True, max_length=20)
    name = CharField(max_length=200)
    title = CharField(max_length=500, default="")
    description = TextField(default="")
    prompt = TextField()  # data sent to the model, never rendered as a template
    apply_default = BooleanField(default=False)
    # The model that runs it when a request names none (schema step 2); else the default.
    model = ForeignKeyField(LanguageModel, null=True, on_delete="SET NULL")
    created = DateTimeField(default=now, index=True)
    updated = DateTimeField(default=now)


class Insight(BaseModel):
    """What a transformation made of a source."""

    id = CharField(primary_key=True, max_length=20)
    source = ForeignKeyField(Source, backref="insights", on_delete="CASCADE")
    transformation = ForeignKeyField(Transformation, null=True, on_delete="SET NULL")
    insight_type = CharField(max_length=500)
    content = TextField()
    model_name = CharField(max_length=300, default="")
    created = DateTimeField(default=now, index=True)
    updated = DateTimeField(default=now)


class InsightRequest(BaseModel):
    """A transformation to apply to a source: its command (once queued) and the
    model the request named. A source's creation asks for these before it is
    processed (no command yet); they are queued when its processing completes."""

    id = AutoField()
    source = ForeignKeyField(Source, on_delete="CASCADE")
    transformation = ForeignKeyField(Transformation, on_delete="CASCADE")
    model_id = CharField(null=True, max_length=100)  # the request's override, as it named it
    command_id = CharField(null=True, index=True)


class ChatSession(BaseModel):
    """A chat: about a notebook (its sources and notes), about one source (the source
    chat, schema step 7), or about nothing in particular."""

    id = CharField(primary_key=True, max_length=20)
    title = CharField(max_length=500, default="")
    notebook = ForeignKeyField(Notebook, null=True, backref="chat_sessions", on_delete="CASCADE")
    source = ForeignKeyField(Source, null=True, backref="chat_sessions", on_delete="CASCADE")
    model_override = CharField(null=True, max_length=20)  # a LanguageModel key
    created = DateTimeField(default=now, index=True)
    updated = DateTimeField(default=now, index=True)


class ChatMessage(BaseModel):
    id = AutoField()
    session = ForeignKeyField(ChatSession, backref="messages", on_delete="CASCADE")
    role = CharField(max_length=10)  # human | ai
    content = TextField()
    created = DateTimeField(default=now)


class Episode(BaseModel):
    """A podcast episode: its job, its script and, once made, its MP3 under
    DATA_DIR/podcasts."""

    id = CharField(primary_key=True, max_length=20)
    name = CharField(max_length=200)
    notebook = ForeignKeyField(Notebook, null=True, on_delete="SET NULL")
    speakers = IntegerField()
    length = CharField(max_length=10)
    command_id = CharField(null=True)
    model_id = CharField(null=True, max_length=20)
    material = TextField(null=True)  # the text to talk about when the request gave it (else the notebook's)
    briefing = TextField(null=True)  # the requester's instructions, added to the script's prompt
    transcript = JSONField(null=True)
    audio_file = CharField(null=True)
    created = DateTimeField(default=now, index=True)
    updated = DateTimeField(default=now)


class Setting(BaseModel):
    """A notebook-wide setting stored as JSON under its name (schema step 7):
    Open Notebook's application settings (GET/PUT /settings) and
    `transformation_instructions`, the text put before every transformation's prompt
    (core/app_settings.py reads and writes them)."""

    key = CharField(primary_key=True, max_length=100)
    value = JSONField(null=True)


MODELS = [
    Notebook,
    Source,
    SourceNotebook,
    Chunk,
    Note,
    Command,
    SearchDoc,
    Generation,
    Credential,
    LanguageModel,
    DefaultModel,
    Transformation,
    Insight,
    InsightRequest,
    ChatSession,
    ChatMessage,
    Episode,
    Setting,
]

FTS_DDL = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS search_fts USING fts5("
    "title, body, parent UNINDEXED, tokenize = 'porter unicode61 remove_diacritics 2')"
)
# `rank` is BM25 with a word in the title worth five in the body.
FTS_RANK = "INSERT INTO search_fts (search_fts, rank) VALUES ('rank', 'bm25(5.0, 1.0)')"


def is_sqlite():
    return isinstance(database.obj, SqliteDatabase)


def write_transaction():
    """This database's immediate write transaction (see app.common.db.write_transaction)."""
    return common_write_transaction(database)

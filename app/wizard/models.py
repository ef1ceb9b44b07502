"""The wizard's data (peewee): one table per collection, plus LLM timings.

Every collection row has the same typed columns (the ones the API filters on or
the server owns) and keeps the rest of its payload as JSON in `data`. `seq` orders
rows newest first without ties; `id` is the public identifier. Blueprints also keep
their like count (release 0.2.0 had that column on every collection: schema step 3
drops it from the others).
"""

import uuid
from datetime import UTC, datetime

from peewee import AutoField, BooleanField, CharField, DatabaseProxy, IntegerField, Model, TextField

from app.common.db import JSONField

database = DatabaseProxy()


def new_id():
    return uuid.uuid4().hex


def now_text():
    """UTC, ISO 8601 with milliseconds: sorts as text and reads in any client."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class BaseModel(Model):
    class Meta:
        database = database


class CollectionRow(BaseModel):
    seq = AutoField()
    id = CharField(unique=True, default=new_id)
    user_id = CharField(null=True, index=True)
    created_at = CharField(default=now_text)
    is_public = BooleanField(null=True)
    blueprint_id = CharField(null=True, index=True)
    key = CharField(null=True, index=True)  # the `key` filter (an admin prompt, a saved prompt by key)
    data = JSONField(default=dict)  # on SQLite, json_set lays fields over it in place


class Wizard(CollectionRow):
    class Meta:
        table_name = "wizards"


class Blueprint(CollectionRow):
    likes_count = IntegerField(null=True)

    class Meta:
        table_name = "blueprints"


class PromptHistory(CollectionRow):
    class Meta:
        table_name = "prompt_history"


class SavedPrompt(CollectionRow):
    class Meta:
        table_name = "saved_prompts"


class Like(CollectionRow):
    class Meta:
        table_name = "likes"
        # One like per user and blueprint, whatever the number of concurrent toggles.
        indexes = ((("user_id", "blueprint_id"), True),)


class AdminPrompt(CollectionRow):
    class Meta:
        table_name = "admin_prompts"


class LlmLog(CollectionRow):
    class Meta:
        table_name = "llm_logs"


class LlmTiming(BaseModel):
    """Queue, attempt, repair and outcome of each JSON text call (not a collection)."""

    seq = AutoField()
    id = CharField(unique=True, default=new_id)
    created_at = CharField(default=now_text)
    user_id = CharField(null=True)
    kind = CharField(null=True)
    template_key = CharField(null=True)
    requested_model = CharField()
    resolved_model = CharField()
    queue_ms = IntegerField()
    attempt_ms = IntegerField()
    repair_ms = IntegerField()
    total_ms = IntegerField()
    attempts = IntegerField()
    outcome = CharField()  # ok | failed
    error = TextField(null=True)

    class Meta:
        table_name = "llm_timings"


class CollectionVersion(BaseModel):
    """A counter per collection, raised in every write transaction: readers (in any
    worker process) tell from it whether a cached answer is still current."""

    name = CharField(primary_key=True)
    version = IntegerField(default=0)

    class Meta:
        table_name = "collection_versions"


class Marker(BaseModel):
    """Things done once in the life of the database (seeding the global wizards)."""

    key = CharField(primary_key=True)
    created_at = CharField(default=now_text)

    class Meta:
        table_name = "markers"


COLLECTIONS = {
    "wizards": Wizard,
    "blueprints": Blueprint,
    "prompt_history": PromptHistory,
    "saved_prompts": SavedPrompt,
    "likes": Like,
    "admin_prompts": AdminPrompt,
    "llm_logs": LlmLog,
}
MODELS = [*COLLECTIONS.values(), LlmTiming, CollectionVersion, Marker]

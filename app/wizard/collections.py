"""The seven collections: who may read and write which rows, and what a row looks like.

A row answers as its payload (`data`) with the server-owned fields laid over it:
`id`, `created_at`, `user_id` where the collection has owners, `likes_count` for
blueprints. The typed copies of `is_public`, `blueprint_id` and `key` live in
columns so that filters and scoping are plain indexed SQL.
"""

import json

from peewee import SqliteDatabase, fn

from app.common import clientjson
from app.common.db import write_transaction
from app.common.failures import Forbidden, Invalid, NotFound
from app.wizard import cache, events
from app.wizard.identity import Identity
from app.wizard.models import COLLECTIONS, Blueprint, Like, database

FILTER_KEYS = ("is_public", "user_id", "blueprint_id", "key")
SERVER_OWNED = ("id", "created_at", "user_id", "likes_count")
# Collections whose rows belong to the identity that created them.
OWNED = frozenset({"wizards", "blueprints", "prompt_history", "saved_prompts", "likes", "llm_logs"})
ADMIN_WRITES = frozenset({"admin_prompts", "llm_logs"})
PRIVATE = frozenset({"prompt_history", "saved_prompts", "likes"})  # each caller sees their own
SHARED_OR_OWN = frozenset({"wizards", "blueprints"})  # globals, public rows, own
_TYPED = {"is_public": bool, "blueprint_id": str, "key": str}
_TEXT_LIMIT = 200


def model_of(name):
    model = COLLECTIONS.get(name)
    if model is None:
        raise Invalid(f"unknown collection {name[:60]!r}: expected one of {', '.join(COLLECTIONS)}")
    return model


# ---- reading ---------------------------------------------------------------------


def parse_filter(raw):
    """`?filter=` as {column: value}: a JSON object of equality tests on the four keys."""
    if raw is None or raw == "":
        return {}
    try:
        wanted = clientjson.loads(raw)
    except clientjson.TooDeep as exc:
        raise Invalid(f"filter: {exc}") from None
    except ValueError:
        raise Invalid("filter: must be a URL-encoded JSON object") from None
    if not isinstance(wanted, dict):
        raise Invalid("filter: must be a JSON object")
    for key, value in wanted.items():
        if key not in FILTER_KEYS:
            raise Invalid(f"filter: unknown key {key[:60]!r}; allowed keys are {', '.join(FILTER_KEYS)}", field=key)
        expected = bool if key == "is_public" else str
        if value is not None and type(value) is not expected:
            raise Invalid(f"filter: {key} must be {'a boolean' if expected is bool else 'a string'} or null", field=key)
    return wanted


def _scope_key(name, who):
    """Which rows of `name` `who` sees, as a key: "*" for all of them, else whose own
    rows join the shared ones. Forbidden when `who` may not read `name` at all."""
    if who.is_admin or name == "admin_prompts":
        return "*"
    if name in PRIVATE or name in SHARED_OR_OWN:
        return who.id
    raise Forbidden(f"{name} is readable by administrators only")


def _visible(model, name, who: Identity):
    query = model.select()
    if _scope_key(name, who) == "*":
        return query
    if name in PRIVATE:
        return query.where(model.user_id == who.id)
    shared = model.user_id.is_null() | (model.is_public == True)  # noqa: E712 (peewee builds SQL from ==)
    return query.where(shared | (model.user_id == who.id))


def list_rows(name, who, wanted):
    """The rows `who` may see, newest first, as a cache.Answer: a JSON array (UTF-8
    bytes) and its content tag; served from the cache while the collection has not
    changed."""
    model = model_of(name)
    key = (name, _scope_key(name, who), json.dumps(wanted, sort_keys=True))  # 403 before anything is read
    version = cache.version(name)
    kept = cache.get(key, version)
    if kept is None:
        query = _visible(model, name, who)  # built only when the answer is
        for column, value in wanted.items():
            field = getattr(model, column)
            query = query.where(field.is_null() if value is None else field == value)
        body = ("[" + ",".join(_row_texts(name, model, query.order_by(model.seq.desc()))) + "]").encode()
        kept = cache.answer(body)
        cache.put(key, version, kept)
    return kept


def _columns(model):
    """The names of the model's columns, in the order model.select() reads them."""
    return [field.name for field in model._meta.sorted_fields]


def _row_texts(name, model, query):
    """Each row's JSON text. On SQLite the database lays the server-owned fields over
    the stored payload itself (json_set, in C): a thousand rows take a few
    milliseconds instead of tens on the worker's loop."""
    if not isinstance(database.obj, SqliteDatabase):
        rows, columns = query.tuples().iterator(), _columns(model)
        return (
            json.dumps(_as_json(name, dict(zip(columns, row))), separators=(",", ":"), ensure_ascii=False)
            for row in rows
        )
    laid_over = ["$.id", model.id, "$.created_at", model.created_at]
    if name in OWNED:
        laid_over += ["$.user_id", model.user_id]
    if name == "blueprints":
        laid_over += ["$.likes_count", fn.coalesce(model.likes_count, 0)]
    row_json_sql = fn.json_set(model.data, *laid_over).coerce(False)  # text, not the field's dict
    return (text for (text,) in query.select(row_json_sql).tuples().iterator())


def _as_json(name, columns):
    row = {"id": columns["id"], "created_at": columns["created_at"]}
    if name in OWNED:
        row["user_id"] = columns["user_id"]
    data = columns["data"]
    if isinstance(data, str):
        data = json.loads(data)
    row.update((k, v) for k, v in data.items() if k not in SERVER_OWNED)
    if name == "blueprints":
        row["likes_count"] = columns["likes_count"] or 0
    return row


def row_json(name, row):
    return _as_json(name, {column: getattr(row, column) for column in _columns(type(row))})


# ---- writing ---------------------------------------------------------------------


def _check_payload(name, payload):
    """The client's fields, less the server-owned ones, with the typed ones checked."""
    fields = {k: v for k, v in payload.items() if k not in SERVER_OWNED}
    for key, expected in _TYPED.items():
        value = fields.get(key)
        if value is None:
            continue
        if type(value) is not expected:
            raise Invalid(f"{key}: must be {'a boolean' if expected is bool else 'a string'}", field=key)
        if expected is str and not 0 < len(value) <= _TEXT_LIMIT:
            raise Invalid(f"{key}: must be 1 to {_TEXT_LIMIT} characters", field=key)
    cover = fields.get("cover_url")
    if name == "blueprints" and cover is not None and (not isinstance(cover, str) or not cover.startswith("/uploads/")):
        raise Invalid("cover_url: must be a URL starting with /uploads/ (upload the image first)", field="cover_url")
    return fields


def _typed_columns(fields):
    return {key: fields[key] for key in _TYPED if key in fields}


def _check_may_write(name, who, row=None):
    if name == "likes":
        raise Forbidden("likes change only through POST /api/likes/toggle")
    if name in ADMIN_WRITES:
        if not who.is_admin:
            raise Forbidden(f"{name} is writable by administrators only")
        return
    if row is None:
        return  # anyone identified may create rows of their own
    if row.user_id is None:
        if not who.is_admin:
            raise Forbidden("global rows are writable by administrators only")
    elif row.user_id != who.id and not (who.is_admin and name != "wizards"):
        # Custom wizards are mutable only by their owner (the spec's rule); other
        # owned rows also by administrators.
        raise Forbidden("only the owner may change this row")


def create_row(name, who, payload):
    model = model_of(name)
    _check_may_write(name, who)
    fields = _check_payload(name, payload)
    columns = _typed_columns(fields)
    if name in OWNED:
        columns["user_id"] = who.id
    if name == "blueprints":
        columns["likes_count"] = 0
    with write_transaction(database):
        row = model.create(data=fields, **columns)
        changed = cache.bump(name)
    events.announce(changed)
    return row_json(name, row)


def _row_for_write(name, who, row_id):
    model = model_of(name)
    _check_may_write(name, who)  # collection-wide refusals first (likes, admin-only)
    row = _visible(model, name, who).where(model.id == row_id).first()
    if row is None:
        raise NotFound(f"no row {row_id[:60]!r} in {name}")
    _check_may_write(name, who, row)
    return model, row


def update_row(name, who, row_id, payload):
    fields = _check_payload(name, payload)
    # Immediate: the row is read and then written; a deferred transaction would fail at
    # once when another worker process wrote in between.
    with write_transaction(database):
        model, row = _row_for_write(name, who, row_id)
        row.data = {**row.data, **fields}
        for column, value in _typed_columns(fields).items():
            setattr(row, column, value)
        row.save()
        changed = cache.bump(name)
    events.announce(changed)
    return row_json(name, row)


def delete_row(name, who, row_id):
    with write_transaction(database):
        model, row = _row_for_write(name, who, row_id)
        row.delete_instance()
        names = [name]
        if model is Blueprint and Like.delete().where(Like.blueprint_id == row.id).execute():
            names.append("likes")  # no like may outlive its blueprint
        changed = cache.bump(*names)
    events.announce(changed)


# ---- likes -----------------------------------------------------------------------


def toggle_like(who, blueprint_id):
    """Like or unlike: the like row and the count change in one write transaction,
    and the count is recounted from the rows, so it always equals them."""
    with write_transaction(database):
        blueprint = _visible(Blueprint, "blueprints", who).where(Blueprint.id == blueprint_id).first()
        if blueprint is None:
            raise NotFound(f"no blueprint {blueprint_id[:60]!r}")
        removed = Like.delete().where((Like.user_id == who.id) & (Like.blueprint_id == blueprint_id)).execute()
        if not removed:
            Like.create(user_id=who.id, blueprint_id=blueprint_id, data={"blueprint_id": blueprint_id})
        count = Like.select().where(Like.blueprint_id == blueprint_id).count()
        Blueprint.update(likes_count=count).where(Blueprint.id == blueprint_id).execute()
        changed = cache.bump("likes", "blueprints")
    events.announce(changed)
    return {"liked": not removed, "likes_count": count}

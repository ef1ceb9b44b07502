"""Which model a call uses (no Flask here: the job worker uses it too).

A request's own override always wins (an unknown one is a 404, one of the wrong
type a 400); without one, the use's defaults apply in the order of `FALLBACKS`.
Nothing ever swaps in the large-context model (Open Notebook does, silently, for
long contexts): it is used only where a request names it."""

from dataclasses import dataclass

from app.common.failures import ApiError, Failure, Invalid, NotFound
from app.notebook import llm
from app.notebook.core import provider_keys
from app.notebook.core.ids import key_of, public
from app.notebook.core.models import Credential, DefaultModel, LanguageModel, database

# The type of model each default names.
DEFAULT_TYPES = {
    "default_chat_model": "language",
    "default_transformation_model": "language",
    "large_context_model": "language",
    "default_embedding_model": "embedding",
    "default_text_to_speech_model": "text_to_speech",
    "default_speech_to_text_model": "speech_to_text",
    # Kept for Open Notebook's clients (its agents' tool calls); nothing here uses it yet.
    "default_tools_model": "language",
}
# Each use's defaults, first found wins.
FALLBACKS = {
    "chat": ("default_chat_model",),
    "transformation": ("default_transformation_model", "default_chat_model"),
    "text_to_speech": ("default_text_to_speech_model",),
}
USE_TYPES = {"chat": "language", "transformation": "language", "text_to_speech": "text_to_speech"}


@dataclass
class Resolved:
    """The model a call uses and where to send it."""

    record: LanguageModel
    target: llm.Target

    @property
    def name(self):
        return self.record.name

    @property
    def id(self):
        return public("model", self.record.id)


def _record(model, values):
    """A `model` instance from a row of its columns, as peewee would read it."""
    return model(**{f.name: f.python_value(v) for f, v in zip(model._meta.sorted_fields, values)})


def _models_with_credential(label, join, condition, params):
    """[(label, LanguageModel, its Credential or None)] of the models that `join` and
    `condition` (SQL on `m`) select, in one query.

    Raw SQL: peewee takes ~1 ms of CPU to build and read this join, 30 times what
    SQLite takes to run it, and every request that calls a model starts here."""
    model_fields, credential_fields = LanguageModel._meta.sorted_fields, Credential._meta.sorted_fields
    selected = ", ".join(
        [f'm."{f.column_name}"' for f in model_fields] + [f'c."{f.column_name}"' for f in credential_fields]
    )
    rows = database.execute_sql(
        f'SELECT {label}, {selected} FROM "{LanguageModel._meta.table_name}" m {join}'
        f' LEFT JOIN "{Credential._meta.table_name}" c ON c."id" = m."credential_id" WHERE {condition}',
        params,
    ).fetchall()
    found = []
    for row in rows:
        credential = _record(Credential, row[1 + len(model_fields) :])
        found.append(
            (
                row[0],
                _record(LanguageModel, row[1 : 1 + len(model_fields)]),
                credential if credential.id is not None else None,
            )
        )
    return found


def _get_model(public_id, field):
    """(model, credential) of an id; a 404 naming the request's field for a wrong
    prefix and an unknown id alike."""
    try:
        key = key_of("model", public_id)
    except Failure:
        key = None
    found = key and _models_with_credential('m."id"', "", f'm."id" = {database.param}', [key])
    if not found:
        prefix = f"{field}: " if field else ""
        raise NotFound(f"{prefix}model {str(public_id)[:80]!r} not found", field=field)
    return found[0][1:]


def get_model(public_id, field=None):
    return _get_model(public_id, field)[0]


def get_model_and_credential(public_id):
    """(LanguageModel, its Credential or None) of a model id; 404 when unknown."""
    return _get_model(public_id, None)


def _choose(use, override, field):
    """(LanguageModel, its Credential or None) for `use`: the override, else the
    use's defaults; an Invalid naming what is missing otherwise."""
    wanted = USE_TYPES[use]
    if override:
        record, credential = _get_model(override, field)
        if record.type != wanted:
            raise Invalid(
                f"{field}: {public('model', record.id)} is a {record.type} model, a {wanted} model is needed",
                field=field,
            )
        return record, credential
    marks = ", ".join(database.param for _ in FALLBACKS[use])
    defaults = {
        key: (record, credential)
        for key, record, credential in _models_with_credential(
            'd."key"',
            f'JOIN "{DefaultModel._meta.table_name}" d ON d."model_id" = m."id"',
            f'd."key" IN ({marks})',
            list(FALLBACKS[use]),
        )
    }
    for key in FALLBACKS[use]:
        if key in defaults:
            return defaults[key]
    raise Invalid(
        f"no {wanted} model is configured for {use}: set {FALLBACKS[use][0]} "
        f"(POST /models/config) or name one in the request ({field})",
        field=field,
    )


def choose(use, override=None, field="model_id"):
    """The LanguageModel for `use` (see _choose)."""
    return _choose(use, override, field)[0]


def resolve(config, use, override=None, field="model_id"):
    """The model for `use` with the Target to call it (its credential read in the same
    query, and its key decrypted, now: once per request, and a missing key is an
    error before any streaming starts)."""
    record, credential = _choose(use, override, field)
    try:
        target = provider_keys.target_for(config, record.provider, credential)
    except llm.ProviderError as exc:
        raise ApiError(exc.status, exc.message) from None
    return Resolved(record, target)


def complete(resolved, messages):
    """The model's whole reply; a provider's failure as the Failure a route answers."""
    try:
        return llm.chat(resolved.target, resolved.name, messages)
    except llm.ProviderError as exc:
        raise ApiError(exc.status, exc.message) from None

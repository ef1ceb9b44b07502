"""Routes of the models (`model:<key>`) and the defaults; which model a call uses is
app.notebook.core.model_choice."""

from collections.abc import Iterable
from typing import cast

from flask import Blueprint

from app.common.failures import Conflict, Invalid
from app.notebook import llm
from app.notebook.core import provider_keys
from app.notebook.core.ids import new_key, public
from app.notebook.core.model_choice import DEFAULT_TYPES, get_model, get_model_and_credential
from app.notebook.core.models import DefaultModel, LanguageModel, write_transaction
from app.notebook.routes import credentials, serializers
from app.notebook.routes.http import body, query, settings
from app.notebook.routes.payloads import DEFAULT_KEYS, DefaultsUpdate, ModelCreate, ModelListQuery

bp = Blueprint("model_config", __name__)

# --------------------------------------------------------------------------- routes


@bp.get("/models")
def list_models():
    """The registered models, optionally of one type or provider."""
    args = query(ModelListQuery)
    selection = LanguageModel.select()
    for name in ("type", "provider"):
        if args.get(name):
            selection = selection.where(getattr(LanguageModel, name) == args[name])
    return [
        serializers.model(m) for m in selection.order_by(LanguageModel.provider, LanguageModel.name, LanguageModel.id)
    ]


@bp.post("/models")
def create_model():
    """Register a model of a provider, optionally under one of its credentials (201)."""
    data = body(ModelCreate())
    credential_key = None
    if data.get("credential"):
        credential = credentials.get_credential(data["credential"])
        if credential.provider != data["provider"]:
            raise Invalid(
                f"credential: is a {credential.provider} credential, not {data['provider']}", field="credential"
            )
        credential_key = credential.id
    if data["type"] not in llm.CAPABILITIES[data["provider"]]:
        raise Invalid(f"type: provider {data['provider']} has no {data['type']} models", field="type")
    with write_transaction():
        if credentials.find_model(data["name"], data["provider"], data["type"], credential_key):
            raise Conflict(f"the {data['type']} model {data['name']!r} of {data['provider']} is already registered")
        record = LanguageModel.create(
            id=new_key(), name=data["name"], provider=data["provider"], type=data["type"], credential=credential_key
        )
    return serializers.model(record), 201


@bp.get("/models/defaults")
def read_defaults():
    """The default model of each role (chat, transformation, embedding, speech...)."""
    return current_defaults()


def current_defaults() -> dict[str, str | None]:
    """Every default's model, as a public id (None: not set)."""
    pairs = DefaultModel.select(DefaultModel.key, DefaultModel.model).tuples()
    rows = dict(cast(Iterable[tuple[str, str | None]], pairs))  # peewee's stubs type no tuples()
    return {key: public("model", rows.get(key)) for key in DEFAULT_KEYS}


@bp.post("/models/config")
@bp.put("/models/defaults")
def set_defaults():
    """Set the named defaults (null clears one); every model is checked first, so a
    bad one changes nothing."""
    data = body(DefaultsUpdate())
    chosen = {}
    for key, model_id in data.items():
        if model_id is None:
            chosen[key] = None
            continue
        record = get_model(model_id, key)
        if record.type != DEFAULT_TYPES[key]:
            raise Invalid(
                f"{key}: {model_id} is a {record.type} model, a {DEFAULT_TYPES[key]} model is needed", field=key
            )
        chosen[key] = record.id
    with write_transaction():
        for key, model_key in chosen.items():
            _set_default(key, model_key)
    return current_defaults()


def _set_default(key, model_key):
    (
        DefaultModel.insert(key=key, model=model_key)
        .on_conflict(conflict_target=[DefaultModel.key], update={DefaultModel.model: model_key})
        .execute()
    )


# The defaults auto-assign fills (Open Notebook's required ones: the others fall back
# to the chat model, and an empty one may be the user's choice), and the providers
# it prefers, first first.
AUTO_ASSIGNED = (("default_chat_model", "language"), ("default_embedding_model", "embedding"))
PROVIDER_PREFERENCE = tuple(llm.PROVIDER_INFO)


def _preferred_model(kind):
    """The registered model of `kind` of the most preferred provider (by name within
    it) that can be called (the rule a model's test says "not configured" by), or None."""
    candidates = [
        m for m in LanguageModel.select().where(LanguageModel.type == kind) if _unconfigured(m, m.credential) is None
    ]
    ranked = sorted(candidates, key=lambda m: (PROVIDER_PREFERENCE.index(m.provider), m.name, m.id))
    return ranked[0] if ranked else None


@bp.post("/models/auto-assign")
def auto_assign():
    """Fill the empty chat and embedding defaults from the registered models whose
    provider can be called (a credential or the environment), preferring OpenAI,
    then Anthropic, Ollama, OpenAI-compatible servers; a default set already is left
    alone."""
    assigned, skipped, missing = {}, [], []
    with write_transaction():
        current = {row.key: row.model_id for row in DefaultModel.select()}
        for key, kind in AUTO_ASSIGNED:
            if current.get(key):
                skipped.append(key)
                continue
            best = _preferred_model(kind)
            if best is None:
                missing.append(key)
                continue
            _set_default(key, best.id)
            assigned[key] = public("model", best.id)
    return {"assigned": assigned, "skipped": skipped, "missing": missing}


@bp.get("/models/<model_id>")
def read_model(model_id):
    """One registered model."""
    return serializers.model(get_model(model_id))


@bp.delete("/models/<model_id>")
def delete_model(model_id):
    """Defaults naming it are cleared (the database's SET NULL)."""
    record = get_model(model_id)
    with write_transaction():
        DefaultModel.update(model=None).where(DefaultModel.model == record.id).execute()
        LanguageModel.delete().where(LanguageModel.id == record.id).execute()
    return {"deleted": public("model", record.id)}


# --------------------------------------------------------------------------- a model's test


def _unconfigured(record, credential):
    """Why the model's provider cannot be called at all (no credential, no
    environment), or None."""
    if credential is not None or provider_keys.newest_credential(record.provider) is not None:
        return None
    if credentials.env_configured(record.provider):
        return None
    variables = [name for name in llm.ENV_VARIABLES.get(record.provider, ()) if name]
    hint = f" or set {' / '.join(variables)}" if variables else ""
    return f"provider {record.provider} is not configured: add a credential for it (POST /credentials){hint}"


def _try_model(record, target):
    """A minimal real call of the model's kind: what it answered, in a sentence."""
    if record.type == "language":
        text = llm.chat(target, record.name, [{"role": "user", "content": "Hi!"}])
        return f"Response: {text[:100] or '(empty response)'}"
    if record.type == "embedding":
        vectors = llm.embed(target, record.name, ["This is a test."])
        return f"Embedding dimensions: {len(vectors[0])}"
    if record.type == "text_to_speech":
        audio = llm.speech(target, record.name, "Hello from the research notebook.")
        return f"Audio generated: {len(audio)} bytes"
    raise llm.ProviderError(400, f"{record.type} models are registered here but not run yet: nothing to test")


@bp.post("/models/<model_id>/test")
def test_model(model_id):
    """Call the model once through its credential (a short chat, an embedding, a
    sentence of speech); the outcome is the answer, whatever it is."""
    record, credential = get_model_and_credential(model_id)
    reason = _unconfigured(record, credential)
    if reason:
        return {"success": False, "message": reason, "details": None}
    try:
        target = provider_keys.target_for(settings(), record.provider, credential)
        return {"success": True, "message": _try_model(record, target), "details": None}
    except llm.ProviderError as exc:
        return {"success": False, "message": exc.message, "details": None}

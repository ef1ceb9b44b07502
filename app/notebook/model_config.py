"""Models (`model:<key>`) and the defaults, and which model a request uses.

A request's own override always wins (an unknown one is a 404, one of the wrong
type a 400); without one, the use's defaults apply in the order of `FALLBACKS`.
Nothing ever swaps in the large-context model (Open Notebook does, silently, for
long contexts): it is used only where a request names it."""
from dataclasses import dataclass

from app.common.errors import ApiError
from app.notebook import bp, credentials, llm, views
from app.notebook.http import body, query
from app.notebook.ids import key_of, new_key, public
from app.notebook.models import Credential, DefaultModel, LanguageModel, write_transaction
from app.notebook.schemas import DEFAULT_KEYS, DefaultsUpdate, ModelCreate, ModelListQuery

# The type of model each default names.
DEFAULT_TYPES = {"default_chat_model": "language", "default_transformation_model": "language",
                 "large_context_model": "language", "default_embedding_model": "embedding",
                 "default_text_to_speech_model": "text_to_speech",
                 "default_speech_to_text_model": "speech_to_text"}
# Each use's defaults, first found wins.
FALLBACKS = {"chat": ("default_chat_model",),
             "transformation": ("default_transformation_model", "default_chat_model"),
             "text_to_speech": ("default_text_to_speech_model",)}
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


def get_model(public_id, field=None):
    record = LanguageModel.get_or_none(LanguageModel.id == key_of("model", public_id))
    if record is None:
        prefix = f"{field}: " if field else ""
        raise ApiError(404, f"{prefix}model {public_id[:80]!r} not found", field=field)
    return record


def _default_model(key):
    row = DefaultModel.get_or_none(DefaultModel.key == key)
    return LanguageModel.get_or_none(LanguageModel.id == row.model_id) if row and row.model_id else None


def choose(use, override=None, field="model_id"):
    """The LanguageModel for `use`: the override, else the use's defaults; an
    ApiError naming what is missing otherwise."""
    wanted = USE_TYPES[use]
    if override:
        record = get_model(override, field)
        if record.type != wanted:
            raise ApiError(400, f"{field}: {public('model', record.id)} is a {record.type} model, "
                                f"a {wanted} model is needed", field=field)
        return record
    for key in FALLBACKS[use]:
        record = _default_model(key)
        if record is not None:
            return record
    raise ApiError(400, f"no {wanted} model is configured for {use}: set {FALLBACKS[use][0]} "
                        f"(POST /models/config) or name one in the request ({field})", field=field)


def resolve(config, use, override=None, field="model_id"):
    """`choose`, with the Target to call it (credentials resolved now, so that a
    missing key is an error before any streaming starts)."""
    record = choose(use, override, field)
    credential = Credential.get_or_none(Credential.id == record.credential_id) if record.credential_id else None
    try:
        target = credentials.target_for(config, record.provider, credential)
    except llm.ProviderError as exc:
        raise ApiError(exc.status, exc.message) from None
    return Resolved(record, target)


def complete(resolved, messages):
    """The model's whole reply; a provider's failure as the ApiError a route answers."""
    try:
        return llm.chat(resolved.target, resolved.name, messages)
    except llm.ProviderError as exc:
        raise ApiError(exc.status, exc.message) from None


# --------------------------------------------------------------------------- routes

@bp.get("/models")
def list_models():
    args = query(ModelListQuery)
    selection = LanguageModel.select()
    for name in ("type", "provider"):
        if args.get(name):
            selection = selection.where(getattr(LanguageModel, name) == args[name])
    return [views.model(m) for m in selection.order_by(LanguageModel.provider, LanguageModel.name, LanguageModel.id)]


@bp.post("/models")
def create_model():
    data = body(ModelCreate())
    credential_key = None
    if data.get("credential"):
        credential = credentials.get_credential(data["credential"])
        if credential.provider != data["provider"]:
            raise ApiError(400, f"credential: is a {credential.provider} credential, not {data['provider']}",
                           field="credential")
        credential_key = credential.id
    if data["type"] not in llm.CAPABILITIES[data["provider"]]:
        raise ApiError(400, f"type: provider {data['provider']} has no {data['type']} models", field="type")
    with write_transaction():
        if credentials.find_model(data["name"], data["provider"], data["type"], credential_key):
            raise ApiError(409, f"the {data['type']} model {data['name']!r} of {data['provider']} is already registered")
        record = LanguageModel.create(id=new_key(), name=data["name"], provider=data["provider"],
                                      type=data["type"], credential=credential_key)
    return views.model(record), 201


@bp.get("/models/defaults")
def read_defaults():
    return _defaults()


def _defaults():
    rows = {row.key: row.model_id for row in DefaultModel.select()}
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
            raise ApiError(400, f"{key}: {model_id} is a {record.type} model, a {DEFAULT_TYPES[key]} model "
                                "is needed", field=key)
        chosen[key] = record.id
    with write_transaction():
        for key, model_key in chosen.items():
            DefaultModel.insert(key=key, model=model_key).on_conflict_replace().execute()
    return _defaults()


@bp.get("/models/<model_id>")
def read_model(model_id):
    return views.model(get_model(model_id))


@bp.delete("/models/<model_id>")
def delete_model(model_id):
    """Defaults naming it are cleared (the database's SET NULL)."""
    record = get_model(model_id)
    with write_transaction():
        DefaultModel.update(model=None).where(DefaultModel.model == record.id).execute()
        LanguageModel.delete().where(LanguageModel.id == record.id).execute()
    return {"deleted": public("model", record.id)}

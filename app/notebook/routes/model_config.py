"""Routes of the models (`model:<key>`) and the defaults; which model a call uses is
app.notebook.core.model_choice."""

from flask import Blueprint

from app.common.failures import Conflict, Invalid
from app.notebook import llm
from app.notebook.core.ids import new_key, public
from app.notebook.core.model_choice import DEFAULT_TYPES, get_model
from app.notebook.core.models import DefaultModel, LanguageModel, write_transaction
from app.notebook.routes import credentials, serializers
from app.notebook.routes.http import body, query
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
            raise Invalid(
                f"{key}: {model_id} is a {record.type} model, a {DEFAULT_TYPES[key]} model is needed", field=key
            )
        chosen[key] = record.id
    with write_transaction():
        for key, model_key in chosen.items():
            (
                DefaultModel.insert(key=key, model=model_key)
                .on_conflict(conflict_target=[DefaultModel.key], update={DefaultModel.model: model_key})
                .execute()
            )
    return _defaults()


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

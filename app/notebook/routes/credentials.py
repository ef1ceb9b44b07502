"""Routes of the provider credentials (`credential:<key>`): name, provider, base URL
and an API key encrypted at rest (app.notebook.core.provider_keys), never answered
(`has_api_key`)."""

import json
import logging
import os
from urllib.parse import unquote, urlsplit

from flask import Blueprint
from peewee import fn

from app.common.failures import ApiError, Conflict, Failure, Invalid, NotFound
from app.notebook import llm
from app.notebook.core.ids import key_of, new_key, public
from app.notebook.core.models import Credential, DefaultModel, LanguageModel, now, write_transaction
from app.notebook.core.provider_keys import decryption_error, encrypt, newest_credential, target_for
from app.notebook.routes import serializers
from app.notebook.routes.http import body, query, settings
from app.notebook.routes.payloads import (
    CredentialCreate,
    CredentialDeleteQuery,
    CredentialListQuery,
    CredentialUpdate,
    RegisterModels,
)

bp = Blueprint("credentials", __name__)

log = logging.getLogger("bundle.notebook")


def _checked_base_url(url):
    """A base URL is scheme://host[:port][/path]: no query, fragment or dot segment
    (a path that climbs out of the API's base), and its host passes the SSRF guard."""
    if url:
        parts = urlsplit(url)
        if parts.query or parts.fragment or "?" in url or "#" in url:
            raise Invalid(
                "base_url: must not have a query or a fragment (give the API's base, e.g. http://host:8000/v1)",
                field="base_url",
            )
        if "\\" in url or any(unquote(segment) in (".", "..") for segment in parts.path.split("/")):
            raise Invalid("base_url: must not have '.' or '..' path segments", field="base_url")
        try:
            llm.check_base_url(url, settings().provider_allowlist)
        except llm.ProviderError as exc:
            raise Invalid(exc.message, field="base_url") from None
    return url


def _unique_name(name, except_key=None):
    """Two credentials never share a name (call inside the write transaction)."""
    clash = Credential.select().where(Credential.name == name)
    if except_key:
        clash = clash.where(Credential.id != except_key)
    if clash.exists():
        raise Conflict(f"a credential named {name!r} exists already", field="name")


def get_credential(public_id):
    record = Credential.get_or_none(Credential.id == key_of("credential", public_id))
    if record is None:
        raise NotFound(f"credential {public_id[:80]!r} not found")
    return record


def _view(record, model_counts=None):
    if model_counts is None:
        model_counts = {record.id: LanguageModel.select().where(LanguageModel.credential == record.id).count()}
    return serializers.credential(record, decryption_error(settings(), record), model_counts.get(record.id, 0))


# --------------------------------------------------------------------------- CRUD


@bp.get("/credentials")
def list_credentials():
    """The provider credentials, optionally of one provider, with how many models use each (keys never answered)."""
    args = query(CredentialListQuery)
    selection = Credential.select()
    if args.get("provider"):
        selection = selection.where(Credential.provider == args["provider"])
    counts = dict(
        LanguageModel.select(LanguageModel.credential, fn.COUNT(LanguageModel.id))
        .where(LanguageModel.credential.is_null(False))
        .group_by(LanguageModel.credential)
        .tuples()
    )
    return [_view(record, counts) for record in selection.order_by(Credential.created, Credential.id)]


@bp.post("/credentials")
def create_credential():
    """Store a provider credential; its API key is encrypted with NOTEBOOK_ENCRYPTION_KEY (201)."""
    data = body(CredentialCreate())
    record = Credential(
        id=new_key(),
        name=data["name"],
        provider=data["provider"],
        base_url=_checked_base_url(data.get("base_url")),
        modalities=json.dumps(data.get("modalities") or []),
    )
    if data.get("api_key"):
        record.api_key_encrypted = encrypt(settings(), data["api_key"])
    with write_transaction():
        _unique_name(record.name)
        record.save(force_insert=True)
    return _view(record), 201


@bp.get("/credentials/<credential_id>")
def read_credential(credential_id):
    """One credential (its key never answered, only whether it has one)."""
    return _view(get_credential(credential_id))


@bp.put("/credentials/<credential_id>")
def update_credential(credential_id):
    """Change a credential's name, base URL, modalities or key."""
    record = get_credential(credential_id)
    data = body(CredentialUpdate())
    changes = {"updated": now()}
    if "name" in data:
        changes["name"] = data["name"]
    if "base_url" in data:
        if not data["base_url"] and record.provider == "openai_compatible":
            raise Invalid("base_url: is required for an openai_compatible provider", field="base_url")
        changes["base_url"] = _checked_base_url(data["base_url"]) or None
    if "api_key" in data:
        changes["api_key_encrypted"] = encrypt(settings(), data["api_key"]) if data["api_key"] else None
    if "modalities" in data:
        changes["modalities"] = json.dumps(data["modalities"])
    with write_transaction():
        if "name" in data:
            _unique_name(data["name"], record.id)
        Credential.update(**changes).where(Credential.id == record.id).execute()
    return _view(Credential.get_by_id(record.id))


@bp.delete("/credentials/<credential_id>")
def delete_credential(credential_id):
    """A credential that models still use is not deleted (409): they would fall
    back, silently, to another credential of the provider (another account or
    server). `?force=true` deletes those models with it and clears the defaults
    that named them."""
    record = get_credential(credential_id)
    force = query(CredentialDeleteQuery)["force"]
    with write_transaction():
        keys = [
            key
            for (key,) in LanguageModel.select(LanguageModel.id).where(LanguageModel.credential == record.id).tuples()
        ]
        if keys and not force:
            raise Conflict(
                f"{public('credential', record.id)} is used by {len(keys)} model(s): delete "
                "them first, or delete with ?force=true to delete them with it"
            )
        if keys:
            DefaultModel.update(model=None).where(DefaultModel.model.in_(keys)).execute()
            LanguageModel.delete().where(LanguageModel.id.in_(keys)).execute()
        Credential.delete().where(Credential.id == record.id).execute()
    return {"deleted": public("credential", record.id), "deleted_models": len(keys)}


# --------------------------------------------------------------------------- provider calls


def _target_of(record):
    try:
        return target_for(settings(), record.provider, record)
    except llm.ProviderError as exc:
        raise ApiError(exc.status, exc.message) from None


@bp.post("/credentials/<credential_id>/test")
def test_credential(credential_id):
    """A real, minimal call (the models list, which needs the key): the outcome is
    the answer, whatever it is."""
    record = get_credential(credential_id)
    try:
        models = llm.list_models(target_for(settings(), record.provider, record))
    except llm.ProviderError as exc:
        return {"provider": record.provider, "success": False, "message": exc.message}
    return {
        "provider": record.provider,
        "success": True,
        "message": f"connected: the provider lists {len(models)} model(s)",
    }


def _provider_call(fn_, *args):
    try:
        return fn_(*args)
    except llm.ProviderError as exc:
        raise ApiError(exc.status, exc.message) from None


@bp.post("/credentials/<credential_id>/discover")
def discover_models(credential_id):
    """The models the credential's provider lists, each marked when already registered."""
    record = get_credential(credential_id)
    listed = _provider_call(llm.list_models, _target_of(record))
    registered = {
        name
        for (name,) in LanguageModel.select(LanguageModel.name)
        .where((LanguageModel.provider == record.provider) & (LanguageModel.credential == record.id))
        .tuples()
    }
    return {
        "provider": record.provider,
        "credential_id": public("credential", record.id),
        "models": [
            {"name": m["name"], "provider": record.provider, "registered": m["name"] in registered} for m in listed
        ],
    }


def find_model(name, provider, kind, credential_key):
    condition = (LanguageModel.name == name) & (LanguageModel.provider == provider) & (LanguageModel.type == kind)
    condition &= (
        LanguageModel.credential.is_null() if credential_key is None else LanguageModel.credential == credential_key
    )
    return LanguageModel.get_or_none(condition)


@bp.post("/credentials/<credential_id>/register-models")
def register_models(credential_id):
    """Register the chosen models under this credential; ones already registered
    are counted as existing, never doubled."""
    record = get_credential(credential_id)
    data = body(RegisterModels())
    created, existing, answer = 0, 0, []
    with write_transaction():
        for choice in data["models"]:
            if choice["type"] not in llm.CAPABILITIES[record.provider]:
                raise Invalid(f"models: provider {record.provider} has no {choice['type']} models", field="models")
            model = find_model(choice["name"], record.provider, choice["type"], record.id)
            if model is None:
                model = LanguageModel.create(
                    id=new_key(),
                    name=choice["name"],
                    provider=record.provider,
                    type=choice["type"],
                    credential=record.id,
                )
                created += 1
            else:
                existing += 1
            answer.append(serializers.model(model))
    return {"created": created, "existing": existing, "models": answer}


# --------------------------------------------------------------------------- status, environment


def _env_configured(provider):
    api_key, base_url = llm.env_settings(provider)
    return bool(api_key) if provider in ("openai", "anthropic") else bool(base_url)


@bp.get("/credentials/status")
def credentials_status():
    """Per provider, whether it is configured, and from where (database or environment)."""
    counts = dict(
        Credential.select(Credential.provider, fn.COUNT(Credential.id)).group_by(Credential.provider).tuples()
    )
    providers = {}
    for provider in llm.PROVIDERS:
        in_env = _env_configured(provider) if provider in llm.ENV_VARIABLES else False
        source = "database" if counts.get(provider) else ("environment" if in_env else "none")
        providers[provider] = {"configured": source != "none", "source": source, "credentials": counts.get(provider, 0)}
    return {"encryption_configured": bool(settings().encryption_key), "providers": providers}


@bp.get("/credentials/env-status")
def env_status():
    """Which variables are set (never their values)."""
    names = [name for pair in llm.ENV_VARIABLES.values() for name in pair if name]
    variables = {name: bool(os.environ.get(name, "").strip()) for name in names}
    return {"variables": variables, "providers": {p: _env_configured(p) for p in llm.ENV_VARIABLES}}


@bp.post("/credentials/migrate-from-env")
def migrate_from_env():
    """One credential per provider configured in the environment and not yet in the
    database (a provider with a credential already is skipped, never doubled)."""
    migrated, skipped, errors, created = [], [], [], []
    for provider in llm.ENV_VARIABLES:
        if not _env_configured(provider):
            continue
        if newest_credential(provider) is not None:
            skipped.append(provider)
            continue
        api_key, base_url = llm.env_settings(provider)
        try:
            if base_url:
                _checked_base_url(base_url)
            record = Credential(
                id=new_key(), name=f"{provider} (from environment)", provider=provider, base_url=base_url or None
            )
            if api_key:
                record.api_key_encrypted = encrypt(settings(), api_key)
            with write_transaction():
                _unique_name(record.name)
                record.save(force_insert=True)
        except Failure as exc:
            errors.append(f"{provider}: {exc.message}")
            continue
        migrated.append(provider)
        created.append(_view(record))
    return {"migrated": migrated, "skipped": skipped, "errors": errors, "credentials": created}

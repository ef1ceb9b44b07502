"""Routes of the provider credentials (`credential:<key>`): name, provider, base URL
and an API key encrypted at rest (app.notebook.core.provider_keys), never answered
(`has_api_key`)."""

import json
import logging
from urllib.parse import unquote, urlsplit

from flask import Blueprint, request
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


def _checked_num_ctx(provider, num_ctx):
    """The context window to store (None for the default); only Ollama's calls use one."""
    if num_ctx and provider != "ollama":
        raise Invalid(f"num_ctx: only an ollama credential takes a context window, not {provider}", field="num_ctx")
    return num_ctx or None


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
        num_ctx=_checked_num_ctx(data["provider"], data.get("num_ctx")),
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
    if "num_ctx" in data:
        changes["num_ctx"] = _checked_num_ctx(record.provider, data["num_ctx"])
    with write_transaction():
        if "name" in data:
            _unique_name(data["name"], record.id)
        Credential.update(**changes).where(Credential.id == record.id).execute()
    return _view(Credential.get_by_id(record.id))


def _migration_target(record, public_id):
    """The credential that takes over `record`'s models (`?migrate_to=`), or None."""
    if not public_id:
        return None
    try:
        target = get_credential(public_id)
    except Failure:
        raise NotFound(f"migrate_to: credential {public_id[:80]!r} not found", field="migrate_to") from None
    if target.id == record.id:
        raise Invalid("migrate_to: is the credential being deleted", field="migrate_to")
    if target.provider != record.provider:
        raise Invalid(f"migrate_to: is a {target.provider} credential, not {record.provider}", field="migrate_to")
    return target


def _still_there(target):
    """`target` read again inside the write transaction: a delete that committed since
    the request looked it up (two crossed deletes, each moving to the other) is a 404
    on `migrate_to`, not a foreign-key failure."""
    if not Credential.select().where(Credential.id == target.id).exists():
        raise NotFound(
            f"migrate_to: credential {public('credential', target.id)!r} was deleted meanwhile", field="migrate_to"
        )


def _move_models(keys, target):
    """Move the models to `target`; one it has already (same name, provider and type)
    is not doubled: the defaults naming the moved copy name the existing one, and the
    copy goes. How many were merged so."""
    merged = 0
    for model in LanguageModel.select().where(LanguageModel.id.in_(keys)):
        existing = find_model(model.name, model.provider, model.type, target.id)
        if existing is None:
            LanguageModel.update(credential=target.id, updated=now()).where(LanguageModel.id == model.id).execute()
            continue
        DefaultModel.update(model=existing.id).where(DefaultModel.model == model.id).execute()
        LanguageModel.delete().where(LanguageModel.id == model.id).execute()
        merged += 1
    return merged


@bp.delete("/credentials/<credential_id>")
def delete_credential(credential_id):
    """Delete a credential; the models registered under it are deleted with it (as
    Open Notebook does; their defaults cleared), or move to `?migrate_to=` another
    credential of the provider (one registered there already is merged into it, not
    doubled). `?delete_models=false` (or our earlier `force=false`) refuses, 409, while
    models use it."""
    record = get_credential(credential_id)
    args = query(CredentialDeleteQuery)
    target = _migration_target(record, args.get("migrate_to"))
    refuse = args.get("delete_models") is False or args.get("force") is False
    merged = 0
    with write_transaction():
        if target is not None:
            _still_there(target)
        keys = [
            key
            for (key,) in LanguageModel.select(LanguageModel.id).where(LanguageModel.credential == record.id).tuples()
        ]
        if keys and target is None and refuse:
            raise Conflict(
                f"{public('credential', record.id)} is used by {len(keys)} model(s): delete with "
                "?delete_models=true to delete them with it, or ?migrate_to=<credential id> to move them"
            )
        if keys and target is not None:
            merged = _move_models(keys, target)
        elif keys:
            DefaultModel.update(model=None).where(DefaultModel.model.in_(keys)).execute()
            LanguageModel.delete().where(LanguageModel.id.in_(keys)).execute()
        Credential.delete().where(Credential.id == record.id).execute()
    moved = len(keys) if target is not None else 0
    return {
        "message": f"credential deleted; {len(keys) - moved} model(s) deleted, {moved} moved"
        + (f" ({merged} merged into ones the target had)" if merged else ""),
        "deleted": public("credential", record.id),
        "deleted_models": len(keys) - moved,
        "migrated_models": moved,
        "merged_models": merged,
    }


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


def _registered_names(record):
    return {
        name
        for (name,) in LanguageModel.select(LanguageModel.name)
        .where((LanguageModel.provider == record.provider) & (LanguageModel.credential == record.id))
        .tuples()
    }


@bp.post("/credentials/<credential_id>/discover")
def discover_models(credential_id):
    """The models the credential's provider lists, each with the type its name
    suggests and whether it is registered under this credential already."""
    record = get_credential(credential_id)
    listed = _provider_call(llm.list_models, _target_of(record))
    registered = _registered_names(record)
    return {
        "provider": record.provider,
        "credential_id": public("credential", record.id),
        "discovered": [
            {
                "name": m["name"],
                "provider": record.provider,
                "model_type": llm.guess_type(record.provider, m["name"]),
                "description": m.get("description"),
                "registered": m["name"] in registered,
            }
            for m in listed
        ],
    }


def find_model(name, provider, kind, credential_key):
    condition = (LanguageModel.name == name) & (LanguageModel.provider == provider) & (LanguageModel.type == kind)
    condition &= (
        LanguageModel.credential.is_null() if credential_key is None else LanguageModel.credential == credential_key
    )
    return LanguageModel.get_or_none(condition)


def _without_body():
    return not request.content_length and "chunked" not in request.headers.get("Transfer-Encoding", "").lower()


def _chosen_models(record):
    """[{name, type}] to register: the body's (each checked against the credential's
    provider), or, for a request without a body (onb-mcp's register_models sends
    none), every model the provider lists, typed by its name."""
    if _without_body():
        listed = _provider_call(llm.list_models, _target_of(record))
        return [{"name": m["name"], "type": llm.guess_type(record.provider, m["name"])} for m in listed]
    choices = body(RegisterModels())["models"]
    for index, choice in enumerate(choices):
        if choice.get("provider", record.provider) != record.provider:
            field = f"models.{index}.provider"
            raise Invalid(f"{field}: this is a {record.provider} credential, not {choice['provider']}", field=field)
        if choice["type"] not in llm.CAPABILITIES[record.provider]:
            raise Invalid(f"models: provider {record.provider} has no {choice['type']} models", field="models")
    return choices


@bp.post("/credentials/<credential_id>/register-models")
def register_models(credential_id):
    """Register the chosen models under this credential; ones already registered
    are counted as existing, never doubled."""
    record = get_credential(credential_id)
    choices = _chosen_models(record)
    created, existing, answer = 0, 0, []
    with write_transaction():
        for choice in choices:
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


def env_configured(provider):
    """Whether `provider`'s environment variables configure it (Open Notebook's names)."""
    api_key, base_url = llm.env_settings(provider)
    return bool(api_key) if provider in ("openai", "anthropic") else bool(base_url)


@bp.get("/credentials/status")
def credentials_status():
    """Per provider, whether it is configured and from where (database or
    environment), as Open Notebook answers; `providers` has both per provider, with
    how many credentials it has."""
    counts = dict(
        Credential.select(Credential.provider, fn.COUNT(Credential.id)).group_by(Credential.provider).tuples()
    )
    providers = {}
    for provider in llm.PROVIDERS:
        source = "database" if counts.get(provider) else ("environment" if env_configured(provider) else "none")
        providers[provider] = {"configured": source != "none", "source": source, "credentials": counts.get(provider, 0)}
    return {
        "configured": {provider: status["configured"] for provider, status in providers.items()},
        "source": {provider: status["source"] for provider, status in providers.items()},
        "encryption_configured": bool(settings().encryption_key),
        "providers": providers,
    }


@bp.get("/credentials/env-status")
def env_status():
    """{provider: whether its environment variables configure it} (never their values)."""
    return {provider: env_configured(provider) for provider in llm.PROVIDERS}


@bp.post("/credentials/migrate-from-env")
def migrate_from_env():
    """One credential per provider configured in the environment and not yet in the
    database (a provider with a credential already is skipped, never doubled)."""
    migrated, skipped, errors, created, not_configured = [], [], [], [], []
    for provider in llm.ENV_VARIABLES:
        if not env_configured(provider):
            not_configured.append(provider)
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
    return {
        "message": f"migration complete: {len(migrated)} provider(s) migrated",
        "migrated": migrated,
        "skipped": skipped,
        "not_configured": not_configured,
        "errors": errors,
        "credentials": created,
    }

"""Providers' API keys at rest (Fernet with NOTEBOOK_ENCRYPTION_KEY) and where a
call's Target comes from: a model's credential, else the provider's newest credential,
else the provider's environment variables. No Flask here: the job worker uses it too."""

from cryptography.fernet import Fernet, InvalidToken

from app.common.failures import Invalid
from app.notebook import llm
from app.notebook.core.ids import public
from app.notebook.core.models import Credential


class DecryptionError(Exception):
    """The stored key cannot be read with the configured NOTEBOOK_ENCRYPTION_KEY."""


def encrypt(config, api_key):
    if not config.encryption_key:
        raise Invalid(
            "api_key: cannot be stored: NOTEBOOK_ENCRYPTION_KEY is not set on the server "
            "(set it to a Fernet key to store provider keys encrypted)",
            field="api_key",
        )
    return Fernet(config.encryption_key.encode()).encrypt(api_key.encode()).decode()


def decrypt(config, credential):
    """The plain key of `credential` ("" when it has none)."""
    if not credential.api_key_encrypted:
        return ""
    if not config.encryption_key:
        raise DecryptionError("NOTEBOOK_ENCRYPTION_KEY is not set")
    try:
        return Fernet(config.encryption_key.encode()).decrypt(credential.api_key_encrypted.encode()).decode()
    except (InvalidToken, ValueError):
        raise DecryptionError("it was encrypted with another NOTEBOOK_ENCRYPTION_KEY") from None


def decryption_error(config, credential):
    """Why the stored key of `credential` cannot be decrypted, or None when it can (or has none)."""
    try:
        decrypt(config, credential)
        return None
    except DecryptionError as exc:
        return f"the stored API key cannot be decrypted: {exc}"


# --------------------------------------------------------------------------- targets


def newest_credential(provider):
    return (
        Credential.select()
        .where(Credential.provider == provider)
        .order_by(Credential.created.desc(), Credential.id)
        .first()
    )


def target_for(config, provider, credential=None):
    """The Target of a call to `provider` with `credential` (or the provider's
    newest credential, or its environment variables); raises ProviderError."""
    credential = credential or newest_credential(provider)
    if credential is not None:
        try:
            api_key = decrypt(config, credential)
        except DecryptionError as exc:
            raise llm.ProviderError(
                400, f"the API key of {public('credential', credential.id)} cannot be decrypted ({exc}); store it again"
            ) from None
        base_url, num_ctx = credential.base_url, credential.num_ctx
    else:
        (api_key, base_url), num_ctx = llm.env_settings(provider), None
    base_url = base_url or llm.DEFAULT_BASE_URLS.get(provider)
    if not base_url:
        raise llm.ProviderError(400, f"provider {provider} needs a base URL: create a credential with base_url")
    return llm.Target(
        provider,
        base_url,
        api_key,
        config.llm_timeout,
        config.llm_connect_timeout,
        config.provider_allowlist,
        num_ctx=num_ctx or None,
    )

"""The provider layer: one adapter module per wire protocol (openai for OpenAI and
every OpenAI-compatible server, ollama, anthropic), each a handful of functions
over app.notebook.llm.transport. Callers hand a Target (where, which key, how
long) and a model name; messages are [{role: system|user|assistant, content}]."""

import json
import os

from app.notebook.llm import anthropic, ollama, openai
from app.notebook.llm.transport import ProviderError, Target, check_base_url  # noqa: F401 (re-exported)

PROVIDERS = ("openai", "openai_compatible", "ollama", "anthropic")
MODEL_TYPES = ("language", "embedding", "text_to_speech", "speech_to_text")
_ADAPTERS = {"openai": openai, "openai_compatible": openai, "ollama": ollama, "anthropic": anthropic}
# What each provider can serve (speech_to_text is registered and defaulted, not run yet).
CAPABILITIES = {
    "openai": set(MODEL_TYPES),
    "openai_compatible": set(MODEL_TYPES),
    "ollama": {"language", "embedding"},
    "anthropic": {"language"},
}
DEFAULT_BASE_URLS = {
    "openai": openai.DEFAULT_BASE_URL,
    "ollama": ollama.DEFAULT_BASE_URL,
    "anthropic": anthropic.DEFAULT_BASE_URL,
}
# Environment variables Open Notebook reads, per provider: (API key, base URL).
ENV_VARIABLES = {
    "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
    "ollama": (None, "OLLAMA_API_BASE"),
    "anthropic": ("ANTHROPIC_API_KEY", None),
}


# What each provider is called on screen and where its keys are made (GET /providers),
# in the order Open Notebook's settings page lists them.
PROVIDER_INFO = {
    "openai": ("OpenAI", "https://platform.openai.com/api-keys"),
    "anthropic": ("Anthropic", "https://console.anthropic.com/settings/keys"),
    "ollama": ("Ollama", None),
    "openai_compatible": ("OpenAI Compatible", None),
}
# Words in a model's name that tell its type, checked in this order (a listing says
# only the name); anything else is a language model.
_TYPE_WORDS = (
    ("speech_to_text", ("whisper", "transcribe", "stt")),
    ("text_to_speech", ("tts", "speech")),
    ("embedding", ("embed", "nomic", "mxbai", "minilm", "bge-", "e5-")),
)


def guess_type(provider, name):
    """The type a model's name suggests, among what `provider` serves."""
    lowered = name.lower()
    for kind, words in _TYPE_WORDS:
        if kind in CAPABILITIES[provider] and any(word in lowered for word in words):
            return kind
    return "language"


def env_settings(provider):
    """(API key, base URL) of `provider` from the environment (blank when unset)."""
    key_name, url_name = ENV_VARIABLES.get(provider, (None, None))
    return (
        os.environ.get(key_name, "").strip() if key_name else "",
        os.environ.get(url_name, "").strip() if url_name else "",
    )


def first_json_object(text):
    """The first JSON value in a model's reply, from its first `{` (fences and prose
    around it tolerated), or None when there is none."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(text[start:])[0]
    except (ValueError, RecursionError):  # RecursionError: nested too deep to parse
        return None


def _adapter(target, capability):
    if capability not in CAPABILITIES[target.provider]:
        raise ProviderError(400, f"provider {target.provider} has no {capability} models")
    return _ADAPTERS[target.provider]


def chat(target, model, messages):
    """The whole reply's text (without NUL characters, which no database of ours keeps)."""
    return _adapter(target, "language").chat(target, model, messages).replace("\x00", "")


def chat_stream(target, model, messages):
    """The reply's text deltas as they come (without NUL characters)."""
    for delta in _adapter(target, "language").chat_stream(target, model, messages):
        yield delta.replace("\x00", "")


def list_models(target):
    return _ADAPTERS[target.provider].list_models(target)


def embed(target, model, texts):
    return _adapter(target, "embedding").embed(target, model, texts)


def speech(target, model, text, voice=None):
    return _adapter(target, "text_to_speech").speech(target, model, text, voice)

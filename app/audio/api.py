"""Routes of the audio API, all under /api/audio/."""

from flask import Blueprint, Response, current_app, request

from app.audio.middleware import MAX_BODY_BYTES
from app.audio.payloads import SpeechSchema
from app.audio.providers import Busy, ProviderFailed
from app.audio.providers import Unavailable as ProviderUnavailable
from app.common.body import json_object, query_int, query_text, validated
from app.common.failures import ApiError, NotFound, Unavailable, UpstreamFailed

bp = Blueprint("api", __name__, url_prefix="/api/audio")


def _providers():
    return current_app.extensions["audio"]


# nginx keeps the probe routes' answers this long (its micro-cache, nginx/sites/audio.conf.j2).
MICRO_CACHE_SECONDS = 1


def _capabilities():
    """The providers' states, and how long a cache may keep them: no longer than the
    soonest of their probe results stays fresh, so nginx never serves an answer past
    its probe interval."""
    providers = _providers()
    states, cacheable = {}, MICRO_CACHE_SECONDS
    for role, provider, probe in (
        ("speech", providers.speech, providers.speech_probe),
        ("soundlib", providers.soundlib, providers.soundlib_probe),
    ):
        result = probe.state()
        states[role] = {"available": result.available, "reason": result.reason, "provider": provider.name}
        cacheable = min(cacheable, max(0, int(probe.expires_in(result))))
    return states, {"X-Accel-Expires": str(cacheable)}


def _require(provider, probe):
    """503 with the probe's reason when the provider is known to be unavailable."""
    result = probe.state()
    if not result.available:
        raise Unavailable(f"{provider.name} is unavailable: {result.reason}")


def _ask(fn, *args, lookup_status=404, lookup_field=None):
    """Call a provider, turning its failures into the API's errors."""
    try:
        return fn(*args)
    except Busy as exc:
        raise Unavailable(exc.reason, retry_after=1) from None
    except ProviderUnavailable as exc:
        raise Unavailable(exc.reason) from None
    except ProviderFailed as exc:
        raise UpstreamFailed(str(exc)) from None
    except LookupError as exc:
        message = f"{lookup_field}: {exc}" if lookup_field else str(exc)
        raise ApiError(lookup_status, message, field=lookup_field) from None


@bp.get("/health")
def health():
    """Liveness: `{"status": "ok"}` while the process answers."""
    return {"status": "ok"}


@bp.get("/ready")
def ready():
    """Readiness: 200 while speech can be synthesized, else 503 `degraded`; both with each provider's state."""
    capabilities, cache = _capabilities()
    if capabilities["speech"]["available"]:
        return {"status": "ok", "providers": capabilities}, 200, cache
    return {"status": "degraded", "providers": capabilities}, 503, cache


@bp.get("/capabilities")
def capabilities():
    """What the configured speech engine and sound library can do now (probed, cached a short while)."""
    states, cache = _capabilities()
    return {"version": 1, **states}, 200, cache


@bp.get("/voices")
def voices():
    """The speech engine's voices, optionally of one `locale`."""
    locale = query_text(request.args, "locale", 35)
    providers = _providers()
    _require(providers.speech, providers.speech_probe)
    return {"provider": providers.speech.name, "voices": _ask(providers.speech.voices, locale)}


@bp.post("/speech")
def speech():
    """Synthesize `text` with a voice, rate, pitch and volume; answers the MP3 (400 for an unknown voice)."""
    data = validated(SpeechSchema(), json_object(MAX_BODY_BYTES))
    providers = _providers()
    _require(providers.speech, providers.speech_probe)
    with current_app.extensions["audio_limits"].admit():
        audio = _ask(
            providers.speech.synthesize,
            data["text"],
            data["voiceId"],
            data["rate"],
            data["pitch"],
            data["volume"],
            lookup_status=400,
            lookup_field="voiceId",
        )
    return Response(audio, mimetype="audio/mpeg", headers={"X-Speech-Provider": providers.speech.name})


@bp.get("/soundlib/search")
def search():
    """Search the sound library for `q` (up to `results`, 1 to 20)."""
    query = query_text(request.args, "q", 120, required=True)
    results = query_int(request.args, "results", 10, minimum=1, maximum=20)
    providers = _providers()
    _require(providers.soundlib, providers.soundlib_probe)
    return {"provider": providers.soundlib.name, "results": _ask(providers.soundlib.search, query, results)}


@bp.get("/soundlib/preview/<path:sound_id>")
def preview(sound_id):
    """A sound's preview audio; `sound_id` is `<library>:<key>` of the configured library (404 otherwise)."""
    providers = _providers()
    library, _, key = sound_id.partition(":")
    if library != providers.soundlib.name or not key:
        raise NotFound(f"no sound {sound_id!r} in the {providers.soundlib.name} library")
    _require(providers.soundlib, providers.soundlib_probe)
    content_type, audio, identity = _ask(providers.soundlib.preview, key)
    return Response(audio, mimetype=content_type, headers={"X-Preview-Identity": identity})

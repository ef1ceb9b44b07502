"""Audio service (spec 001, part B): speech synthesis, voices, and a sound library
with preview, every route under /api/audio/. Providers are chosen by
configuration; one that is not configured or not reachable is reported
unavailable, never faked. Routes: `api`, with its own blueprint; the request rules
of every route: `middleware`."""

import logging

from app.common.errors import error_with_field

log = logging.getLogger("bundle.audio")

error_body = error_with_field  # {"error": message, "field"?: name}


def init_app(app):
    from app.audio import api, middleware
    from app.audio.limits import SpeechLimits
    from app.audio.service import build_providers, probe_states
    from app.audio.settings import AudioSettings
    from app.common import metrics, readiness

    settings = AudioSettings.from_env(app.config["DATA_DIR"])
    app.config["AUDIO"] = settings
    app.extensions["audio"] = build_providers(settings)
    probe_states.providers = app.extensions["audio"]
    metrics.on_scrape(probe_states)  # each provider's probe state, read at each scrape
    app.extensions["audio_limits"] = SpeechLimits(settings.speech_per_minute, settings.speech_per_address)
    middleware.register(app)  # the request rules of every route, /readyz's too
    readiness.register(app, redis=True)
    # The spec's routes are all under /api/audio/ (its readiness: /api/audio/ready); the
    # bundle's /readyz, which every service answers, is the app's own.
    app.add_url_rule("/readyz", view_func=readiness.readyz)
    app.register_blueprint(api.bp)
    if not settings.public_origin:
        log.warning("AUDIO_PUBLIC_ORIGIN is not set: every request that sends an Origin is refused")

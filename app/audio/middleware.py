"""The audio service's request rules, in the spec's order, for every route:

1. a present `Origin` must equal AUDIO_PUBLIC_ORIGIN exactly (403);
2. voices, speech, soundlib/search and soundlib/preview need `X-App-Request: 1` (403);
3. speech needs the content type exactly `application/json` (415);
4. bodies over 8192 bytes are refused before they are read whole (413), also
   when no length is declared;
5. a `Range` header on preview is 416.

Every response then carries `X-Content-Type-Options: nosniff` and
`Cache-Control: no-store` (rejections too: a superset of the spec's rule).
"""

from flask import current_app, request

from app.common.body import read_body
from app.common.failures import ApiError, Forbidden, UnsupportedType

MAX_BODY_BYTES = 8192
APP_ONLY = ("voices", "speech", "soundlib/search", "soundlib/preview")
PREFIX = "/api/audio/"


def _route(path):
    return path[len(PREFIX) :] if path.startswith(PREFIX) else None


def check_request():
    settings = current_app.config["AUDIO"]
    origin = request.headers.get("Origin")
    if origin is not None and origin != settings.public_origin:
        raise Forbidden("this origin is not allowed", field="Origin")
    route = _route(request.path) or ""
    if route.startswith(APP_ONLY) and request.headers.get("X-App-Request") != "1":
        raise Forbidden("the X-App-Request: 1 header is required", field="X-App-Request")
    if route == "speech" and request.headers.get("Content-Type") != "application/json":
        raise UnsupportedType("the content type must be exactly application/json", field="Content-Type")
    if request.content_length is not None or request.headers.get("Transfer-Encoding"):
        read_body(MAX_BODY_BYTES)  # kept for the route; 413 past the limit, declared or not
    if route.startswith("soundlib/preview") and "Range" in request.headers:
        raise ApiError(416, "byte ranges are not supported on previews", field="Range")


def add_headers(response):
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "no-store"
    return response


def register(app):
    app.before_request(check_request)
    app.after_request(add_headers)

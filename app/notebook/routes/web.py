"""What every request goes through: CORS, then the password (Bearer or X-Password)."""

import hmac

from flask import make_response, request

from app.common.failures import Forbidden, Unauthenticated

# Routes anyone may read: the health and readiness checks, the metrics (loopback only:
# nginx never serves them), the documentation, and what Open Notebook's UI reads before
# it has a password (its configuration, whether a password is needed).
PUBLIC_ENDPOINTS = {
    "health",
    "healthz",
    "readyz",
    "metrics",
    "docs_page",
    "openapi_document",
    "docs_vendor",
    "static",
    "frontend_config",
    "auth_status",
}
# What a browser may send cross-origin: Open Notebook's UI sends Authorization and
# Content-Type (JSON), Cache-Control (on /auth/status) and Accept (SSE); ours X-Password
# and X-Request-Id. PATCH for clients of Open Notebook's API (its server allows any method).
ALLOWED_HEADERS = "Accept, Authorization, Cache-Control, Content-Type, X-Password, X-Request-Id"
ALLOWED_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"


def _endpoint_name():
    endpoint = request.endpoint or ""
    return endpoint.rsplit(".", 1)[-1]


def _presented_password():
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("X-Password") or None


def check_password(settings):
    if not settings.auth_enabled or _endpoint_name() in PUBLIC_ENDPOINTS:
        return
    presented = _presented_password()
    if presented is None:
        raise Unauthenticated("Missing credentials: send Authorization: Bearer <password>")
    # Constant time: compare digests of equal length whatever the input's length.
    if not hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), settings.password.encode("utf-8")):
        raise Unauthenticated("Invalid password")


def _allowed_origin(settings, origin):
    if not origin or not settings.cors_origins:
        return None
    if "*" in settings.cors_origins or origin.rstrip("/") in settings.cors_origins:
        return origin
    return None


def _preflight(settings):
    origin = request.headers.get("Origin")
    if not _allowed_origin(settings, origin):
        raise Forbidden(
            f"cross-origin requests from {origin!r} are not allowed"
            if origin
            else "a preflight request needs an Origin"
        )
    response = make_response("", 204)
    response.headers["Access-Control-Allow-Methods"] = ALLOWED_METHODS
    response.headers["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
    response.headers["Access-Control-Max-Age"] = "600"
    return response


def register(app, settings):
    @app.before_request
    def guard():
        if request.method == "OPTIONS" and request.headers.get("Access-Control-Request-Method"):
            return _preflight(settings)
        check_password(settings)
        return None

    @app.after_request
    def decorate(response):
        origin = _allowed_origin(settings, request.headers.get("Origin"))
        if origin:
            # The origin itself rather than "*", so that it is right with or without credentials.
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = "X-Request-Id, Content-Disposition"
        if settings.cors_origins:
            response.headers.add("Vary", "Origin")
        if response.status_code == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="notebook"'
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response

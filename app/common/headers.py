"""Security headers on every answer of every service, set in one place.

Every response gets `X-Content-Type-Options: nosniff`, `X-Frame-Options: DENY`,
`Referrer-Policy: same-origin` and a strict `Content-Security-Policy` (POLICY): our
pages load scripts, styles, images and data from their own origin only, run no inline
script, are framed by nobody and post forms to themselves only.

A page that needs more (a vendored UI that injects styles) says so per route with
`@content_security_policy(style_src="'self' 'unsafe-inline'")`; a CSP a route set
itself is never overwritten. Answers of the workspace's app proxy are the apps' own
pages: the route marks them with `request.environ[APP_PROXY] = True` and gets none of
these headers (the proxy sets its own, such as a sandbox CSP).
"""

import functools
from collections.abc import Callable
from typing import Any, ParamSpec

from flask import Flask, Response, make_response, request

# Set to True in the WSGI environ by the routes that pass an app's answer through.
APP_PROXY = "bundle.app_proxy"
P = ParamSpec("P")

POLICY = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data: blob:",  # blob: the wizard's preview of a picked file
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "frame-ancestors": "'none'",
    "form-action": "'self'",
}

HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


def policy(**changes: str) -> str:
    """POLICY as a header value, with `changes` (`style_src="..."` for style-src)
    replacing or adding directives."""
    directives = dict(POLICY, **{name.replace("_", "-"): value for name, value in changes.items()})
    return "; ".join(f"{name} {value}" for name, value in directives.items())


DEFAULT = policy()


def content_security_policy(**changes: str) -> Callable[[Callable[P, Any]], Callable[P, Response]]:
    """A view decorator: this route's pages answer with policy(**changes)."""
    value = policy(**changes)

    def decorate(view: Callable[P, Any]) -> Callable[P, Response]:
        @functools.wraps(view)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Response:
            response = make_response(view(*args, **kwargs))
            response.headers.setdefault("Content-Security-Policy", value)
            return response

        return wrapper

    return decorate


def add_headers(response: Response) -> Response:
    if request.environ.get(APP_PROXY):
        return response
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    response.headers.setdefault("Content-Security-Policy", DEFAULT)
    return response


def register(app: Flask) -> None:
    app.after_request(add_headers)

"""The address a request came from. nginx in front sets X-Real-IP; the header is
believed only when the direct peer is loopback (nginx on the same host), never
from a client on the network."""

import ipaddress
from collections.abc import Mapping
from typing import Any

from flask import request


def is_loopback(address: str | None) -> bool:
    try:
        return ipaddress.ip_address(address or "").is_loopback
    except ValueError:
        return False


def client_address(environ: Mapping[str, Any] | None = None) -> str:
    """Of this request, or of the WSGI `environ` given (a path that runs without Flask's)."""
    environ = request.environ if environ is None else environ
    peer: str = environ.get("REMOTE_ADDR") or ""
    forwarded: str = environ.get("HTTP_X_REAL_IP", "").strip()
    if forwarded and is_loopback(peer):
        try:
            return str(ipaddress.ip_address(forwarded))
        except ValueError:
            return peer
    return peer

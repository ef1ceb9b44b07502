"""The notebook's side of app.common.provider_http: its Target, its error type, its
wording (never the provider's own text: OpenAI echoes part of a wrong key in its;
429 is our 503) and the SSRF guard of a base URL, which is remembered for
`CHECK_TTL_S` (per URL and allow-list; a changed URL is checked anew). Each call's
deadline starts at the call and lasts the Target's `timeout`; connections are kept
alive in one pool per (provider, base URL)."""

import time

from app.common import provider_http
from app.notebook.ingest import ssrf

CHECK_TTL_S = 60.0  # how long a base URL's SSRF check holds (a name may resolve elsewhere later)


class ProviderError(provider_http.ProviderFailed):
    """A model call failed: `status` is what our API answers (502 bad answer or
    refused, 503 rate limited, 504 too slow), the message says why without secrets."""


class Target:
    """Where and how to call: provider kind, base URL, API key (plain, in memory
    only), time-outs, the networks a local model server may be on, and Ollama's
    context window (num_ctx, None for the server's default)."""

    def __init__(self, provider, base_url, api_key, timeout, connect_timeout, allowlist, num_ctx=None):
        self.provider, self.base_url, self.api_key = provider, base_url.rstrip("/"), api_key or ""
        self.timeout, self.connect_timeout, self.allowlist = timeout, connect_timeout, allowlist
        self.num_ctx = num_ctx

    def url(self, path):
        return self.base_url + path


class Wording(provider_http.Wording):
    """The notebook's wording of a provider's failures."""

    error = ProviderError

    def refused(self, code, exchange):
        if code == 429:
            return self.fail(503, "{name} is rate limiting this key (HTTP 429); try again later")
        if code == 404:
            return self.fail(502, "{name} does not know this model or route (HTTP 404)")
        return super().refused(code, exchange)


def check_base_url(url, allowlist):
    """The SSRF guard of links, applied to a provider's base URL; ProviderError 400."""
    try:
        ssrf.check_url(url, allowlist)
    except ssrf.LinkRefused as exc:
        raise ProviderError(
            400, f"base_url: {exc} (a local model server's network must be in NOTEBOOK_MODEL_HOST_ALLOWLIST)"
        ) from None


_checked: dict[tuple[str, tuple[object, ...]], float] = {}  # (base URL, allow-list networks) → good until


def _check_target(target):
    """check_base_url, remembered for CHECK_TTL_S per (base URL, allow-list)."""
    key = (target.base_url, tuple(target.allowlist))
    now = time.monotonic()
    if _checked.get(key, 0.0) > now:
        return
    check_base_url(target.base_url, target.allowlist)
    if len(_checked) >= 256:
        _checked.clear()
    _checked[key] = now + CHECK_TTL_S


def open_exchange(target, wording, method, path, headers, body=None):
    """The opened Exchange of one call, its failures worded by `wording` (a Wording)."""
    deadline = provider_http.Deadline(target.timeout)  # from the call on, the SSRF check's look-up too
    _check_target(target)
    exchange = provider_http.Exchange(wording, deadline, target.base_url, target.connect_timeout, pool=target.provider)
    return exchange.open(method, target.url(path), headers, body)


def _open(target, name, method, path, headers, body=None):
    return open_exchange(target, Wording(name), method, path, headers, body)


def call_json(target, name, method, path, headers, body=None):
    """A JSON answer (dict or list); ProviderError otherwise."""
    with _open(target, name, method, path, headers, body) as exchange:
        return exchange.json()


def call_bytes(target, name, method, path, headers, body, limit):
    with _open(target, name, method, path, headers, body) as exchange:
        return exchange.body(limit), exchange.header("Content-Type")


def stream_lines(target, name, method, path, headers, body):
    """The answer's lines as they come; the connection is closed when done or dropped."""
    with _open(target, name, method, path, headers, body) as exchange:
        yield from exchange.lines()


def stream_records(target, name, method, path, headers, body):
    """The answer's server-sent events as they come; the connection is closed when
    done or dropped."""
    with _open(target, name, method, path, headers, body) as exchange:
        yield from exchange.records()


def malformed(name, what):
    return ProviderError(502, f"{name}'s answer is malformed: {what}")

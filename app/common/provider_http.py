"""HTTP to a language-model provider, written once for the wizard and the notebook
(no Flask, no service): deadlines, kept-alive connections, failures turned into a
status and a readable message, bodies read in capped chunks, JSON, redaction.

Time: the caller gives a Deadline (absolute: the wizard's covers its whole call,
queue and repair included; the notebook's starts at the call). A connection waits
at most `connect_timeout`; the rest of the answer is bounded by the deadline. A
provider that drips its answer a byte at a time cannot outlast it: bodies are read
with `read1` (one socket read at a time) and the deadline is checked between reads.
Under gevent (the web workers) the wait for the response's head is also bounded as
a whole by a gevent.Timeout; plain threads (the notebook's job worker, tests, CLIs)
bound it per socket read. requests is cooperative in the web workers (gunicorn's
gevent worker patches the socket module before the app is imported): a model's long
think holds a greenlet, never the loop or a thread.

Connections are kept alive: one requests.Session per pool key (a provider and base
URL), shared by the loop thread's greenlets (or plain threads), with a pool large
enough for hundreds of concurrent calls (beyond it, extra connections are opened and
closed, never waited for): a new TCP connection and Session per call cost more CPU
than the rest of the call. (A call from a gevent threadpool thread makes its own
Session: a gevent socket belongs to the loop of the thread that made it.) A call is a
PreparedRequest (requests' default headers and ours) handed to the session's
transport adapter, which owns the pool: the Session's own per-call merging of
settings, cookies and hooks would be a third of a call's CPU, and this way no cookie
ever joins a call, so one credential's call carries nothing of another's. Proxies and
a CA bundle from the environment join a call only where its caller asks
(`Exchange(..., environment=True)`: the wizard's calls, as requests' Session took
them); the notebook's calls go straight to their provider.

Failures: every one is `wording.error(status, message)` (ProviderFailed unless the
service names its own subclass), worded by the service's Wording: 504 for time, 502
for an unreachable provider, a refusal, a cut-off, oversized or non-JSON answer. The
request (its headers carry the key) is never shown; the provider's own error text
only where the service asks for it, and then redacted."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Literal, cast
from urllib.parse import urljoin, urlsplit

import gevent
import requests
from gevent import monkey
from requests.adapters import HTTPAdapter

from app.common.failures import ApiError
from app.common.sse_client import Record
from app.common.sse_client import records as sse_records

READ_SIZE = 64 * 1024
MAX_JSON_BYTES = 32 * 1024 * 1024
ERROR_BODY_BYTES = 16 * 1024  # of a refusal's body, read for the provider's own words
POOL_SIZE = 512  # idle keep-alive connections kept per provider host
MAX_SESSIONS = 32  # distinct pool keys; the oldest is dropped past it
REDIRECTS = (301, 302, 303, 307, 308)
SECRETISH = re.compile(r"\b(sk|pk|key|api|token|bearer)[-_A-Za-z0-9*.]{6,}", re.IGNORECASE)


class ProviderFailed(ApiError):
    """A provider call failed: `status` is what our API answers (a Failure that
    app.common.errors answers as any other), `message` is safe to show."""


class DeadlinePassed(Exception):
    """Deadline.remaining() found no time left (the transport words it as a 504)."""


class Deadline:
    """One absolute deadline on the monotonic clock; `seconds` is the budget it was
    given (for messages), `started` when it was set."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()
        self.at = self.started + seconds

    def remaining(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise DeadlinePassed()
        return left

    def passed(self) -> bool:
        return self.at <= time.monotonic()

    def elapsed_ms(self) -> int:
        return int(round((time.monotonic() - self.started) * 1000))


class Wording:
    """What a service's provider failures say. A service subclasses it to change the
    templates (fields: name, answer, seconds, connect, base_url, cause, kind, limit,
    code), the exception type (`error`), or the answer to a refusal (`refused`).
    `show_text` adds the provider's own error message to a refusal, redacted of
    `api_key` and of anything key-like."""

    error: type[ApiError] = ProviderFailed  # a service's own may be any ApiError
    timed_out = "{name} did not answer within {seconds:g} s"
    connect_timed_out = "{name} could not be reached within {connect:g} s"
    unreachable = "{name} could not be reached at {base_url} (connection refused or reset)"
    call_failed = "{name} could not be called: {kind}"
    cut_off = "{name} broke off its answer ({kind})"
    too_large = "{answer} is larger than {limit} bytes"
    not_json = "{name} answered something that is not JSON"

    def __init__(self, name: str, *, answer: str | None = None, show_text: bool = False, api_key: str = "") -> None:
        self.name, self.answer = name, answer or f"{name}'s answer"
        self.show_text, self.api_key = show_text, api_key

    def fail(self, status: int, template: str, **fields: Any) -> ApiError:
        return self.error(status, template.format(name=self.name, answer=self.answer, **fields))

    def too_late(self, deadline: Deadline) -> ApiError:
        """The 504 of a passed deadline."""
        return self.fail(504, self.timed_out, seconds=deadline.seconds)

    def refused(self, code: int, exchange: Exchange) -> ApiError:
        """The failure of a non-2xx answer: 502, saying why without secrets."""
        if code in (401, 403):  # providers echo part of a wrong key: say nothing of it
            return self.fail(502, "{name} rejected the API key (HTTP {code})", code=code)
        detail = exchange.error_text(self.api_key) if self.show_text else ""
        return self.error(502, f"{self.name} answered HTTP {code}" + (f": {detail}" if detail else ""))


def redacted(text: str, api_key: str = "") -> str:
    """A provider's message made safe to show: no key, nothing key-like, one short line."""
    if api_key:
        text = text.replace(api_key, "***")
    return SECRETISH.sub("***", " ".join(text.split()))[:200]


def error_text(payload: object, api_key: str = "") -> str:
    """The redacted `error` (or `error.message`) of a provider's JSON, or ""."""
    error = payload.get("error") if isinstance(payload, dict) else None
    text = error.get("message") if isinstance(error, dict) else error
    return redacted(text, api_key) if isinstance(text, str) else ""


def _cause(exc: BaseException) -> str:
    text = str(exc).lower()
    for words, label in (
        ("refused", "connection refused"),
        ("reset", "connection reset"),
        ("aborted", "connection closed"),
        ("remotedisconnected", "connection closed"),
        ("name or service", "unknown host"),
        ("resolution", "unknown host"),
        ("ssl", "TLS error"),
        ("certificate", "TLS error"),
    ):
        if words in text:
            return label
    return "connection failed"


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def same_origin(url: str, other: str) -> bool:
    return _origin(url) == _origin(other)


# -- the pools ---------------------------------------------------------------------------

_sessions: dict[tuple[str, str], requests.Session] = {}
_lock = threading.Lock()  # gevent's under the web worker, a real one in plain threads
_native_ident: Callable[[], int] = monkey.get_original("_thread", "get_ident")
# Under gevent a socket belongs to the loop of the thread that made it: the pooled
# ones are the loop thread's (the worker's main thread, which imports the app).
_LOOP_THREAD = _native_ident() if monkey.is_module_patched("socket") else None
_DEFAULT_HEADERS = dict(requests.utils.default_headers())  # what a Session would add


def _new_session(pool_size: int = 10) -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # no proxy from the environment carries our keys elsewhere
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=pool_size, pool_block=False)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _shared_session(key: tuple[str, str]) -> requests.Session | None:
    """The keep-alive Session of `key`, shared by the greenlets of the loop thread or
    by plain threads; None in a gevent threadpool thread (which makes its own)."""
    if _LOOP_THREAD is not None and _native_ident() != _LOOP_THREAD:
        return None
    session = _sessions.get(key)
    if session is None:
        with _lock:
            session = _sessions.get(key)
            if session is None:
                session = _new_session(POOL_SIZE)
                if len(_sessions) >= MAX_SESSIONS:
                    _sessions.pop(next(iter(_sessions))).close()
                _sessions[key] = session
    return session


def _environment_settings(url: str) -> tuple[dict[str, str], str | bool]:
    """What a requests Session would take from the environment for `url`: the proxies
    (HTTP(S)_PROXY, NO_PROXY) and the CA bundle (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE)."""
    verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    return requests.utils.get_environ_proxies(url), verify


class _HeadTimeout(BaseException):
    """Raised by gevent.Timeout; a BaseException so that no library catches it."""


def _head_deadline(seconds: float) -> AbstractContextManager[object]:
    """The wait for a response's head as a whole, where sockets are gevent's."""
    if monkey.is_module_patched("socket"):
        return gevent.Timeout(seconds, _HeadTimeout)
    return contextlib.nullcontext()


# -- one exchange ------------------------------------------------------------------------


class Exchange:
    """One request and its response, read within `deadline`, through the pool of
    (`pool`, `base_url`); failures are `wording`'s. Use it as a context manager, or
    close() it: a body left part-read closes its connection."""

    def __init__(
        self,
        wording: Wording,
        deadline: Deadline,
        base_url: str,
        connect_timeout: float,
        pool: str = "",
        environment: bool = False,
    ) -> None:
        self.wording, self.deadline, self.base_url = wording, deadline, base_url
        self.connect_timeout, self.pool = connect_timeout, pool
        self.environment = environment  # take proxies and the CA bundle from the environment
        self.response: requests.Response | None = None

    def __enter__(self) -> Exchange:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    def _timed_out(self) -> ApiError:
        return self.wording.too_late(self.deadline)

    def _remaining(self) -> float:
        try:
            return self.deadline.remaining()
        except DeadlinePassed:
            raise self._timed_out() from None

    def open(self, method: str, url: str, headers: Mapping[str, str], body: Any = None, redirects: int = 0) -> Exchange:
        """Sends the request (`body` as JSON) and reads the response's head; a non-2xx
        answer is the wording's refusal. Up to `redirects` redirections are followed as
        requests follows them (307 and 308 keep the method and body, the others become
        a GET), the Authorization header only within its origin."""
        wording = self.wording
        left = self._remaining()
        timeout = (min(self.connect_timeout, left), left)
        shared = _shared_session((self.pool, self.base_url))
        own = shared is None
        session = _new_session() if shared is None else shared
        try:
            request = requests.PreparedRequest()
            request.prepare(method=method, url=url, headers={**_DEFAULT_HEADERS, **headers}, json=body)
            proxies, verify = _environment_settings(url) if self.environment else ({}, True)
            with _head_deadline(left):
                self.response = session.get_adapter(cast(str, request.url)).send(  # prepare() set the URL
                    request, stream=True, timeout=timeout, verify=verify, proxies=proxies
                )
        except _HeadTimeout:
            raise self._timed_out() from None
        except requests.exceptions.ConnectTimeout:
            raise wording.fail(
                504, wording.connect_timed_out, seconds=self.deadline.seconds, connect=self.connect_timeout
            ) from None
        except requests.exceptions.ReadTimeout:
            raise self._timed_out() from None
        except requests.exceptions.ConnectionError as exc:
            raise wording.fail(502, wording.unreachable, base_url=self.base_url, cause=_cause(exc)) from None
        except requests.RequestException as exc:
            raise wording.fail(502, wording.call_failed, kind=type(exc).__name__) from None
        finally:
            if own:
                session.close()  # its idle connections; the one of this response closes with it
        code = self.response.status_code
        location = self.response.headers.get("Location")
        if code in REDIRECTS and redirects > 0 and location:
            self.close()
            target = urljoin(url, location)
            if not same_origin(target, url):
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            if code not in (307, 308):
                method, body = "GET", None
            return self.open(method, target, headers, body, redirects - 1)
        if not 200 <= code < 300:
            try:
                raise wording.refused(code, self)
            finally:
                self.close()
        return self

    def _opened(self) -> requests.Response:
        assert self.response is not None, "open() the exchange first"
        return self.response

    def header(self, name: str) -> str:
        return self._opened().headers.get(name, "")

    def chunks(self) -> Iterator[bytes]:
        """The body's bytes as they come (decoded if compressed), one socket read at a
        time, within the deadline."""
        raw = self._opened().raw
        try:
            while True:
                self._remaining()
                data = raw.read1(READ_SIZE, decode_content=True)
                if not data:
                    return
                yield data
        except self.wording.error:
            raise
        except Exception as exc:  # requests', urllib3's and the socket's errors alike
            if self.deadline.passed() or "timed out" in str(exc).lower():
                raise self._timed_out() from None
            raise self.wording.fail(502, self.wording.cut_off, kind=type(exc).__name__) from None

    def lines(self) -> Iterator[str]:
        """The body's lines (NDJSON), decoded, as they come."""
        pending = b""
        for data in self.chunks():
            pending += data
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line.rstrip(b"\r").decode("utf-8", errors="replace")
        if pending:
            yield pending.decode("utf-8", errors="replace")

    def records(self) -> Iterator[Record]:
        """The body's server-sent events as they come (app.common.sse_client's parser)."""
        return sse_records(self.chunks())

    def body(self, limit: int = MAX_JSON_BYTES) -> bytes:
        """The whole body; the wording's too_large past `limit` bytes."""
        collected = bytearray()
        for data in self.chunks():
            collected += data
            if len(collected) > limit:
                raise self.wording.fail(502, self.wording.too_large, limit=limit)
        return bytes(collected)

    def json(self, limit: int = MAX_JSON_BYTES, loads: Callable[[bytes], Any] = json.loads) -> Any:
        """The body parsed by `loads` (a service may move large parses off its loop)."""
        try:
            return loads(self.body(limit))
        except ValueError:
            raise self.wording.fail(502, self.wording.not_json) from None

    def error_text(self, api_key: str = "") -> str:
        """The provider's own message in a refusal's body, redacted; "" when there is
        none or it cannot be read."""
        try:
            head = bytearray()
            for data in self.chunks():
                head += data
                if len(head) >= ERROR_BODY_BYTES:
                    break
            return error_text(json.loads(bytes(head[:ERROR_BODY_BYTES])), api_key)
        except Exception:  # any unreadable error body: the status alone says enough
            return ""

    def close(self) -> None:
        """A body read to its end has given its connection back to the pool already;
        one left part-read (a failure, a gone client) closes it."""
        if self.response is not None:
            self.response.close()

"""HTTP to a model provider: one place for the time-outs, the SSRF guard and the
errors every adapter shares.

Time: `connect_timeout` to connect, then one overall deadline for the whole
answer. A provider that drips its answer a byte at a time cannot outlast the
deadline: bodies are read with `read1` (one socket read at a time) and the
deadline is checked between reads. Under gevent (the web workers) the wait for
the response's head is also bounded as a whole by a gevent.Timeout; the job
worker (plain threads) bounds it per socket read.

requests is cooperative in the web workers (gunicorn's gevent worker patches the
socket module before the app is imported): a model's long think holds a greenlet,
never the loop or a thread.

Connections are kept alive: one requests.Session per (provider, base URL), shared
by the web worker's greenlets (or the job worker's threads), with a pool large
enough for hundreds of concurrent calls (beyond it, extra connections are opened
and closed, never waited for): a new TCP connection and Session per call cost more
CPU than the rest of the call. (A call from a gevent threadpool thread still makes
its own Session: a gevent socket belongs to the loop of the thread that made it.)
A call is a PreparedRequest (requests' default headers and ours)
handed to the session's transport adapter, which owns the pool: the Session's own
per-call merging of settings, cookies and hooks would be a third of a call's CPU,
and this way no proxy from the environment and no cookie ever joins a call, so one
credential's call carries nothing of another's. The SSRF check of a base URL is
remembered for `CHECK_TTL_S` (per URL and allow-list; a changed URL is checked anew).

Errors are ProviderError with the status our API answers and a message that never
carries the provider's own text (OpenAI echoes part of a wrong key in its)."""
import contextlib
import json
import threading
import time

import gevent
import requests
from gevent import monkey
from requests.adapters import HTTPAdapter

from app.common.sse_client import records as sse_records
from app.notebook import ssrf

READ_SIZE = 64 * 1024
MAX_JSON_BYTES = 32 * 1024 * 1024
POOL_SIZE = 512     # idle keep-alive connections kept per provider host
MAX_SESSIONS = 32   # distinct (provider, base URL); the oldest is dropped past it
CHECK_TTL_S = 60.0  # how long a base URL's SSRF check holds (a name may resolve elsewhere later)


class ProviderError(Exception):
    """A model call failed: `status` is what our API answers (502 bad answer or
    refused, 503 rate limited, 504 too slow), the message says why without secrets."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


class Target:
    """Where and how to call: provider kind, base URL, API key (plain, in memory
    only), time-outs and the networks a local model server may be on."""

    def __init__(self, provider, base_url, api_key, timeout, connect_timeout, allowlist):
        self.provider, self.base_url, self.api_key = provider, base_url.rstrip("/"), api_key or ""
        self.timeout, self.connect_timeout, self.allowlist = timeout, connect_timeout, allowlist

    def url(self, path):
        return self.base_url + path


def check_base_url(url, allowlist):
    """The SSRF guard of links, applied to a provider's base URL; ProviderError 400."""
    try:
        ssrf.check_url(url, allowlist)
    except ssrf.LinkRefused as exc:
        raise ProviderError(400, f"base_url: {exc} (a local model server's network must be in "
                                 "NOTEBOOK_MODEL_HOST_ALLOWLIST)") from None


_sessions = {}
_checked = {}
_lock = threading.Lock()  # gevent's under the web worker, a real one in the job worker's threads
_native_ident = monkey.get_original("_thread", "get_ident")
# Under gevent a socket belongs to the loop of the thread that made it: the pooled
# ones are the loop thread's (the worker's main thread, which imports the app).
_LOOP_THREAD = _native_ident() if monkey.is_module_patched("socket") else None
_DEFAULT_HEADERS = dict(requests.utils.default_headers())  # what a Session would add


def _new_session(pool_size=10):
    session = requests.Session()
    session.trust_env = False  # no proxy from the environment carries our keys elsewhere
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=pool_size, pool_block=False)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _shared_session(target):
    """The keep-alive Session of the target's provider and base URL, shared by the
    greenlets of the loop thread or by plain threads (the job worker); None in a
    gevent threadpool thread, which makes a Session of its own per call."""
    if _LOOP_THREAD is not None and _native_ident() != _LOOP_THREAD:
        return None
    key = (target.provider, target.base_url)
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


def _failed_status(response, name):
    code = response.status_code
    if code in (401, 403):
        return ProviderError(502, f"{name} rejected the API key (HTTP {code})")
    if code == 429:
        return ProviderError(503, f"{name} is rate limiting this key (HTTP 429); try again later")
    if code == 404:
        return ProviderError(502, f"{name} does not know this model or route (HTTP 404)")
    return ProviderError(502, f"{name} answered HTTP {code}")


class Exchange:
    """One request and its response, read within the deadline."""

    def __init__(self, target, name):
        self.target, self.name = target, name
        self.deadline = time.monotonic() + target.timeout
        self.response = None

    def _remaining(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ProviderError(504, f"{self.name} did not answer within {self.target.timeout:g} s")
        return left

    def open(self, method, path, headers, body):
        _check_target(self.target)
        left = self._remaining()
        timeout = (min(self.target.connect_timeout, left), left)
        session = _shared_session(self.target)
        own = session is None
        if own:
            session = _new_session()
        try:
            request = requests.PreparedRequest()
            request.prepare(method=method, url=self.target.url(path), headers={**_DEFAULT_HEADERS, **headers},
                            json=body)
            with _head_deadline(left):
                self.response = session.get_adapter(request.url).send(request, stream=True, timeout=timeout)
        except _HeadTimeout:
            raise ProviderError(504, f"{self.name} did not answer within {self.target.timeout:g} s") from None
        except requests.exceptions.ConnectTimeout:
            raise ProviderError(504, f"{self.name} could not be reached within "
                                     f"{self.target.connect_timeout:g} s") from None
        except requests.exceptions.ReadTimeout:
            raise ProviderError(504, f"{self.name} did not answer within {self.target.timeout:g} s") from None
        except requests.exceptions.ConnectionError:
            raise ProviderError(502, f"{self.name} could not be reached at {self.target.base_url} "
                                     "(connection refused or reset)") from None
        except requests.RequestException as exc:
            raise ProviderError(502, f"{self.name} could not be called: {type(exc).__name__}") from None
        finally:
            if own:
                session.close()  # its idle connections; the one of this response closes with it
        if self.response.status_code >= 300:
            self.close()
            raise _failed_status(self.response, self.name)
        return self

    def chunks(self):
        """The body's bytes as they come, one socket read at a time, within the deadline."""
        raw = self.response.raw
        try:
            while True:
                self._remaining()
                data = raw.read1(READ_SIZE)
                if not data:
                    return
                yield data
        except ProviderError:
            raise
        except Exception as exc:  # requests', urllib3's and the socket's errors alike
            if "timed out" in str(exc).lower():
                raise ProviderError(504, f"{self.name} did not answer within {self.target.timeout:g} s") from None
            raise ProviderError(502, f"{self.name} broke off its answer ({type(exc).__name__})") from None

    def lines(self):
        """The body's lines (SSE and NDJSON), decoded, as they come."""
        pending = b""
        for data in self.chunks():
            pending += data
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line.rstrip(b"\r").decode("utf-8", errors="replace")
        if pending:
            yield pending.decode("utf-8", errors="replace")

    def body(self, limit=MAX_JSON_BYTES):
        collected = bytearray()
        for data in self.chunks():
            collected += data
            if len(collected) > limit:
                raise ProviderError(502, f"{self.name}'s answer is larger than {limit} bytes")
        return bytes(collected)

    def json(self):
        try:
            return json.loads(self.body())
        except ValueError:
            raise ProviderError(502, f"{self.name} answered something that is not JSON") from None

    def close(self):
        """A body read to its end has given its connection back to the pool already;
        one left part-read (a failure, a gone client) closes it."""
        if self.response is not None:
            self.response.close()


class _HeadTimeout(BaseException):
    """Raised by gevent.Timeout; a BaseException so that no library catches it."""


def _head_deadline(seconds):
    """The wait for a response's head as a whole, where sockets are gevent's."""
    if monkey.is_module_patched("socket"):
        return gevent.Timeout(seconds, _HeadTimeout)
    return contextlib.nullcontext()


def call_json(target, name, method, path, headers, body=None):
    """A JSON answer (dict or list); ProviderError otherwise."""
    exchange = Exchange(target, name).open(method, path, headers, body)
    try:
        return exchange.json()
    finally:
        exchange.close()


def call_bytes(target, name, method, path, headers, body, limit):
    exchange = Exchange(target, name).open(method, path, headers, body)
    try:
        return exchange.body(limit), exchange.response.headers.get("Content-Type", "")
    finally:
        exchange.close()


def stream_lines(target, name, method, path, headers, body):
    """The answer's lines as they come; the connection is closed when done or dropped."""
    exchange = Exchange(target, name).open(method, path, headers, body)
    try:
        yield from exchange.lines()
    finally:
        exchange.close()


def stream_records(target, name, method, path, headers, body):
    """The answer's server-sent events as they come (app.common.sse_client's parser);
    the connection is closed when done or dropped."""
    exchange = Exchange(target, name).open(method, path, headers, body)
    try:
        yield from sse_records(exchange.chunks())
    finally:
        exchange.close()


def malformed(name, what):
    return ProviderError(502, f"{name}'s answer is malformed: {what}")

"""One proxied request to a workspace app and its answer, from a WSGI environ
(no Flask: apps.py runs it from its route and from its Flask-free front).

The request goes as HTTP/1.1 on an app stream (app_streams.py): on an idle one when
the request may be sent twice (a safe method, no body), so that an app which closed
the idle connection just then is asked again on a new stream; otherwise on a new
stream. The app sees `/<path>?<query>` (on a path app the prefix stripped, given in
X-Forwarded-Prefix), Host set to its own address, and X-Forwarded-For/-Proto/-Host;
the platform's credentials never reach it (the `Workspace-Session-Token` header, the
platform's cookies and the token and ticket query parameters are removed).

The app's answer never acts on the platform: a `Set-Cookie` naming a platform cookie
(the session's, the app hosts' token, the sign-in flow's) or carrying a `Domain`
(an app sets cookies for its own host only: on an app host, a Domain would reach the
other users' apps) is dropped, as is every `X-Accel-*` header (nginx would act on
X-Accel-Redirect and its kin). That holds for the answer to an upgrade too.

Bodies stream both ways: the request body is read from the WSGI input while the
answer is already coming back (a greenlet), and a long answer is a generator. The
stream goes back to the pool when the exchange ended cleanly: no request body (see
Exchange.finish), the answer framed (Content-Length or chunked, or none by its
status) and read to its end, no `Connection: close`, nothing more from the app.
"""

import logging
from urllib.parse import urlsplit

import gevent

from app.common.clientaddr import client_address
from app.common.failures import UpstreamFailed, UpstreamTimeout
from app.workspace.access import app_hosts, sessions
from app.workspace.access.oidc import FLOW_COOKIES
from app.workspace.transport.mux import MAX_DATA, StreamClosed
from app.workspace.tunnel.app_streams import pool

log = logging.getLogger("bundle.workspace.apps")

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
}
# Replaced or removed on the way to the app (besides the hop-by-hop headers).
NOT_FORWARDED = HOP_BY_HOP | {
    "host",
    "expect",
    "content-length",
    "workspace-session-token",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-forwarded-prefix",
}
# Methods whose request may be sent again when an idle stream turned out closed.
RETRYABLE = {"GET", "HEAD", "OPTIONS"}
HEAD_LIMIT = 64 * 1024
# The platform's cookies: never sent to an app, never set by one.
PLATFORM_COOKIES = frozenset(
    prefix + name
    for name in (sessions.COOKIE, app_hosts.COOKIE, *FLOW_COOKIES)
    for prefix in ("", sessions.HOST_PREFIX)
)
# The platform's query parameters: never passed to an app.
PLATFORM_PARAMETERS = frozenset({sessions.COOKIE, app_hosts.TICKET_PARAM})
HEAD_TIMEOUT_S = 120.0


# --------------------------------------------------------------------------- the request


def forwarded_target(environ):
    """`/<path>?<query>` as the client sent it (still percent-encoded), less the
    prefix (on a path app) and the platform's parameters."""
    raw_path, _, raw_query = app_hosts.raw_uri(environ).partition("?")
    if app_hosts.ENVIRON_KEY in environ:  # the app's own host: the path is the app's
        path = raw_path.lstrip("/")
    else:
        parts = raw_path.split("/", 5)  # '', '@user', 'workspace.agent', 'apps', 'slug', rest
        path = parts[5] if len(parts) > 5 else ""
    return app_hosts.without_parameters(f"/{path}?{raw_query}", PLATFORM_PARAMETERS)


def _without_platform_cookie(value):
    pairs = [pair for pair in value.split(";") if pair.split("=", 1)[0].strip() not in PLATFORM_COOKIES]
    return ";".join(pairs).strip()


def _client_headers(environ):
    named_in_connection = {name.strip().lower() for name in environ.get("HTTP_CONNECTION", "").split(",")}
    for key, value in environ.items():
        if not key.startswith("HTTP_"):
            continue
        name = key[5:].replace("_", "-").title()
        lower = name.lower()
        if lower in NOT_FORWARDED or lower in named_in_connection:
            continue
        if lower == "cookie":
            value = _without_platform_cookie(value)
            if not value:
                continue
        yield name, value
    if environ.get("CONTENT_TYPE"):
        yield "Content-Type", environ["CONTENT_TYPE"]


def has_body(environ):
    return environ.get("CONTENT_LENGTH", "") not in ("", "0") or body_framing(environ)[1]


def body_framing(environ):
    """(header lines, chunked?) of the request body."""
    if environ.get("CONTENT_LENGTH"):
        return [f"Content-Length: {int(environ['CONTENT_LENGTH'])}"], False
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return ["Transfer-Encoding: chunked"], True
    return [], False


def request_head(environ, app_url, prefix):
    """The request's head as the app gets it. An upgrade asks for one; any other
    request leaves the connection open for the next (HTTP/1.1's default)."""
    host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")
    lines = [f"{environ['REQUEST_METHOD']} {forwarded_target(environ)} HTTP/1.1", f"Host: {urlsplit(app_url).netloc}"]
    lines += [f"{name}: {value}" for name, value in _client_headers(environ)]
    lines += [
        f"X-Forwarded-For: {client_address(environ)}",
        f"X-Forwarded-Proto: {environ['wsgi.url_scheme']}",
        f"X-Forwarded-Host: {host}",
    ]
    if app_hosts.ENVIRON_KEY not in environ:
        lines.append(f"X-Forwarded-Prefix: {prefix}")
    upgrade = environ.get("HTTP_UPGRADE")
    if upgrade:
        lines += ["Connection: Upgrade", f"Upgrade: {upgrade}"]
    else:
        lines += body_framing(environ)[0]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _send_body(stream, environ, chunked):
    """Copy the request body to the stream; True when all of it went."""
    body = environ["wsgi.input"]
    try:
        while True:
            data = body.read(MAX_DATA)
            if not data:
                break
            stream.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
        if chunked:
            stream.write(b"0\r\n\r\n")
        return True
    except StreamClosed:
        return False
    except OSError:
        stream.close("the client's request body was cut")
        return False


# --------------------------------------------------------------------------- the exchange


class Answer:
    """The app's answer: status ("code reason"), headers to pass on, body (iterable)."""

    __slots__ = ("status", "headers", "body", "exchange")

    def __init__(self, status, headers, body, exchange=None):
        self.status, self.headers, self.body, self.exchange = status, headers, body, exchange

    def close(self):
        """For an answer that will not be sent after all (its body not started): its
        stream, if still in use, is closed."""
        if self.exchange is not None:
            self.exchange.finish(False)


def exchange(environ, app, sandbox=None):
    """The app's Answer to this request (`app`: an apps.AppTarget), with
    `Content-Security-Policy: <sandbox>` added if given; raises UpstreamFailed or
    UpstreamTimeout when it cannot be had."""
    body, chunked = has_body(environ), body_framing(environ)[1]
    head = request_head(environ, app.url, app.prefix)
    reuse = environ["REQUEST_METHOD"] in RETRYABLE and not body
    while True:
        stream, reused = pool.send(app.agent_id, app.url, head, reuse=reuse)
        sender = gevent.spawn(_send_body, stream, environ, chunked) if body else None
        reader = StreamReader(stream)
        try:
            version, status, headers = reader.response_head()
        except (StreamClosed, ValueError) as exc:
            _end(stream, sender)
            if reused and not reader.received:
                reuse = False  # the app closed the idle connection as we sent: ask on a new one
                continue
            raise UpstreamFailed("The workspace app is not reachable.", detail=str(exc)) from None
        except TimeoutError:
            _end(stream, sender)
            raise UpstreamTimeout("The workspace app did not answer in time.") from None
        try:
            answer = _answer(environ, Exchange(app, stream, sender, reader), version, status, headers)
            if sandbox:
                answer.headers.append(("Content-Security-Policy", sandbox))
            return answer
        except (StreamClosed, ValueError) as exc:
            _end(stream, sender)
            raise UpstreamFailed("The workspace app is not reachable.", detail=str(exc)) from None


class Exchange:
    """A request under way on a stream: how it ends decides the stream's fate."""

    __slots__ = ("app", "stream", "sender", "reader")

    def __init__(self, app, stream, sender, reader):
        self.app, self.stream, self.sender, self.reader = app, stream, sender, reader

    def finish(self, keep):
        """`keep`: the answer was framed, read to its end, and leaves the connection open.
        A stream that carried a request body is never kept: whether the app read all of
        it (and only it) cannot be known, and what it left unread would be taken for
        the next request, maybe another user's."""
        if keep and self.sender is None and not self.reader.buffer:
            pool.give_back(self.app.agent_id, self.app.url, self.stream)
        else:
            _end(self.stream, self.sender)


def _end(stream, sender):
    stream.close()
    if sender is not None:
        sender.kill()


def _answer(environ, exchange, version, status, headers):
    names = {name.lower(): value for name, value in headers}
    chunked = "chunked" in names.get("transfer-encoding", "").lower()
    length = None if chunked or "content-length" not in names else _length(names["content-length"])
    if environ["REQUEST_METHOD"] == "HEAD" or status[:3] in ("204", "304"):
        length, chunked = 0, False
    keep = (
        version == "HTTP/1.1" and "close" not in names.get("connection", "").lower() and (chunked or length is not None)
    )
    kept = [
        (name, value)
        for name, value in headers
        if passed_on(name, value)
        and name.lower() not in HOP_BY_HOP
        and not (chunked and name.lower() == "content-length")
    ]
    reader = exchange.reader
    if length is not None and len(reader.buffer) >= length:  # all here already (a small answer)
        body = reader.exactly(length)
        exchange.finish(keep)
        return Answer(status, kept, [body] if body else [])
    return Answer(
        status,
        kept,
        _streamed_body(exchange, length, chunked, keep, f"{environ['REQUEST_METHOD']} {environ.get('PATH_INFO', '')}"),
        exchange,
    )


def passed_on(name, value):
    """Whether a header of the app's answer may reach the client (see the module's text)."""
    lower = name.lower()
    if lower.startswith("x-accel-"):
        return False
    if lower == "set-cookie":
        cookie, _, attributes = value.partition(";")
        return cookie.split("=", 1)[0].strip().strip('"') not in PLATFORM_COOKIES and not any(
            item.split("=", 1)[0].strip().lower() == "domain" for item in attributes.split(";")
        )
    return True


def upgrade_answer_head(stream):
    """The head of the app's answer to an upgrade, its headers passed_on() only, and
    whatever came after it: what the client gets before the splice. A ValueError
    unless the app switched protocols: after any other answer nginx would keep the
    connection for its next request, maybe another user's, which the splice would then
    carry to the app. A bare CR or LF would hide a header from passed_on()."""
    reader = StreamReader(stream)
    while b"\r\n\r\n" not in reader.buffer:
        if len(reader.buffer) > HEAD_LIMIT:
            raise ValueError("the app's response head is too large")
        if not reader._more(HEAD_TIMEOUT_S):
            raise ValueError("the app closed the connection without answering")
    head, rest = reader.buffer.split(b"\r\n\r\n", 1)
    status, *lines = head.decode("latin-1").split("\r\n")
    version, _, code = status.partition(" ")
    if version not in ("HTTP/1.1", "HTTP/1.0") or code[:3] != "101" or code[3:4] not in ("", " "):
        raise ValueError(f"the app answered the upgrade with {status[:60]!r}, not 101")
    if any("\r" in line or "\n" in line for line in lines):
        raise ValueError("a header of the app's answer has a bare CR or LF")
    kept = [line for line in lines if ":" in line and passed_on(*(part.strip() for part in line.split(":", 1)))]
    return ("\r\n".join([status, *kept]) + "\r\n\r\n").encode("latin-1") + rest


def _length(value):
    """A Content-Length as RFC 9110 has it: digits only (int() would take "-1" or "1_0")."""
    if not (value.isascii() and value.isdigit()):
        raise ValueError(f"the app's answer has a bad Content-Length: {value[:40]!r}")
    return int(value)


def _streamed_body(exchange, length, chunked, keep, what):
    ended = False
    try:
        yield from _body(exchange.reader, length, chunked)
        ended = True
    except (StreamClosed, ValueError) as exc:
        log.warning("%s: the app's answer was cut: %s", what, exc)
        raise
    finally:
        exchange.finish(keep and ended)


# --------------------------------------------------------------------------- the app's answer


class StreamReader:
    """Buffered reads of an HTTP/1.1 answer from a stream."""

    def __init__(self, stream):
        self.stream = stream
        self.buffer = b""
        self.received = False  # anything at all came

    def _more(self, timeout=None):
        data = self.stream.read(timeout)
        if data is None:
            raise TimeoutError()
        self.received = self.received or bool(data)
        self.buffer += data
        return bool(data)

    def response_head(self):
        """(version, status line's "code reason", [(name, value)]); 1xx interim answers skipped."""
        while True:
            while b"\r\n\r\n" not in self.buffer:
                if len(self.buffer) > HEAD_LIMIT:
                    raise ValueError("the app's response head is too large")
                if not self._more(HEAD_TIMEOUT_S):
                    raise ValueError("the app closed the connection without answering")
            head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            version, _, status = lines[0].partition(" ")
            if not version.startswith("HTTP/1.") or not (status[:3].isdigit() and status[3:4] in ("", " ")):
                raise ValueError(f"the app did not answer HTTP: {lines[0][:80]!r}")
            if not status.startswith("1"):
                # A header may not be split by a bare CR or LF (werkzeug would refuse it: a 500).
                if any("\r" in line or "\n" in line for line in lines):
                    raise ValueError("a header of the app's answer has a bare CR or LF")
                return (
                    version,
                    status,
                    [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:] if ":" in line],
                )

    def take(self, limit):
        """Up to `limit` bytes (b"" at the end); a chunk as the stream gave it when it
        fits (no copy)."""
        if not self.buffer:
            data = self.stream.read()
            if data is None:
                raise TimeoutError()
            if len(data) <= limit:
                return data
            self.buffer = data
        data, self.buffer = self.buffer[:limit], self.buffer[limit:]
        return data

    def line(self):
        while b"\r\n" not in self.buffer:
            if len(self.buffer) > HEAD_LIMIT or not self._more():
                raise ValueError("a broken chunked body")
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def exactly(self, count):
        while len(self.buffer) < count:
            if not self._more():
                raise ValueError("the app's body ended early")
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data


def _body(reader, length, chunked):
    if chunked:
        while True:
            size = int(reader.line().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                _trailers(reader)
                return
            while size:
                data = reader.take(min(size, MAX_DATA))
                if not data:
                    raise ValueError("the app's body ended early")
                size -= len(data)
                yield data
            reader.exactly(2)
    remaining = length
    while remaining is None or remaining > 0:
        data = reader.take(MAX_DATA if remaining is None else min(remaining, MAX_DATA))
        if not data:
            if remaining:
                raise ValueError("the app's body ended early")
            return
        if remaining is not None:
            remaining -= len(data)
        yield data


def _trailers(reader):
    """Read past the trailer section after the last chunk (up to its empty line), so
    that the connection is at the next answer; the trailers are not passed on."""
    while reader.line():
        pass

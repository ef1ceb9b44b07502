"""Websockets on simple-websocket (flask-sock's engine), for the platform's routes and
for the agent program.

`accept(handler)` upgrades the current request like flask-sock's `Sock.route` does,
but the route runs first: it authenticates and answers 401 (or 404, 502, ...) before
any upgrade. `route(bp, rule)` registers a view for both kinds of request: werkzeug
matches an upgrade request only to a `websocket=True` rule and a plain request only
to a plain rule (else 400 before any view runs), and a websocket route must answer
a plain request too (with its 401, or a 400 that says what it expects).

`Transport` is what the multiplexer and the terminal write through: simple-websocket's
own `send` does one `socket.send`, which may write part of a large frame, and two
greenlets sending at once would interleave their bytes. Here a frame is written
whole, under a lock.
"""
import socket

from flask import Response, request
from gevent.lock import Semaphore
from simple_websocket import ConnectionClosed, Server
from wsproto.events import BytesMessage, TextMessage

RECEIVE_BYTES = 256 * 1024


def route(bp, rule, **options):
    """Decorator: `rule` for plain requests (with `options`) and for websocket upgrades
    (GET only, as werkzeug requires of websocket rules)."""
    def register(view):
        bp.add_url_rule(rule, view_func=view, **options)
        upgrade_options = {**options, "methods": ["GET"], "websocket": True, "provide_automatic_options": False}
        bp.add_url_rule(rule, view_func=view, **upgrade_options)
        return view
    return register


def is_upgrade():
    return (request.headers.get("Upgrade", "").lower() == "websocket"
            and "upgrade" in request.headers.get("Connection", "").lower())


class _AlreadyAnswered(Response):
    """The response of a request whose connection was taken over (a websocket, a
    spliced upgrade): gunicorn writes nothing more and closes the connection, as
    with flask-sock. Status 101 is what the request log shows."""

    def __call__(self, environ, start_response):
        raise StopIteration()


def taken_over():
    return _AlreadyAnswered(status=101)


def accept(handler, max_message_size=None):
    """Upgrade this request to a websocket and run `handler(transport)` until it
    returns; then close the websocket."""
    transport = Transport(Server(request.environ, receive_bytes=RECEIVE_BYTES,
                                 max_message_size=max_message_size))
    try:
        handler(transport)
    except ConnectionClosed:
        pass
    finally:
        transport.close()
    return taken_over()


class Transport:
    """A connected simple-websocket (server or client) with whole-frame sends."""

    def __init__(self, ws):
        self.ws = ws
        self._sending = Semaphore()
        # Small frames in a row (a stream's OPEN, then its first DATA) must not wait
        # for the peer's delayed ACK (Nagle): 40 ms a request otherwise.
        try:
            ws.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    @property
    def connected(self):
        return self.ws.connected

    def send(self, data):
        """One message: bytes as a binary frame, str as a text frame."""
        message = BytesMessage(data=data) if isinstance(data, (bytes, bytearray, memoryview)) \
            else TextMessage(data=data)
        with self._sending:
            if not self.ws.connected:
                raise ConnectionClosed(self.ws.close_reason, self.ws.close_message)
            self.ws.sock.sendall(self.ws.ws.send(message))

    def receive(self, timeout=None):
        """The next message (bytes or str); None after `timeout`; ConnectionClosed at the end."""
        return self.ws.receive(timeout)

    def close(self, code=None, message=None):
        """Send a close frame if the line is free, then shut the socket down so that
        the reader (and a sender blocked on a peer that stopped reading) ends now."""
        if self._sending.acquire(timeout=1.0):
            try:
                if self.ws.connected:
                    self.ws.close(code, message)
            except (ConnectionClosed, OSError):
                pass
            finally:
                self._sending.release()
        self.ws.connected = False
        try:
            self.ws.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.ws.event.set()  # wake a reader waiting in receive()

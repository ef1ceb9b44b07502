"""The worker class of every service: gunicorn's gevent worker, with the first
request of a connection given the same time as a request (`timeout`).

gunicorn's gevent worker reads every request head under `keepalive` (2 s here),
the first one of a fresh connection included. A client whose request arrives more
than 2 s after its connect (a client process starved of CPU on a loaded machine,
a proxy that queued the write) had its connection closed with no answer, and a
POST lost that way is never retried. Here only the idle wait between the requests
of a kept-alive connection is bounded by `keepalive`; the first request may take
up to `timeout`, the bound the sync worker gives it too.

Also: a small answer's head and body go out in one send (OneSendResponse), and a
connection accepted just before the worker stops is still answered (_NamedListener).

Loaded by the arbiter before any worker forks: it imports gunicorn and gevent only
(the worker monkey-patches after the fork), never app code.
"""

import gevent
from gunicorn.http import wsgi
from gunicorn.workers.ggevent import GeventWorker

# A first body write up to this size goes out with the head; a larger one after it,
# as gunicorn does (joining them would copy the body).
ONE_SEND_BYTES = 64 * 1024


class _Held:
    """Stands in for the socket while gunicorn writes a head and a small body."""

    __slots__ = ("data",)

    def __init__(self):
        self.data = b""

    def sendall(self, data):
        self.data += data


class OneSendResponse(wsgi.Response):
    """gunicorn's response, with its head and a small first body write sent together.

    gunicorn sends the head and then each body write: two sends for most answers
    (JSON, a proxied small GET), so two segments and two wake-ups of the reader
    (nginx, or a client) where one does. All of gunicorn's own bookkeeping (the
    length, a HEAD or 304 without body, chunked framing) runs as it is; only its
    writes to the socket are gathered into one."""

    def write(self, arg):
        if self.headers_sent or not isinstance(arg, bytes) or len(arg) > ONE_SEND_BYTES:
            return super().write(arg)
        sock, held = self.sock, _Held()
        self.sock = held
        try:
            super().write(arg)
        finally:
            self.sock = sock
        if held.data:
            sock.sendall(held.data)


class _NamedListener:
    """A worker's listening socket, its name read once, at the worker's start.

    gunicorn asks the listener its name as it begins each connection's greenlet. A
    stopping worker closes its listener first (the held socket stays open in the
    arbiter, or systemd, for the next workers); a connection it had accepted just
    before, whose greenlet began after, then failed with EBADF ("Socket error
    processing request") and was closed unanswered: a few users' requests in every
    restart under load. With the name known, it is served, with `Connection: close`."""

    def __init__(self, listener):
        self._listener, self._name = listener, listener.getsockname()

    def getsockname(self):
        return self._name

    def __getattr__(self, name):
        return getattr(self._listener, name)


class Worker(GeventWorker):
    def init_process(self):
        # gunicorn's worker builds each response through wsgi.create(), which takes
        # the module's Response unless told otherwise, and the worker does not tell it.
        wsgi.Response = OneSendResponse
        super().init_process()

    def run(self):
        # The sockets as the worker serves them: gevent's, made by init_process's patch().
        self._named = {id(listener): _NamedListener(listener) for listener in self.sockets}
        super().run()

    def handle(self, listener, client, addr):
        # Each connection is served by a greenlet of its own: mark it fresh.
        gevent.getcurrent().bundle_served_a_request = False
        super().handle(self._named.get(id(listener), listener), client, addr)

    def handle_request(self, listener_name, req, sock, addr):
        gevent.getcurrent().bundle_served_a_request = True
        super().handle_request(listener_name, req, sock, addr)

    def timeout_ctx(self):
        """The bound on reading the next request head: `timeout` for a connection's
        first request, `keepalive` for the idle wait after one."""
        first = not getattr(gevent.getcurrent(), "bundle_served_a_request", True)
        return gevent.Timeout(self.cfg.timeout if first else self.cfg.keepalive, False)

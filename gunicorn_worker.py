"""The worker class of every service: gunicorn's gevent worker, with the first
request of a connection given the same time as a request (`timeout`).

gunicorn's gevent worker reads every request head under `keepalive` (2 s here),
the first one of a fresh connection included. A client whose request arrives more
than 2 s after its connect (a client process starved of CPU on a loaded machine,
a proxy that queued the write) had its connection closed with no answer, and a
POST lost that way is never retried. Here only the idle wait between the requests
of a kept-alive connection is bounded by `keepalive`; the first request may take
up to `timeout`, the bound the sync worker gives it too.

Loaded by the arbiter before any worker forks: it imports gunicorn and gevent only
(the worker monkey-patches after the fork), never app code.
"""
import gevent
from gunicorn.workers.ggevent import GeventWorker


class Worker(GeventWorker):
    def handle(self, listener, client, addr):
        # Each connection is served by a greenlet of its own: mark it fresh.
        gevent.getcurrent().bundle_served_a_request = False
        super().handle(listener, client, addr)

    def handle_request(self, listener_name, req, sock, addr):
        gevent.getcurrent().bundle_served_a_request = True
        super().handle_request(listener_name, req, sock, addr)

    def timeout_ctx(self):
        """The bound on reading the next request head: `timeout` for a connection's
        first request, `keepalive` for the idle wait after one."""
        first = not getattr(gevent.getcurrent(), "bundle_served_a_request", True)
        return gevent.Timeout(self.cfg.timeout if first else self.cfg.keepalive, False)

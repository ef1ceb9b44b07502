"""Idle app streams kept for the next request, as nginx keeps upstream connections.

An app stream is one TCP connection from the agent to an app (the agent splices raw
bytes). Without a pool each proxied request costs a stream OPEN and CLOSE, a dial by
the agent and, in a threaded app server, a new thread: most of a small request's
cost. With it, a stream whose exchange ended cleanly (no request body, the whole
answer read, framed by Content-Length or chunks, no `Connection: close`) waits here
for the next request to the same app through the same agent, whoever sends it: every
request is still authenticated and checked on its own, as nginx's pooled upstream
connections are shared across users.

A stream that waited longer than IDLE_SECONDS is closed (a greenlet sweeps while any
wait); so is one the app closed or wrote to meanwhile (a late byte would be read as
the next request's answer).
"""

import time
from collections import deque

import gevent

from app.workspace.transport.mux import StreamClosed
from app.workspace.tunnel import agents

IDLE_SECONDS = 30.0  # below the usual app servers' keep-alive timeouts, so we close first
IDLE_PER_APP = 32  # nginx's `keepalive` default is of this order


def _usable(stream):
    return stream.closed_reason is None and not stream.eof_received and not stream.chunks


class AppStreams:
    def __init__(self):
        self._idle = {}  # (agent id, app url) -> deque of (stream, since)
        self._sweeper = None  # the greenlet that sweeps while streams wait

    def send(self, agent_id, url, head, reuse=True):
        """(stream, reused?): `head` sent on an idle stream to the app when `reuse`
        and one is ready, else on a new one (with its OPEN). Raises what
        agents.open_stream raises."""
        key = (str(agent_id), url)
        idle = self._idle.get(key) if reuse else None
        deadline = time.monotonic() - IDLE_SECONDS
        while idle:
            stream, since = idle.pop()  # the most recent: the least likely to be timed out by the app
            if since >= deadline and _usable(stream):
                try:
                    stream.write(head)
                    return stream, True
                except StreamClosed:
                    pass
            stream.close()
        return agents.open_stream(agent_id, {"kind": "app", "url": url}, head), False

    def give_back(self, agent_id, url, stream):
        """`stream` finished an exchange cleanly: keep it for the next request."""
        if not _usable(stream):
            stream.close()
            return
        idle = self._idle.setdefault((str(agent_id), url), deque())
        idle.append((stream, time.monotonic()))
        if len(idle) > IDLE_PER_APP:
            idle.popleft()[0].close()
        if self._sweeper is None:
            self._sweeper = gevent.spawn(self._sweep_while_any)

    def _sweep_while_any(self):
        """Close what waited too long even when no request comes; ends with the pool."""
        try:
            while self._idle:
                gevent.sleep(IDLE_SECONDS / 2)
                self.sweep()
        finally:
            self._sweeper = None

    def sweep(self):
        """Close the streams that waited too long or broke, forget the empty apps."""
        deadline = time.monotonic() - IDLE_SECONDS
        for key, idle in list(self._idle.items()):
            kept = deque()
            for stream, since in idle:
                if since >= deadline and _usable(stream):
                    kept.append((stream, since))
                else:
                    stream.close()
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]


pool = AppStreams()

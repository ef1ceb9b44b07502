"""What the local stand-ins for outside services (devtools.fake_providers,
devtools.fake_freesound) share: a threaded HTTP server on a loopback address, run
in a daemon thread by the tests (`with Fake(...) as fake:`) or in the foreground
by their `serve` command."""

import sys
import threading
from http.server import ThreadingHTTPServer


class QuietThreadingServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # benchmarks open hundreds of connections at once

    def handle_error(self, request, client_address):
        # A caller that gave up (a time-out test) closes the socket mid-answer: expected.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def send_whole(handler, status, body, content_type, headers=()):
    """An answer of `handler` (a BaseHTTPRequestHandler) with its whole body and its length."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for name, value in headers:
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


class BackgroundServer:
    """A subclass sets `self._server` (a QuietThreadingServer) in its __init__."""

    thread_name = "fake-server"

    @property
    def port(self):
        return self._server.server_address[1]

    def start(self):
        # A short poll, so that stopping one (after every test that starts one) is quick.
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name=self.thread_name
        ).start()
        return self

    def stop(self):
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def serve_until_interrupted(self):
        try:
            self._server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self._server.server_close()

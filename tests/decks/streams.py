"""Reading a session's SSE stream in a test thread."""
import threading

import requests

from app.common.sse_client import iter_records


class StreamReader(threading.Thread):
    """Reads `url` until it has seen seq `until` (or the stream ends), keeping
    every record and comment; `.connected` is set once the response is open."""

    def __init__(self, url, until=None, headers=None, comments=False):
        super().__init__(daemon=True)
        self.url, self.until, self.headers, self.comments = url, until, headers or {}, comments
        self.seqs, self.events, self.comment_lines = [], [], []
        self.connected = threading.Event()
        self.response = None
        self.local_port = None   # the client's port: tests.decks.workers tells which worker serves it
        self.error = None

    def run(self):
        try:
            with requests.get(self.url, headers=self.headers, stream=True, timeout=(5, 60)) as response:
                self.response = response
                self.local_port = response.raw.connection.sock.getsockname()[1]
                self.connected.set()
                for record in iter_records(response, include_comments=True):
                    if record.comment is not None:
                        self.comment_lines.append(record.comment)
                        continue
                    event = record.json()
                    assert int(record.id) == event["seq"]
                    self.seqs.append(event["seq"])
                    self.events.append(event)
                    if self.until is not None and event["seq"] >= self.until:
                        return
        except Exception as exc:  # reported by the test through .error
            self.error = exc
        finally:
            self.connected.set()

    def wait_open(self, timeout=10):
        """Until the server sent its first bytes (the ': stream open' comment)."""
        assert self.connected.wait(timeout), "stream did not connect"

"""A local HTTP server that speaks the part of Freesound's API v2 the audio service
uses, for tests (the real service is outside this machine).

    with FakeFreesound(key="test-key") as fake:
        settings = ...(freesound_api_url=fake.api_url, freesound_api_key="test-key")

Routes, shaped like the real API:
- GET /apiv2/search/text/?query=&page_size=&page=&fields=  → {count, next, previous, results}
  (a sound matches when every word of the query is in its name or tags; an empty
  query matches every sound; page_size defaults to 15 and is at most 150; `fields`
  picks the keys of each result, default id,name,tags,username,license)
- GET /apiv2/sounds/<id>/?fields=                          → the sound, or 404 {"detail": "Not found."}
- Both need `Authorization: Token <key>`: missing → 401 {"detail": "Authentication
  credentials were not provided."}, wrong → 401 {"detail": "Invalid token."}.
- GET /previews/<id>-hq.mp3 and -lq.mp3 → a real MP3 (0.2 s of silence, lameenc);
  -hq.ogg and -lq.ogg → "OggS"-prefixed filler bytes labelled audio/ogg (not a
  decodable Ogg file). Previews need no token, as on the real CDN.
- GET /redirect?to=<url> → 302 to <url> (to test that redirects are checked too).

Knobs (plain attributes, change them at any time):
- key: the accepted API key.
- delay: seconds to wait before answering (see slow_on).
- drip: seconds between two pieces of the body (drip_bytes each) — a slow-drip
  server that never lets a read time-out fire; drip_headers also drips the status
  line and headers.
- slow_on: "all", "api" or "preview": which requests delay and drip apply to.
- preview_size: when set, previews are this many bytes (the MP3 padded with
  zeros); preview_content_length False sends them chunked, without Content-Length.
- preview_content_type: the Content-Type of mp3 previews (default audio/mpeg).
- down: False; True closes every connection without an answer; an int (e.g. 503)
  answers every request with that status and {"detail": ...}.
- malformed: API answers are 200 with a body that is not JSON.
- requests: every request received, as (method, path without the query);
  count(prefix) counts those whose path starts with `prefix`; queries holds
  (path, {name: value}) and authorizations (path, Authorization header or None)
  of each request, in the same order.
- sounds: the catalogue, {id: sound}; add_sound(...) adds one, with `previews`
  to override its preview URLs (e.g. pointing to another host).
"""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlencode, urlsplit

from devtools.fake_server import BackgroundServer, QuietThreadingServer

DEFAULT_FIELDS = "id,name,tags,username,license"
CC_BY = "https://creativecommons.org/licenses/by/4.0/"
CC0 = "http://creativecommons.org/publicdomain/zero/1.0/"

_mp3 = None


def silent_mp3(seconds=0.2):
    """A small valid MP3 (MPEG audio frames of silence), encoded with lameenc."""
    global _mp3
    if _mp3 is None:
        import lameenc

        encoder = lameenc.Encoder()
        encoder.set_bit_rate(32)
        encoder.set_in_sample_rate(22050)
        encoder.set_channels(1)
        encoder.set_quality(7)
        _mp3 = bytes(encoder.encode(bytes(2 * int(22050 * seconds))) + encoder.flush())
    return _mp3


class FakeFreesound(BackgroundServer):
    """Started by `with FakeFreesound(...) as server:` (devtools.fake_server)."""

    thread_name = "fake-freesound"

    def __init__(self, key="test-key"):
        self.key = key
        self.delay = 0.0
        self.drip = 0.0
        self.drip_bytes = 1
        self.drip_headers = False
        self.slow_on = "all"
        self.preview_size = None
        self.preview_content_length = True
        self.preview_content_type = "audio/mpeg"
        self.down = False
        self.malformed = False
        self.requests = []
        self.queries = []
        self.authorizations = []
        self.sounds = {}
        self._closing = threading.Event()
        self._server = QuietThreadingServer(("127.0.0.1", 0), _handler_for(self))
        for sound in (
            (1001, "Heavy rain on a tin roof", ["rain", "roof", "storm", "field-recording"], 12.5, CC0),
            (1002, "Light rain in the garden", ["rain", "garden", "ambience"], 30.25, CC_BY),
            (1003, "Rain and distant thunder", ["rain", "thunder", "storm"], 61.0, CC_BY),
            (1004, "Birds at dawn", ["birds", "morning", "forest"], 45.0, CC0),
            (1005, "Door knock", ["door", "knock", "foley"], 1.2, CC0),
        ):
            self.add_sound(*sound)

    # -- set up ------------------------------------------------------------------

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self):
        return f"{self.base_url}/apiv2"

    def add_sound(self, sound_id, name, tags, duration, license=CC0, previews=None):
        self.sounds[sound_id] = {
            "id": sound_id,
            "name": name,
            "tags": list(tags),
            "duration": float(duration),
            "license": license,
            "username": "fake-user",
            "url": f"https://freesound.org/people/fake-user/sounds/{sound_id}/",
            "previews": previews
            or {
                kind: f"{self.base_url}/previews/{sound_id}-{kind.split('-')[1]}.{kind.split('-')[2]}"
                for kind in ("preview-hq-mp3", "preview-lq-mp3", "preview-hq-ogg", "preview-lq-ogg")
            },
        }
        return self.sounds[sound_id]

    def count(self, prefix):
        return sum(1 for _, path in list(self.requests) if path.startswith(prefix))

    def stop(self):
        self._closing.set()  # dripping answers end now
        super().stop()

    # -- answers -------------------------------------------------------------------

    def _search(self, query, api_url):
        words = [w.lower() for w in (query.get("query", [""])[0]).split()]
        size = _int(query.get("page_size", ["15"])[0], 15)
        size = max(1, min(size, 150))
        page = max(1, _int(query.get("page", ["1"])[0], 1))
        fields = _fields(query)
        found = []
        for sound in sorted(self.sounds.values(), key=lambda s: s["id"]):
            haystack = " ".join([sound["name"].lower()] + [t.lower() for t in sound["tags"]])
            if all(word in haystack for word in words):
                found.append(sound)
        chunk = found[(page - 1) * size : page * size]

        def page_url(number):
            args = {k: v[0] for k, v in query.items()}
            args.update(page=number, page_size=size)
            return f"{api_url}/search/text/?{urlencode(args)}"

        return {
            "count": len(found),
            "next": page_url(page + 1) if page * size < len(found) else None,
            "previous": page_url(page - 1) if page > 1 else None,
            "results": [{k: s[k] for k in fields if k in s} for s in chunk],
        }

    def _preview_body(self, name):
        """(content type, body) of /previews/<name>, or None."""
        stem, _, ext = name.rpartition(".")
        sound_id, _, quality = stem.partition("-")
        if not sound_id.isdigit() or int(sound_id) not in self.sounds or quality not in ("hq", "lq"):
            return None
        if ext == "mp3":
            body, kind = silent_mp3(), self.preview_content_type
        elif ext == "ogg":
            body, kind = b"OggS" + bytes(512), "audio/ogg"
        else:
            return None
        if self.preview_size is not None:
            body = (body + bytes(max(0, self.preview_size - len(body))))[: self.preview_size]
        return kind, body


def _int(raw, default):
    try:
        return int(raw)
    except ValueError:
        return default


def _fields(query):
    raw = query.get("fields", [DEFAULT_FIELDS])[0] or DEFAULT_FIELDS
    return [f.strip() for f in raw.split(",") if f.strip()]


def _handler_for(fake):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "FakeFreesound/1.0"

        def log_message(self, *args):
            pass

        # -- sending, slowly when asked ------------------------------------------

        def _slow(self, kind):
            return fake.slow_on == "all" or fake.slow_on == kind

        def _pause(self, seconds):
            if seconds > 0 and fake._closing.wait(seconds):
                raise ConnectionAbortedError("the fake is closing")

        def _write(self, data, kind):
            if fake.drip > 0 and self._slow(kind):
                step = max(1, fake.drip_bytes)
                for i in range(0, len(data), step):
                    self.wfile.write(data[i : i + step])
                    self.wfile.flush()
                    self._pause(fake.drip)
            else:
                self.wfile.write(data)

        def _answer(self, status, body, content_type, kind, length=True, headers=()):
            lines = [
                f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}",
                f"Server: {self.server_version}",
                f"Content-Type: {content_type}",
            ]
            lines += [f"{k}: {v}" for k, v in headers]
            lines.append(f"Content-Length: {len(body)}" if length else "Transfer-Encoding: chunked")
            head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
            if fake.drip_headers and fake.drip > 0 and self._slow(kind):
                self._write(head, kind)
            else:
                self.wfile.write(head)
            if self.command == "HEAD":
                return
            if length:
                self._write(body, kind)
            else:
                for i in range(0, len(body), 16 * 1024):
                    piece = body[i : i + 16 * 1024]
                    self._write(b"%x\r\n" % len(piece) + piece + b"\r\n", kind)
                self._write(b"0\r\n\r\n", kind)
            self.wfile.flush()

        def _json(self, status, payload, kind="api"):
            self._answer(status, json.dumps(payload).encode(), "application/json", kind)

        # -- routing ---------------------------------------------------------------

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            parts = urlsplit(self.path)
            path, query = parts.path, parse_qs(parts.query, keep_blank_values=True)
            fake.queries.append((path, {k: v[0] for k, v in query.items()}))
            fake.authorizations.append((path, self.headers.get("Authorization")))
            fake.requests.append((self.command, path))
            kind = "preview" if path.startswith("/previews/") else "api"
            try:
                if fake.down is True:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fake.delay > 0 and self._slow(kind):
                    self._pause(fake.delay)
                if fake.down:
                    self._json(int(fake.down), {"detail": "Service temporarily unavailable."}, kind)
                    return
                self._route(path, query, kind)
            except (ConnectionError, OSError):
                self.close_connection = True

        def _route(self, path, query, kind):
            if path.startswith("/apiv2/"):
                auth = self.headers.get("Authorization", "")
                if not auth:
                    return self._json(401, {"detail": "Authentication credentials were not provided."})
                if auth != f"Token {fake.key}":
                    return self._json(401, {"detail": "Invalid token."})
                if fake.malformed:
                    return self._answer(200, b'{"count": 3, "results": [{"id": 10', "application/json", kind)
                if path == "/apiv2/search/text/":
                    return self._json(200, fake._search(query, fake.api_url))
                if path.startswith("/apiv2/sounds/") and path.endswith("/"):
                    sound_id = path[len("/apiv2/sounds/") : -1]
                    sound = fake.sounds.get(int(sound_id)) if sound_id.isdigit() else None
                    if sound is None:
                        return self._json(404, {"detail": "Not found."})
                    fields = _fields(query) if "fields" in query else list(sound)
                    return self._json(200, {k: sound[k] for k in fields if k in sound})
                return self._json(404, {"detail": "Not found."})
            if path.startswith("/previews/"):
                found = fake._preview_body(path[len("/previews/") :])
                if found is None:
                    return self._answer(404, b"Not found", "text/plain", kind)
                content_type, body = found
                return self._answer(200, body, content_type, kind, length=fake.preview_content_length)
            if path == "/redirect":
                target = query.get("to", [""])[0]
                return self._answer(302, b"", "text/plain", kind, headers=[("Location", target)])
            return self._answer(404, b"Not found", "text/plain", kind)

    return Handler

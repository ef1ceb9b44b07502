"""The online sound library: Freesound API v2 (AUDIO_SOUNDLIB_PROVIDER=freesound).

Requests carry `Authorization: Token <FREESOUND_API_KEY>`; the key is a secret and
never appears in a log, an exception message or an answer.

- Text search: GET {FREESOUND_API_URL}/search/text/?query=..&page_size=..&fields=..,
  normalized to {id: "freesound:<id>", name, tags, duration, license, preview_url},
  where preview_url is this service's own preview route, never Freesound's URL.
- Preview: GET {base}/sounds/<id>/?fields=id,name,previews, then the preview file
  (hq mp3, else lq mp3, else hq/lq ogg), read in chunks and capped by
  AUDIO_MAX_RESPONSE_BYTES.
- Deadlines: every call has one overall deadline (AUDIO_PROBE_TIMEOUT for probes,
  AUDIO_PROVIDER_TIMEOUT otherwise) enforced three ways: the connect and read
  time-outs of each socket operation, a check between body chunks (a slow-drip
  server defeats read time-outs), and a gevent.Timeout around the whole call
  (which also covers dripped headers when the app runs under gevent's patching).
- Preview URLs are only followed (redirects included, each hop checked) to the
  API's own origin, or over https to freesound.org and its subdomains; the token
  goes to the API's origin only.
"""

import http.client
import json
import re
import time
from urllib.parse import urljoin, urlsplit

import gevent
import requests
import urllib3

from app.audio.providers import PREVIEW_ROUTE, ProviderFailed, SoundLibrary, TooLarge, Unavailable, read_capped

SEARCH_FIELDS = "id,name,tags,duration,license,previews"
SOUND_FIELDS = "id,name,previews"
PREVIEW_KEYS = ("preview-hq-mp3", "preview-lq-mp3", "preview-hq-ogg", "preview-lq-ogg")
API_ANSWER_LIMIT = 1024 * 1024  # a search page of 20 results is a few KiB; JSON is parsed on the loop
CHUNK = 64 * 1024
MAX_REDIRECTS = 3
SOUND_ID = re.compile(r"[0-9]{1,15}")
# A token is sent in a header: refuse anything that could break or inject one.
KEY_SHAPE = re.compile(r"[!-~]{1,200}")
AUDIO_TYPES = re.compile(r"(audio/[a-z0-9.+-]+|application/ogg)")


class _Deadline(Exception):
    """The overall deadline of one call passed."""


class FreesoundLibrary(SoundLibrary):
    name = "freesound"

    def __init__(self, settings):
        self.settings = settings
        self.api_url = settings.freesound_api_url.rstrip("/")
        api = urlsplit(self.api_url)
        self._api_origin = (api.scheme.lower(), api.hostname or "", _port(api))
        self._session = requests.Session()

    # -- the interface -------------------------------------------------------------

    def probe(self):
        self._check_key()
        try:
            with _Call(self.settings.probe_timeout) as call:
                response = self._get_api(call, "/search/text/", {"query": "", "page_size": 1, "fields": "id"})
                try:
                    if response.status_code in (401, 403):
                        raise Unavailable("Freesound rejected the API key")
                    if response.status_code != 200:
                        raise Unavailable(f"Freesound answered HTTP {response.status_code}")
                    body = self._read_json(call, response)
                finally:
                    response.close()
        except ProviderFailed as exc:
            raise Unavailable(str(exc)) from None
        if not isinstance(body, dict) or not isinstance(body.get("results"), list):
            raise Unavailable("Freesound answered with an unexpected search result")

    def search(self, query, results):
        self._check_key()
        with _Call(self.settings.provider_timeout) as call:
            response = self._get_api(
                call, "/search/text/", {"query": query, "page_size": results, "fields": SEARCH_FIELDS}
            )
            try:
                self._check_status(response)
                body = self._read_json(call, response)
            finally:
                response.close()
        if not isinstance(body, dict) or not isinstance(body.get("results"), list):
            raise ProviderFailed("Freesound answered with an unexpected search result")
        return [_normalize(item) for item in body["results"][:results]]

    def preview(self, sound_id):
        if not isinstance(sound_id, str) or not SOUND_ID.fullmatch(sound_id):
            raise LookupError("no such Freesound sound")
        self._check_key()
        with _Call(self.settings.provider_timeout) as call:
            response = self._get_api(call, f"/sounds/{sound_id}/", {"fields": SOUND_FIELDS})
            try:
                if response.status_code == 404:
                    raise LookupError("no such Freesound sound")
                self._check_status(response)
                body = self._read_json(call, response)
            finally:
                response.close()
            if not isinstance(body, dict) or not isinstance(body.get("previews"), dict):
                raise ProviderFailed("Freesound answered with an unexpected sound record")
            key, url = _pick_preview(body["previews"])
            content_type, audio = self._download(call, url)
        if not AUDIO_TYPES.fullmatch(content_type):
            content_type = "audio/ogg" if key.endswith("ogg") else "audio/mpeg"
        return content_type, audio, f"freesound:{sound_id}"

    # -- HTTP ------------------------------------------------------------------------

    def _check_key(self):
        key = self.settings.freesound_api_key
        if not key:
            raise Unavailable("FREESOUND_API_KEY is not set")
        if not KEY_SHAPE.fullmatch(key):
            raise Unavailable("FREESOUND_API_KEY has characters that an API key cannot have")

    def _get_api(self, call, path, params):
        headers = {"Authorization": f"Token {self.settings.freesound_api_key}", "Accept": "application/json"}
        return call.get(self._session, self.api_url + path, params=params, headers=headers)

    def _read_json(self, call, response):
        limit = min(API_ANSWER_LIMIT, self.settings.max_response_bytes)
        data = read_capped(call.chunks(response), limit, "Freesound's answer")
        try:
            return json.loads(data)
        except ValueError:
            raise ProviderFailed("Freesound answered with malformed JSON") from None

    @staticmethod
    def _check_status(response):
        status = response.status_code
        if status in (401, 403):
            raise Unavailable("Freesound rejected the API key")
        if status == 429:
            raise ProviderFailed("Freesound refused the request: too many requests (HTTP 429)")
        if status != 200:
            raise ProviderFailed(f"Freesound answered HTTP {status}")

    def _is_api_origin(self, parts):
        return (parts.scheme.lower(), parts.hostname or "", _port(parts)) == self._api_origin

    def _allowed(self, url):
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None:
            return False
        if self._is_api_origin(parts):
            return True
        host = (parts.hostname or "").lower()
        return (
            parts.scheme.lower() == "https"
            and _port(parts) == 443
            and (host == "freesound.org" or host.endswith(".freesound.org"))
        )

    def _download(self, call, url):
        limit = self.settings.max_response_bytes
        for _ in range(MAX_REDIRECTS + 1):
            if not self._allowed(url):
                raise ProviderFailed("Freesound's preview URL points to a host that is not allowed")
            headers = {"Accept-Encoding": "identity", "Accept": "audio/*"}
            if self._is_api_origin(urlsplit(url)):
                headers["Authorization"] = f"Token {self.settings.freesound_api_key}"
            response = call.get(self._session, url, headers=headers)
            try:
                if response.status_code in (301, 302, 303, 307, 308) and response.headers.get("Location"):
                    url = urljoin(url, response.headers["Location"])
                    continue
                if response.status_code != 200:
                    raise ProviderFailed(f"Freesound's preview answered HTTP {response.status_code}")
                declared = response.headers.get("Content-Length", "")
                if declared.strip().isdigit() and int(declared) > limit:
                    raise TooLarge(f"Freesound's preview is larger than the limit of {limit} bytes")
                audio = read_capped(call.chunks(response), limit, "Freesound's preview")
                content_type = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
                return content_type, audio
            finally:
                response.close()
        raise ProviderFailed("Freesound's preview redirected too many times")


class _Call:
    """One call to Freesound with one overall deadline of `seconds`.

    Inside `with _Call(s) as call:` requests and body reads give up at the
    deadline; the block then raises ProviderFailed naming it. Connection errors
    are Unavailable (Freesound cannot be reached)."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self._timer = gevent.Timeout(seconds)  # a BaseException: no `except Exception` swallows it

    def __enter__(self):
        self._timer.start()
        return self

    def __exit__(self, kind, exc, tb):
        self._timer.close()
        if exc is not None and (exc is self._timer or isinstance(exc, (_Deadline, requests.Timeout))):
            raise ProviderFailed(f"Freesound did not answer within {self.seconds:g} s") from None
        if kind is not None and issubclass(kind, requests.ConnectionError):
            raise Unavailable(f"Freesound cannot be reached ({_cause(exc)})") from None
        if kind is not None and issubclass(kind, requests.RequestException):
            # Invalid URLs and the like: the class name only, never the request.
            raise ProviderFailed(f"the request to Freesound failed ({kind.__name__})") from None
        return False

    def remaining(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Deadline()
        return left

    def get(self, session, url, **kwargs):
        left = self.remaining()
        return session.get(url, timeout=(min(left, 10.0), left), stream=True, allow_redirects=False, **kwargs)

    def chunks(self, response):
        """The body's chunks as they arrive (one socket read each, so that the
        deadline is checked between reads however slowly they drip)."""
        raw = response.raw
        while True:
            self.remaining()
            try:
                chunk = raw.read1(CHUNK, decode_content=True)
            except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
                # urllib3's errors: a time-out, a cut connection, a bad encoding
                if self.deadline <= time.monotonic() or "timed out" in str(exc).lower():
                    raise _Deadline() from None
                raise ProviderFailed(f"Freesound's answer was cut off ({type(exc).__name__})") from None
            if not chunk:
                return
            yield chunk


def _port(parts):
    try:
        port = parts.port
    except ValueError:
        return -1
    return port or {"http": 80, "https": 443}.get(parts.scheme.lower(), -1)


def _cause(exc):
    """A short, secret-free description of a connection error."""
    text = str(exc).lower()
    for words, label in (
        ("refused", "connection refused"),
        ("reset", "connection reset"),
        ("aborted", "connection closed"),
        ("remotedisconnected", "connection closed"),
        ("closed connection", "connection closed"),
        ("name or service", "unknown host"),
        ("resolution", "unknown host"),
        ("ssl", "TLS error"),
        ("certificate", "TLS error"),
    ):
        if words in text:
            return label
    return "connection failed"


def _normalize(item):
    if not isinstance(item, dict) or isinstance(item.get("id"), bool) or not isinstance(item.get("id"), int):
        raise ProviderFailed("Freesound answered a search result without an id")
    sound = f"freesound:{item['id']}"
    tags = item.get("tags") if isinstance(item.get("tags"), list) else []
    duration = item.get("duration")
    return {
        "id": sound,
        "name": str(item.get("name") or ""),
        "tags": [str(tag) for tag in tags],
        "duration": float(duration) if isinstance(duration, (int, float)) and not isinstance(duration, bool) else 0.0,
        "license": str(item.get("license") or ""),
        "preview_url": PREVIEW_ROUTE + sound,
    }


def _pick_preview(previews):
    for key in PREVIEW_KEYS:
        url = previews.get(key)
        if isinstance(url, str) and url:
            return key, url
    raise ProviderFailed("Freesound has no preview for this sound")

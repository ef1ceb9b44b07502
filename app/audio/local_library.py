"""The embedded sound library: a folder (SOUNDLIB_DIR) of audio files, each with an
optional sidecar `<stem>.json` of {name?, tags?, license?}. The index is built at
the first use and rebuilt when any file or sidecar changes (checked at most every
REFRESH_SECONDS); search matches every word of the query in names and tags.
"""

import json
import os
import time

import mutagen

from app.audio.providers import PREVIEW_ROUTE, SoundLibrary, TooLarge, Unavailable
from app.common.fsutil import is_within
from app.common.offload import blocking

AUDIO_TYPES = {
    ".mp3": "audio/mpeg",
    ".wav": "audio/wav",
    ".ogg": "audio/ogg",
    ".oga": "audio/ogg",
    ".opus": "audio/ogg",
    ".flac": "audio/flac",
    ".m4a": "audio/mp4",
    ".webm": "audio/webm",
}
REFRESH_SECONDS = 2.0
DEFAULT_LICENSE = "unspecified"


def _words(text):
    return [w for w in "".join(c.lower() if c.isalnum() else " " for c in text).split() if w]


def _scan(root):
    """{relative path: (size, mtime)} of the audio files and sidecars below root."""
    found = {}
    for current, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            ext = os.path.splitext(name)[1].lower()
            if name.startswith(".") or (ext not in AUDIO_TYPES and ext != ".json"):
                continue
            path = os.path.join(current, name)
            st = os.lstat(path)
            if os.path.isfile(path) and not os.path.islink(path):
                found[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return found


def _entry(root, rel):
    path = os.path.join(root, rel)
    sidecar = os.path.splitext(path)[0] + ".json"
    meta = {}
    if os.path.exists(sidecar):
        try:
            with open(sidecar, "rb") as f:
                loaded = json.load(f)
            meta = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            meta = {}
    try:
        info = mutagen.File(path)
        duration = round(float(info.info.length), 3) if info is not None else None
    except Exception:  # an unreadable file is still listed, without a duration
        duration = None
    tags = (
        [str(t) for t in meta.get("tags", []) if isinstance(t, (str, int))]
        if isinstance(meta.get("tags"), list)
        else []
    )
    sound_id = f"{LocalLibrary.name}:" + rel.replace(os.sep, "/")
    return {
        "id": sound_id,
        "name": str(meta.get("name") or os.path.splitext(os.path.basename(rel))[0].replace("_", " ")),
        "tags": tags,
        "duration": duration,
        "license": str(meta.get("license") or DEFAULT_LICENSE),
        "preview_url": PREVIEW_ROUTE + sound_id,
    }


class LocalLibrary(SoundLibrary):
    name = "local"

    def __init__(self, settings):
        self.settings = settings
        self.root = settings.soundlib_dir
        self._signature, self._entries, self._checked = None, {}, 0.0

    def _index(self):
        """{id: entry}, rebuilt when the folder's files changed."""
        if time.monotonic() - self._checked >= REFRESH_SECONDS or self._signature is None:
            signature = blocking(_scan, self.root)
            if signature != self._signature:
                audio = [rel for rel in signature if os.path.splitext(rel)[1].lower() in AUDIO_TYPES]
                entries = blocking(lambda: [_entry(self.root, rel) for rel in sorted(audio)])
                self._entries = {e["id"]: e for e in entries}
                self._signature = signature
            self._checked = time.monotonic()
        return self._entries

    def probe(self):
        if not os.path.isdir(self.root):
            raise Unavailable(f"the sound folder {self.root} does not exist")
        if not os.access(self.root, os.R_OK | os.X_OK):
            raise Unavailable(f"the sound folder {self.root} cannot be read")

    def search(self, query, results):
        self.probe()
        wanted = _words(query)
        scored = []
        for entry in self._index().values():
            name_words = _words(entry["name"])
            tag_words = [w for tag in entry["tags"] for w in _words(tag)]
            if not all(any(w.startswith(q) for w in name_words + tag_words) for q in wanted):
                continue
            in_name = sum(any(w.startswith(q) for w in name_words) for q in wanted)
            scored.append((-in_name, entry["name"].lower(), entry))
        return [entry for *_, entry in sorted(scored, key=lambda s: s[:2])][:results]

    def preview(self, key):
        self.probe()
        sound_id = f"{self.name}:{key}"
        if sound_id not in self._index():
            raise LookupError(f"no sound {sound_id!r}")
        path = os.path.join(self.root, key)
        if os.path.islink(path) or not is_within(path, self.root):  # swapped for a link since indexing
            raise LookupError(f"no sound {sound_id!r}")
        size = os.path.getsize(path)
        if size > self.settings.max_response_bytes:
            raise TooLarge(f"the sound is larger than the limit of {self.settings.max_response_bytes} bytes")
        data = blocking(_read, path)
        return AUDIO_TYPES[os.path.splitext(key)[1].lower()], data, sound_id


def _read(path):
    with open(path, "rb") as f:
        return f.read()

"""Deck import: validate the request, copy the assets, parse the source, and swap
the new deck into place.

Everything that can fail on the caller's input is checked before anything is
written, so a rejected import changes nothing on disk. The new deck is built in a
sibling directory and exchanged with the old one atomically, so a reader never
sees half a deck. Sessions are not touched.

md_path and copy_from must resolve (symlinks included) inside DATA_DIR, outside
the service's own `decks/` and `sessions/` trees: the service has no
authentication, so it must not read arbitrary files of the host.
"""

import fcntl
import json
import os
import shutil
import stat
import uuid
from urllib.parse import quote, unquote, urlsplit

from app.common.failures import Invalid
from app.common.fsutil import atomic_write, is_within, swap_into_place
from app.common.timeutil import utc_timestamp
from app.decks import layout
from app.decks.parse import DeckSyntaxError, parse_deck

ASSET_EXTENSIONS = frozenset(
    ".png .jpg .jpeg .gif .webp .svg .avif .bmp .ico "
    ".mp3 .wav .ogg .oga .m4a .flac .opus .aac "
    ".mp4 .webm .ogv .mov .m4v .pdf".split()
)
MAX_SOURCE_BYTES = 5 * 1024 * 1024
MAX_ASSET_FILES = 5000
MAX_ASSET_BYTES = 2 * 1024 * 1024 * 1024


def _field_error(field, message):
    return Invalid(f"{field}: {message}", fields={field: [message]})


def _resolve_input(field, value):
    """`value` as a real absolute path inside DATA_DIR, outside the service's trees."""
    if "\x00" in value:
        raise _field_error(field, "must not contain NUL bytes")
    root = layout.data_dir()
    path = os.path.realpath(os.path.join(root, value))  # an absolute value replaces root
    if not is_within(path, root):
        raise _field_error(field, "must resolve to a path inside the service's data directory")
    for own in (layout.decks_dir(), layout.sessions_dir()):
        if is_within(path, own) or is_within(own, path):
            raise _field_error(field, "must not be or hold the service's own decks/ or sessions/ trees")
    return path


def _read_source(field, path):
    if not path.lower().endswith(".md"):
        raise _field_error(field, "must name a .md file")
    try:
        st = os.stat(path)
    except OSError:
        raise _field_error(field, "no such file") from None
    if not stat.S_ISREG(st.st_mode):
        raise _field_error(field, "is not a regular file")
    if st.st_size > MAX_SOURCE_BYTES:
        raise _field_error(field, f"is larger than {MAX_SOURCE_BYTES} bytes")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        raise _field_error(field, f"cannot be read ({exc.strerror})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise _field_error(field, "is not valid UTF-8") from None


def _list_assets(field, directory):
    """Relative paths of the asset files below `directory`: regular files with an
    asset extension; symlinks and hidden entries are never followed or copied."""
    if not os.path.isdir(directory):
        raise _field_error(field, "is not a directory")
    assets, total = [], 0
    for current, dirs, files in os.walk(directory, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            full = os.path.join(current, name)
            if name.startswith(".") or os.path.splitext(name)[1].lower() not in ASSET_EXTENSIONS:
                continue
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode):
                continue
            assets.append(os.path.relpath(full, directory))
            total += st.st_size
            if len(assets) > MAX_ASSET_FILES:
                raise _field_error(field, f"holds more than {MAX_ASSET_FILES} asset files")
            if total > MAX_ASSET_BYTES:
                raise _field_error(field, f"holds more than {MAX_ASSET_BYTES} bytes of assets")
    return assets


def _image_resolver(deck_id, md_dir, copy_from, assets):
    known = set(assets)

    def resolve(src):
        parts = urlsplit(src)
        if parts.scheme or parts.netloc or not parts.path:
            return src  # an absolute URL or an anchor: left as written
        ref = unquote(parts.path)
        for base in (md_dir, copy_from):
            candidate = os.path.normpath(os.path.join(base, ref))
            rel = os.path.relpath(candidate, copy_from)
            if rel in known:
                return f"/api/decks/{deck_id}/assets/{quote(rel)}"
        return None

    return resolve


def prepare(deck_id, md_path, copy_from):
    """Check every input and parse the deck; writes nothing. Returns the plan."""
    source_path = _resolve_input("md_path", md_path)
    assets_path = _resolve_input("copy_from", copy_from)
    text = _read_source("md_path", source_path)
    assets = _list_assets("copy_from", assets_path)
    resolver = _image_resolver(deck_id, os.path.dirname(source_path), assets_path, assets)
    try:
        parsed = parse_deck(text, resolver)
    except DeckSyntaxError as exc:
        raise _field_error("md_path", str(exc)) from None
    deck = {
        "id": deck_id,
        "title": parsed["title"] or deck_id,
        "source": source_path,
        "copy_from": assets_path,
        "imported_at": utc_timestamp("seconds"),
        "slide_count": len(parsed["slides"]),
        "meta": parsed["meta"],
        "assets": assets,
        "warnings": parsed["warnings"],
        "slides": parsed["slides"],
    }
    return deck


def build(deck):
    """Write the planned deck beside the old one and swap it into place."""
    decks_dir = layout.decks_dir()
    lock_dir = os.path.join(decks_dir, ".locks")
    os.makedirs(lock_dir, exist_ok=True)
    with open(os.path.join(lock_dir, f"{deck['id']}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one import of a deck at a time, across workers
        staging = os.path.join(decks_dir, f".build-{deck['id']}-{uuid.uuid4().hex}")
        try:
            os.makedirs(os.path.join(staging, "assets"))
            for rel in deck["assets"]:
                target = os.path.join(staging, "assets", rel)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                # A full copy of the file's bytes: never a link, never shared with another deck.
                shutil.copyfile(os.path.join(deck["copy_from"], rel), target, follow_symlinks=False)
            atomic_write(os.path.join(staging, "deck.json"), json.dumps(deck, ensure_ascii=False, indent=1).encode())
            swap_into_place(staging, layout.deck_dir(deck["id"]))
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # the failed build, or the old deck

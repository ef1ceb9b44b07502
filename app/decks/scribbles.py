"""Scribble overlays: PNG images posted as data URLs and stored beside the log."""

import base64
import binascii
import os
import re
import struct
import uuid
import zlib

from app.common.failures import Invalid, TooLarge
from app.common.fsutil import atomic_write
from app.decks import layout

DATA_URL_PREFIX = "data:image/png;base64,"
# Below the proxy's 64 MB body limit even once base64 adds its third.
MAX_SCRIBBLE_BYTES = 40 * 1024 * 1024
MAX_SIDE = 20000
NAME_PATTERN = re.compile(r"^[0-9a-f]{32}\.png$")
_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_BIT_DEPTHS = {0: {1, 2, 4, 8, 16}, 2: {8, 16}, 3: {1, 2, 4, 8}, 4: {8, 16}, 6: {8, 16}}


def _image_error(message, kind=Invalid):
    return kind(f"image: {message}", fields={"image": [message]})


def decode_png(data_url):
    """(png bytes, width, height) from a data URL; every flaw is an Invalid (or TooLarge)."""
    if not data_url.startswith(DATA_URL_PREFIX):
        raise _image_error(f"must be a data URL starting with {DATA_URL_PREFIX!r}")
    payload = data_url[len(DATA_URL_PREFIX) :]
    if len(payload) // 4 * 3 > MAX_SCRIBBLE_BYTES:
        raise _image_error(f"decodes to more than {MAX_SCRIBBLE_BYTES} bytes", TooLarge)
    try:
        png = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _image_error("is not valid base64") from None
    width, height = png_size(png)
    return png, width, height


def png_size(png):
    """(width, height) from a PNG's signature and IHDR chunk, CRC checked."""
    if not png.startswith(_SIGNATURE):
        raise _image_error("is not a PNG (bad signature)")
    header = png[8:33]
    if len(header) < 25:
        raise _image_error("is a truncated PNG")
    length, kind = struct.unpack(">I4s", header[:8])
    body, crc = header[8:21], struct.unpack(">I", header[21:25])[0]
    if length != 13 or kind != b"IHDR" or zlib.crc32(kind + body) != crc:
        raise _image_error("has no valid PNG header (IHDR)")
    width, height, depth, color, compression, filtering, interlace = struct.unpack(">IIBBBBB", body)
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
        raise _image_error(f"must be between 1 and {MAX_SIDE} pixels on each side")
    if depth not in _BIT_DEPTHS.get(color, ()) or compression or filtering or interlace > 1:
        raise _image_error("has an invalid PNG header")
    return width, height


def store(session_id, png):
    """Write the PNG atomically under the session's scribbles/ and return its name."""
    directory = layout.scribbles_dir(session_id)
    os.makedirs(directory, exist_ok=True)
    name = f"{uuid.uuid4().hex}.png"
    atomic_write(os.path.join(directory, name), png)
    return name


def remove(session_id, name):
    """Delete a stored scribble whose event was refused."""
    try:
        os.unlink(os.path.join(layout.scribbles_dir(session_id), name))
    except FileNotFoundError:
        pass

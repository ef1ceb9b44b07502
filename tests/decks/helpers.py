"""Small helpers for the deck service's tests."""
import base64
import os
import struct
import zlib

import requests


def tree(root):
    """Every path below `root` with its size and mtime: to prove nothing changed."""
    found = {}
    for current, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(current, name)
            st = os.lstat(path)
            found[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return found


def png_bytes(width=4, height=3):
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def data_url(png):
    return "data:image/png;base64," + base64.b64encode(png).decode()


def post_event(base_url, session_id, event, timeout=10):
    return requests.post(f"{base_url}/api/sessions/{session_id}/events", json=event, timeout=timeout)


def read_log(data_dir, session_id):
    with open(os.path.join(data_dir, "sessions", session_id, "events.jsonl"), "rb") as f:
        return f.read()

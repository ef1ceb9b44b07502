"""Uploaded and generated images: `DATA_DIR/uploads/<uuid>.<ext>`, served at
`/uploads/<name>` (nginx serves the same folder in production).

The type is decided from the bytes, never from the declared type or the name: a
file is kept only when Pillow opens it as PNG, JPEG or WebP.
"""

import io
import os
import re
import uuid

from flask import Blueprint, current_app, request, send_from_directory
from PIL import Image, UnidentifiedImageError

from app.common.failures import Invalid, NotFound, TooLarge
from app.common.fsutil import atomic_write
from app.common.offload import blocking
from app.wizard.settings import UPLOAD_LIMIT

bp = Blueprint("uploads", __name__)

EXTENSIONS = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp"}
# A stored name is the UUID's canonical text (8-4-4-4-12), what a client matching
# `<uuid>` expects; names of 32 bare hex digits, which earlier releases wrote, keep working.
_STORED_NAME = re.compile(
    r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})"
    r"\.(png|jpg|webp)$"
)


def image_format(data):
    """PNG, JPEG or WEBP when Pillow can open and verify `data`, else None."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            kind = image.format
            image.verify()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None
    return kind if kind in EXTENSIONS else None


def store(data, extension):
    """Write `data` as a new upload; answer its public URL."""
    name = f"{uuid.uuid4()}.{extension}"
    blocking(_write, current_app.config["WIZARD"].uploads_dir, name, data)
    return f"/uploads/{name}"


def _write(folder, name, data):
    os.makedirs(folder, exist_ok=True)  # created lazily, as every DATA_DIR layout
    atomic_write(os.path.join(folder, name), data)


@bp.post("/api/uploads")
def upload():
    """Store an uploaded image (PNG, JPEG or WebP, multipart field `file`, 8 MiB at most) and answer its URL."""
    if not (request.mimetype or "").startswith("multipart/form-data"):
        raise Invalid("the upload must be multipart/form-data with a field named file")
    upload_file = request.files.get("file")
    if upload_file is None:
        raise Invalid("file: the form has no field named file", field="file")
    data = upload_file.stream.read(UPLOAD_LIMIT + 1)
    if len(data) > UPLOAD_LIMIT:
        raise TooLarge(f"file: larger than the {UPLOAD_LIMIT // (1024 * 1024)} MB limit", field="file")
    if not data:
        raise Invalid("file: is empty", field="file")
    kind = blocking(image_format, data)
    if kind is None:
        raise Invalid("file: not a PNG, JPEG or WebP image (the type is read from the file's bytes)", field="file")
    return {"url": store(data, EXTENSIONS[kind])}, 201


@bp.get("/uploads/<name>")
def serve_upload(name):
    """One stored upload (nginx serves the same folder in production)."""
    if not _STORED_NAME.match(name):
        raise NotFound(f"no upload {name[:80]!r}")
    response = send_from_directory(current_app.config["WIZARD"].uploads_dir, name, max_age=365 * 24 * 3600)
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response

"""Uploads: the type is read from the bytes, 8 MB at most, stored under
DATA_DIR/uploads and served back with nosniff."""

import io
import re

import pytest
from PIL import Image

CANONICAL_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def image_bytes(kind, size=(8, 8)):
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, kind)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "kind, extension, mime",
    [("PNG", "png", "image/png"), ("JPEG", "jpg", "image/jpeg"), ("WEBP", "webp", "image/webp")],
)
def test_images_are_stored_and_served(wizard, wizard_server, kind, extension, mime):
    data = image_bytes(kind)
    # The declared type is not what decides.
    response = wizard.post("/api/uploads", files={"file": ("photo.bin", data, "application/octet-stream")})
    assert response.status_code == 201, response.text
    url = response.json()["url"]
    assert re.fullmatch(rf"/uploads/{CANONICAL_UUID}\.{extension}", url)
    assert (wizard_server.data_dir / "uploads" / url.rsplit("/", 1)[1]).read_bytes() == data
    served = wizard.get(url)
    assert served.status_code == 200 and served.content == data
    assert served.headers["Content-Type"] == mime
    assert served.headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize(
    "name, data, declared",
    [
        ("fake.png", b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/png"),
        ("doc.png", b"%PDF-1.4 not an image", "image/png"),
        ("anim.gif", None, "image/gif"),
        ("truncated.png", "truncated", "image/png"),
    ],
)
def test_anything_but_png_jpeg_webp_is_400(wizard, wizard_server, name, data, declared):
    if data is None:
        data = image_bytes("GIF")
    elif data == "truncated":
        data = image_bytes("PNG", (64, 64))[:60]
    uploads = wizard_server.data_dir / "uploads"
    before = sorted(uploads.glob("*")) if uploads.exists() else []
    response = wizard.post("/api/uploads", files={"file": (name, data, declared)})
    assert response.status_code == 400
    assert "PNG, JPEG or WebP" in response.json()["error"]
    after = sorted(uploads.glob("*")) if uploads.exists() else []
    assert after == before


def test_a_file_over_8_mb_is_413(wizard):
    data = image_bytes("PNG") + b"\0" * (8 * 1024 * 1024)
    response = wizard.post("/api/uploads", files={"file": ("big.png", data, "image/png")})
    assert response.status_code == 413
    assert "8 MB" in response.json()["error"]


def test_a_form_without_the_file_field_is_400(wizard):
    assert wizard.post("/api/uploads", files={"other": ("a.png", image_bytes("PNG"), "image/png")}).status_code == 400
    assert wizard.post("/api/uploads", json={"file": "x"}).status_code == 400
    assert wizard.post("/api/uploads", files={"file": ("empty.png", b"", "image/png")}).status_code == 400


@pytest.mark.parametrize(
    "path",
    [
        "/uploads/../wizard.db",
        "/uploads/..%2Fwizard.db",
        "/uploads/wizard.db",
        "/uploads/" + "0" * 32 + ".png",
        "/uploads/%2e%2e/%2e%2e/etc/passwd",
    ],
)
def test_uploads_cannot_reach_other_files(wizard, path):
    response = wizard.get(path)
    assert response.status_code == 404
    assert b"SQLite" not in response.content


def test_an_upload_named_by_an_earlier_release_is_still_served(wizard, wizard_server):
    """Earlier releases named uploads by 32 bare hex digits; their URLs keep working."""
    data = image_bytes("PNG")
    folder = wizard_server.data_dir / "uploads"
    folder.mkdir(exist_ok=True)
    (folder / ("ab" * 16 + ".png")).write_bytes(data)
    served = wizard.get("/uploads/" + "ab" * 16 + ".png")
    assert served.status_code == 200 and served.content == data
    for name in ("ab" * 15 + ".png", "AB" * 16 + ".png", "abababab-abab-abab-abab-abababababab.gif"):
        assert wizard.get("/uploads/" + name).status_code == 404

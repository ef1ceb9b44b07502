"""Text out of documents: PDF (pypdf), plain text and Markdown, HTML and web
pages (trafilatura), DOCX (python-docx). `detect` decides the kind up front, so an
unsupported file is refused by the route, not by a job that fails later.

Caps (issue #32: a 257 KB DOCX once became 105 million characters): a document's text
is at most `max_chars` characters and at most `ratio` times the file's size (with a
floor, for small files); a DOCX's zip entries are checked in the zip's directory
BEFORE anything is inflated (zipfile never inflates an entry past its declared size:
it stops there and fails the CRC check), and a PDF's text is counted page by page as
it is produced (pypdf caps each stream's inflation itself)."""

import io
import logging
import os
import re
import zipfile

from charset_normalizer import from_bytes

log = logging.getLogger("bundle.notebook")

EXTENSIONS = {
    ".pdf": "pdf",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".markdown": "text",
    ".csv": "text",
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".docx": "docx",
}
CONTENT_TYPES = {
    "application/pdf": "pdf",
    "text/plain": "text",
    "text/markdown": "text",
    "text/x-markdown": "text",
    "text/csv": "text",
    "text/html": "html",
    "application/xhtml+xml": "html",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
}
SUPPORTED = "PDF, text, Markdown, CSV, HTML or DOCX"


class ExtractionError(Exception):
    """The document could not be read: the message says why (shown to the user)."""


class Unsupported(ExtractionError):
    pass


class TooMuchText(ExtractionError):
    """The document is over a cap: a source's add answers 413 (the content is larger
    than the server takes), like a body over the byte cap."""

    status = 413


# Below these, a document's size does not limit what it may inflate to or yield: a small
# DOCX inflates ~25-fold (its styles and theme); the ratio is for documents past them.
INFLATED_FLOOR = 4 * 1024 * 1024  # bytes
TEXT_FLOOR = 64 * 1024  # characters
# Bytes of inflated XML allowed per character of the text cap (WordprocessingML's markup).
XML_PER_CHAR = 16


class Caps:
    """What one document of `size` bytes may yield: `max_chars` characters at most, and
    at most `ratio` times its size, in inflated bytes and in text (above the floors)."""

    def __init__(self, max_chars: int, ratio: int, size: int):
        self.max_chars, self.ratio, self.size = max_chars, ratio, size
        self.text = min(max_chars, max(ratio * size, TEXT_FLOOR))
        self.inflated = min(max(ratio * size, INFLATED_FLOOR), size + XML_PER_CHAR * max_chars)

    def check_text(self, count: int, kind: str) -> None:
        if count > self.max_chars:
            raise TooMuchText(
                f"the {kind.upper()} document has more than {self.max_chars} characters "
                "of text, the most a source may have"
            )
        if count > self.text:
            raise TooMuchText(
                f"the {kind.upper()} document yields more than {self.ratio} characters of text "
                f"per byte of its {self.size} bytes"
            )


def _sniff(head):
    if head.startswith(b"%PDF-"):
        return "pdf"
    if head.startswith(b"PK\x03\x04"):
        return "docx"
    lowered = head[:1024].lstrip().lower()
    if lowered.startswith((b"<!doctype html", b"<html")):
        return "html"
    if b"\x00" not in head:
        try:
            head.decode("utf-8")
            return "text"
        except UnicodeDecodeError as exc:
            if exc.start >= len(head) - 4:  # a character cut by the end of the sample
                return "text"
    return None


def detect(filename, head, content_type=None):
    """The kind of a document from its name, declared type and first bytes; raises
    Unsupported. `head` is at least the first 4 KB (or the whole file)."""
    ext = os.path.splitext(filename or "")[1].lower()
    kind = EXTENSIONS.get(ext)
    if kind is None and content_type:
        kind = CONTENT_TYPES.get(content_type.split(";")[0].strip().lower())
    if kind is None and not ext:
        kind = _sniff(head)
    if kind is None:
        raise Unsupported(f"unsupported file type {ext or content_type or 'unknown'}: expected {SUPPORTED}")
    if kind == "text" and b"\x00" in head:
        raise Unsupported("the file is binary, not text")
    return kind


def decode_text(data):
    """Bytes as text: UTF-8 (with or without BOM), else the encoding charset-normalizer finds."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        best = from_bytes(data).best()
        if best is None:
            raise ExtractionError("the text is in no encoding that could be recognised") from None
        return str(best)


def _pdf(data, caps):
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError, PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise ExtractionError("the PDF is encrypted")
        pages, count = [], 0
        for page in reader.pages:  # counted as produced: an over-cap PDF stops at the page that passes it
            pages.append(page.extract_text() or "")
            count += len(pages[-1])
            caps.check_text(count, "pdf")
        title = (reader.metadata.title if reader.metadata else None) or None
    except ExtractionError:
        raise
    except (PdfReadError, PyPdfError, ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
        raise ExtractionError(f"the PDF could not be read: {exc}") from None
    return "\n\n".join(p.strip() for p in pages if p.strip()), title


def _check_inflation(data, caps):
    """Refuse a DOCX whose zip entries declare more than the caps allow, read from the
    zip's directory: nothing is inflated yet. python-docx loads every part, so every
    entry counts."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            inflated = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise ExtractionError(f"the DOCX could not be read: {exc}") from None
    if inflated > caps.inflated:
        raise TooMuchText(
            f"the DOCX inflates to {inflated} bytes, more than the {caps.inflated} bytes "
            f"allowed for a file of {len(data)} bytes (at most {caps.ratio} times its size)"
        )


def _docx(data, caps):
    import docx

    _check_inflation(data, caps)
    try:
        document = docx.Document(io.BytesIO(data))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        raise ExtractionError(f"the DOCX could not be read: {exc}") from None
    except Exception as exc:  # python-docx raises its own kinds for a file that is not a document
        raise ExtractionError(f"the DOCX could not be read: {type(exc).__name__}") from None
    paragraphs = [p.text for p in document.paragraphs if p.text.strip()]
    for table in document.tables:
        for row in table.rows:
            paragraphs.append(" | ".join(cell.text.strip() for cell in row.cells))
    return "\n\n".join(paragraphs), (document.core_properties.title or None)


def _html(data, url=None):
    import trafilatura

    html = decode_text(data)
    text = trafilatura.extract(html, url=url, include_comments=False, include_tables=True, favor_recall=True)
    title = None
    metadata = trafilatura.extract_metadata(html, default_url=url)
    if metadata is not None:
        title = metadata.title
    if not text:
        # A page with little markup (or none): its visible text, tags stripped.
        text = re.sub(r"<[^>]+>", " ", re.sub(r"(?is)<(script|style)[^>]*>.*?</\1>", " ", html))
        text = re.sub(r"[ \t]+", " ", text).strip()
    return text, title


def _text(data):
    text = decode_text(data)
    first = next((line.strip().lstrip("#").strip() for line in text.splitlines() if line.strip()), None)
    return text, (first[:200] if first else None)


def extract(kind: str, data: bytes, max_chars: int, ratio: int, url: str | None = None):
    """(text, title or None) of a document of `kind`, its text at most `max_chars`
    characters and `ratio` times the file's size; raises ExtractionError (TooMuchText
    over a cap)."""
    if not data:
        raise ExtractionError("the document is empty")
    caps = Caps(max_chars, ratio, len(data))
    if kind == "text" and len(data) > 4 * max_chars:  # no encoding takes more than 4 bytes a character
        caps.check_text(len(data) // 4, kind)
    if kind == "pdf":
        text, title = _pdf(data, caps)
    elif kind == "docx":
        text, title = _docx(data, caps)
    elif kind == "html":
        text, title = _html(data, url)
    elif kind == "text":
        text, title = _text(data)
    else:
        raise Unsupported(f"unsupported document kind {kind!r}")
    text = text.replace("\x00", "").strip()
    caps.check_text(len(text), kind)
    if not text:
        raise ExtractionError(f"no text could be extracted from the {kind.upper()} document")
    return text, (title.replace("\x00", "").strip() or None) if title else None

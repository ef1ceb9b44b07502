"""Sample documents the notebook tests add: made here, byte by byte, so that nothing is fetched."""

import io
import zipfile
import zlib

PDF_TEXT = "Mitochondria are the powerhouse of the cell and make ATP through respiration."
TEXT_BODY = (
    "Photosynthesis converts light into chemical energy. Chlorophyll in the leaves of plants "
    "absorbs sunlight, and the plant stores the energy as glucose."
)
ARTICLE_HTML = """<!doctype html><html><head><title>Coral reefs under pressure</title></head><body>
<nav>Home | About</nav>
<article><h1>Coral reefs under pressure</h1>
<p>Coral reefs are built by colonies of tiny animals called polyps. Warmer oceans cause coral
bleaching, in which the polyps expel the algae that feed them.</p>
<p>Scientists monitor reef health with underwater surveys and satellite measurements of sea
surface temperature, hoping to protect the reefs for future generations.</p></article>
<footer>Copyright</footer></body></html>"""


def pdf_bytes(text, compress=False):
    """A one-page PDF whose page shows `text` (Helvetica), with a correct xref;
    `compress`: its content stream deflated (FlateDecode), as most PDFs have it."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode("latin-1")
    flate = b""
    if compress:
        stream, flate = zlib.compress(stream, 9), b" /Filter /FlateDecode"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + flate + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n".encode() + body + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for offset in offsets:
        out.write(f"{offset:010d} 00000 n \n".encode())
    out.write(f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return out.getvalue()


def docx_bytes(paragraphs):
    import docx

    document = docx.Document()
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def docx_bomb(inflated_bytes):
    """A DOCX (python-docx's own, valid) whose word/document.xml is `inflated_bytes` of
    one paragraph repeated: deflated, a few hundred times smaller than that."""
    template = zipfile.ZipFile(io.BytesIO(docx_bytes(["x"])))
    paragraph = b"<w:p><w:r><w:t>" + b"All work and no play makes Jack a dull boy. " * 20 + b"</w:t></w:r></w:p>"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as bomb:
        for info in template.infolist():
            data = template.read(info.filename)
            if info.filename == "word/document.xml":
                head, tail = data.split(b"<w:body>", 1)
                data = head + b"<w:body>" + paragraph * (inflated_bytes // len(paragraph)) + tail
            bomb.writestr(info.filename, data)
    return out.getvalue()

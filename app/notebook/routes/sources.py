"""Sources: added from an upload, a link or text; processed by the job worker
(synchronously from the client's point of view unless `async_processing`)."""

import os

import gevent
from flask import Blueprint, request, send_file
from peewee import fn
from werkzeug.exceptions import RequestEntityTooLarge

from app.common.body import validated
from app.common.failures import ApiError, Invalid, NotFound, TooLarge, UnsupportedType
from app.common.offload import blocking
from app.notebook.core import app_settings, cleanup, index
from app.notebook.core.ids import new_key, public
from app.notebook.core.models import Chunk, Command, Insight, Source, SourceNotebook, database, now, write_transaction
from app.notebook.core.records import get_source
from app.notebook.ingest import extract, ssrf, uploads
from app.notebook.routes import serializers, transformations
from app.notebook.routes.http import body, check_text, jobs, query, read_text_body, settings
from app.notebook.routes.notebooks import get_notebook, stamp_view
from app.notebook.routes.payloads import SourceCreate, SourceListQuery, SourceUpdate

bp = Blueprint("sources", __name__)

# Room for the multipart envelope and the form's other fields beside the file.
FORM_OVERHEAD = 1024 * 1024
_SORT = {
    "created": Source.created,
    "updated": Source.updated,
    "title": fn.LOWER(Source.title),
    "type": Source.kind,
    "insights_count": fn.COALESCE(Insight.select(fn.COUNT(Insight.id)).where(Insight.source == Source.id), 0),
    "embedded": fn.EXISTS(Chunk.select(Chunk.id).where((Chunk.source == Source.id) & Chunk.embedding.is_null(False))),
}
_LIST_FIELDS = [f for name, f in Source._meta.fields.items() if name != "full_text"]


# --------------------------------------------------------------------------- list, read


@bp.get("/sources")
def list_sources():
    """The sources, optionally of one notebook, sorted and a page at a time."""
    args = query(SourceListQuery)
    selection = Source.select(*_LIST_FIELDS)
    if args.get("notebook_id"):
        notebook = get_notebook(args["notebook_id"])
        selection = selection.join(SourceNotebook).where(SourceNotebook.notebook == notebook.id)
    total = selection.count()
    order = _SORT[args["sort_by"]]
    order = order.asc() if args["sort_order"] == "asc" else order.desc()
    records = list(selection.order_by(order, Source.id).limit(args["limit"]).offset(args["offset"]))
    links, embedded = serializers.source_extras([r.id for r in records])
    return [serializers.source(r, links, embedded) for r in records], 200, {"X-Total-Count": str(total)}


@bp.get("/sources/<source_id>")
def read_source(source_id):
    """One source with its full text; the view is recorded (/recently-viewed)."""
    record = get_source(source_id)
    stamp_view(Source, record.id)
    return serializers.source(record, detail=True)


@bp.get("/sources/<source_id>/status")
def source_status(source_id):
    """A source's processing state and its job's progress."""
    record = get_source(source_id, _LIST_FIELDS)
    command = Command.get_or_none(Command.id == record.command_id) if record.command_id else None
    messages = {
        "new": "Queued for processing",
        "running": "Processing",
        "completed": "Processed",
        "failed": "Processing failed",
        "canceled": "Processing was canceled",
    }
    return {
        "id": public("source", record.id),
        "status": record.status,
        "message": messages[record.status],
        "command_id": public("command", record.command_id),
        "error_message": record.error_message,
        "processing_info": ({"command_status": command.status, "progress": command.progress} if command else None),
    }


@bp.get("/sources/<source_id>/download")
def download_source(source_id):
    """A source's original file, as an attachment (404 when it has none)."""
    record = get_source(source_id, _LIST_FIELDS)
    path = uploads.path_of(settings().uploads_dir, record.file_name) if record.file_name else None
    if path is None or not os.path.isfile(path):
        raise NotFound(
            "this source has no original file to download"
            if record.kind != "upload"
            else "the original file is no longer stored"
        )
    response = send_file(
        path,
        mimetype=record.content_type or "application/octet-stream",
        as_attachment=True,
        download_name=record.original_name or record.file_name,
        conditional=True,
        max_age=0,
    )
    # The type is the uploader's word: never let a browser run what it downloads from here.
    response.headers["Content-Security-Policy"] = "sandbox; default-src 'none'"
    return response


# --------------------------------------------------------------------------- create


def _form_fields():
    data = {}
    for name in request.form:
        values = request.form.getlist(name)
        data[name] = values if name == "notebooks" and len(values) > 1 else values[0]
    return data


def _incoming():
    """(validated fields, uploaded file or None) from a multipart form or JSON, within
    the write limits (http.py)."""
    cap = settings().max_upload_bytes
    if request.mimetype == "application/x-www-form-urlencoded":
        read_text_body()  # no file can come this way: the text cap, not the upload's (issue #32)
        return validated(SourceCreate(), _form_fields()), None
    if request.mimetype == "multipart/form-data":
        request.max_content_length = cap + FORM_OVERHEAD
        try:
            fields = _form_fields()
            upload = request.files.get("file")
        except RequestEntityTooLarge:
            raise TooLarge(
                f"the upload is larger than {cap} bytes (or a form field is larger "
                f"than {settings().max_text_bytes} bytes)"
            ) from None
        return validated(SourceCreate(), fields), upload
    if request.is_json:
        return body(SourceCreate()), None
    raise UnsupportedType("send the source as multipart/form-data or as JSON")


def _notebooks_of(data):
    wanted = list(data.get("notebooks") or [])
    if data.get("notebook_id"):
        wanted.insert(0, data["notebook_id"])
    keys = []
    for public_id in wanted:
        key = get_notebook(public_id).id
        if key not in keys:
            keys.append(key)
    return keys


def _checked_upload(upload):
    """The upload's kind, refused up front when it is empty or unsupported."""
    if upload is None or not upload.filename:
        raise Invalid("file: an upload source needs a file (multipart field `file`)", field="file")
    head = upload.stream.read(4096)
    upload.stream.seek(0)
    if not head:
        raise Invalid("file: the file is empty", field="file")
    try:
        return extract.detect(upload.filename, head, upload.mimetype)
    except extract.Unsupported as exc:
        raise Invalid(f"file: {exc}", field="file") from None


def _new_source(data, upload):
    """The Source row (not saved) for the request; the upload is stored here."""
    kind = data["type"]
    embed = data["embed"] if "embed" in data else app_settings.embed_by_default()
    delete_file = data["delete_source"] or app_settings.auto_delete_files()
    source = Source(
        id=new_key(),
        kind=kind,
        title=data.get("title") or "",
        embed=embed,
        delete_file=delete_file and kind == "upload",
    )
    if kind == "upload":
        _checked_upload(upload)
        # Neither database keeps a NUL character (PostgreSQL's text cannot hold one).
        name = upload.filename.replace("\\", "/").replace("\x00", "")
        source.original_name = os.path.basename(name)[:255] or "upload"
        source.content_type = (upload.mimetype or "").replace("\x00", "") or None
        source.file_name, _ = blocking(
            uploads.store, upload.stream, upload.filename, settings().uploads_dir, settings().max_upload_bytes
        )
    elif kind == "link":
        try:
            ssrf.check_url(data["url"], settings().url_allowlist)
        except ssrf.LinkRefused as exc:
            raise Invalid(f"url: {exc}", field="url") from None
        source.url = data["url"]
    else:
        check_text("content", data["content"])
        source.full_text = data["content"]
    return source


def wait_finished(command_key, timeout):
    """Poll the command until it finishes or `timeout` passes (a synchronous add
    waits for the worker); its last status."""
    deadline = gevent.get_hub().loop.now() + timeout
    delay = 0.05
    while True:
        status = Command.select(Command.status).where(Command.id == command_key).scalar()
        if status in ("completed", "failed", "canceled") or gevent.get_hub().loop.now() >= deadline:
            return status
        # Give the pooled connection back while waiting: many synchronous adds at once
        # must not hold the whole pool.
        database.close()
        gevent.sleep(delay)
        delay = min(delay * 1.5, 0.5)


@bp.post("/sources")
@bp.post("/sources/json")  # Open Notebook's clients post JSON here; the same add
def create_source():
    """Add a source (an uploaded file, a link or text) to notebooks; the job worker extracts and embeds it, and the
    request waits for it unless `async_processing` is set."""
    data, upload = _incoming()
    notebook_keys = _notebooks_of(data)
    source = _new_source(data, upload)
    try:
        with write_transaction():
            source.status = "new"
            command = jobs().new_command("process_source", public("source", source.id))
            source.command_id = command.id
            source.save(force_insert=True)
            for key in notebook_keys:
                SourceNotebook.create(source=source.id, notebook=key)
            if source.title:  # findable by its title while it is processed
                index.put(public("source", source.id), source.title, "")
            transformations.request_insights(source.id, data["transformations"], None)
    except BaseException:
        if source.file_name:
            cleanup.remove_files([os.path.join(settings().uploads_dir, source.file_name)])
        raise
    if data["async_processing"]:
        return _enqueued(source.id, command), 202
    jobs().enqueue(command)
    return _answer_sync(source, command)


def _enqueued(source_key, command):
    """Queue the command; the source as it was queued (read before the worker can claim
    it: read after, a fast worker had made it `running` at random), or failed when the
    queue did not take it."""
    answer = _queued(source_key)
    return answer if jobs().enqueue(command) else _queued(source_key)


def _queued(source_key):
    """The answer of an add or a retry that runs in the background: the whole source,
    with the command to poll and the status `new`."""
    return serializers.source(get_source(source_key), detail=True)


def _answer_sync(source, command):
    status = wait_finished(command.id, settings().sync_timeout)
    if status == "completed":
        # Done: no job to follow (Open Notebook's clients read a command_id or a status
        # here as a job still running). GET /sources/{id} shows both.
        return {**serializers.source(get_source(source.id), detail=True), "command_id": None, "status": None}, 201
    if status in ("failed", "canceled"):
        # A synchronous add that did not work changes nothing: the source goes again.
        failed = Command.get_by_id(command.id)
        error = failed.error_message or status
        code = (failed.result or {}).get("status") or 400  # 413: the document is over a text cap
        record = Source.get_or_none(Source.id == source.id)
        if record is not None:
            with write_transaction():
                _, _, path = cleanup.delete_source(record, settings().uploads_dir)
            cleanup.remove_files([path] if path else [])
        raise ApiError(code if status == "failed" else 409, f"the source could not be processed: {error}")
    # Still queued or running past NOTEBOOK_SYNC_TIMEOUT: the client polls like an async add.
    return _queued(source.id), 202


# --------------------------------------------------------------------------- update, delete, retry


@bp.put("/sources/<source_id>")
def update_source(source_id):
    """Change a source's title or topics."""
    record = get_source(source_id, _LIST_FIELDS)
    data = body(SourceUpdate())
    changes = {"updated": now(), **data}
    with write_transaction():
        Source.update(**changes).where(Source.id == record.id).execute()
        if "title" in data:
            index.set_title(public("source", record.id), data["title"])
    return serializers.source(get_source(record.id), detail=True)


@bp.delete("/sources/<source_id>")
def delete_source(source_id):
    """Delete a source, its chunks and its stored file, and cancel its unfinished job."""
    record = get_source(source_id, _LIST_FIELDS)
    with write_transaction():
        chunks, canceled, path = cleanup.delete_source(record, settings().uploads_dir)
    removed = bool(path and os.path.exists(path))
    cleanup.remove_files([path] if path else [])
    return {
        "deleted": public("source", record.id),
        "chunks": chunks,
        "file_removed": removed,
        "canceled_command": canceled[0] if canceled else None,
    }


@bp.post("/sources/<source_id>/retry")
def retry_source(source_id):
    """Process a failed (or canceled) source again. Compare-and-set on the status, so
    that two retries at once start one job, and a queued or running source is never
    processed twice at once."""
    record = get_source(source_id, _LIST_FIELDS)
    with write_transaction():
        command = jobs().new_command("process_source", public("source", record.id))
        claimed = (
            Source.update(status="new", error_message=None, command_id=command.id, updated=now())
            .where((Source.id == record.id) & Source.status.in_(("failed", "canceled")))
            .execute()
        )
        if not claimed:  # raising rolls the new command back
            current = Source.select(Source.status).where(Source.id == record.id).scalar()
            raise Invalid(f"only a failed or canceled source can be retried; this one is {current}")
    return _enqueued(record.id, command), 202

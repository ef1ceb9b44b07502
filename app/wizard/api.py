"""The wizard's JSON routes: identity, collections, likes, client errors and events."""

import logging

from flask import Blueprint, Response, jsonify, request

from app.common import readiness, sse
from app.common.body import json_object
from app.common.failures import Invalid
from app.wizard import collections, events, identity, list_files, public_lists
from app.wizard.models import LlmTiming

bp = Blueprint("api", __name__)
log = logging.getLogger("bundle.wizard")
# Views that take no database connection per request (app.common.db.bind_to_requests):
# the event stream reads none, and thousands open at once (a reconnect storm) must not
# queue on the pool while they subscribe.
NO_CONNECTION = frozenset({"collection_events"})
ROW_BODY_LIMIT = 256 * 1024
_CLIENT_ERROR_LIMITS = {"type": 100, "message": 2000, "stack": 8000}


@bp.before_app_request
def identify():
    # Every /api/ path, routes that do not exist included: nothing is told to a
    # caller without an identity.
    if request.path.startswith("/api/"):
        identity.require_identity()


@bp.get("/api/me")
def me():
    """Who the caller is (from the identity provider's headers), and whether an administrator."""
    return jsonify(identity.current().as_json())


@bp.get("/api/collections/<name>")
def list_collection(name):
    """The rows of a collection the caller may read, optionally filtered; with an ETag, answered 304 when unchanged."""
    wanted = collections.parse_filter(request.args.get("filter"))
    who = identity.current()
    answer = collections.list_rows(name, who, wanted)
    nginx_sends_lists = request.headers.get(list_files.ACCEL_HEADER)
    if nginx_sends_lists and who.is_public and not wanted:
        public_lists.offer(name)  # later anonymous reads are answered by nginx alone
    if request.if_none_match.contains_weak(answer.tag):
        response = Response(status=304)  # the page holds these bytes already
    elif nginx_sends_lists:
        response = list_files.redirect_response(answer)
    else:
        response = Response(answer.body, mimetype="application/json")
    response.set_etag(answer.tag)
    # Private: the answer depends on who asks. no-cache: asked again every time, with
    # If-None-Match, so a revoked identity never reads a kept copy.
    response.headers["Cache-Control"] = "private, no-cache"
    return response


@bp.post("/api/collections/<name>")
def create_in_collection(name):
    """Create a row in a collection, owned by the caller (201)."""
    collections.model_of(name)
    row = collections.create_row(name, identity.current(), json_object(ROW_BODY_LIMIT))
    return jsonify(row), 201


@bp.patch("/api/collections/<name>/<row_id>")
def update_in_collection(name, row_id):
    """Change fields of a row of a collection the caller may write."""
    collections.model_of(name)
    return jsonify(collections.update_row(name, identity.current(), row_id, json_object(ROW_BODY_LIMIT)))


@bp.delete("/api/collections/<name>/<row_id>")
def delete_from_collection(name, row_id):
    """Delete a row of a collection the caller may write (204)."""
    collections.delete_row(name, identity.current(), row_id)
    return "", 204


@bp.post("/api/likes/toggle")
def toggle_like():
    """Like a blueprint, or take the caller's like back."""
    blueprint_id = json_object(4096).get("blueprint_id")
    if not isinstance(blueprint_id, str) or not 0 < len(blueprint_id) <= 200:
        raise Invalid("blueprint_id: must be a non-empty string", field="blueprint_id")
    return jsonify(collections.toggle_like(identity.current(), blueprint_id))


@bp.post("/api/errors")
def client_error():
    """A browser's uncaught exception or failed fetch, into the service's log."""
    report = json_object(32 * 1024)
    fields = {}
    for name, limit in _CLIENT_ERROR_LIMITS.items():
        value = report.get(name, "")
        if not isinstance(value, str):
            raise Invalid(f"{name}: must be a string", field=name)
        fields[name] = value[:limit]
    if not fields["message"]:
        raise Invalid("message: is required", field="message")
    # Each field cut to its limit above; line breaks and other control characters are
    # escaped by the log's formatter (app.common.logsetup): a report is one line.
    log.warning(
        "client: %s: %s (user %s) %s",
        fields["type"] or "error",
        fields["message"],
        identity.current().id,
        fields["stack"].replace("\n", " | "),
    )
    return "", 204


@bp.get("/api/events")
def collection_events():
    """Collection changes as `data: {"collection": name}`: each write, in any worker
    process, reaches every open stream."""
    return sse.stream_response((), events.subscribe())


@bp.get("/api/admin/llm-timings")
def llm_timings():
    """The last 1000 AI calls' timings, newest first (administrators only)."""
    identity.require_admin()
    rows = LlmTiming.select().order_by(LlmTiming.seq.desc()).limit(1000).dicts()
    return jsonify([{k: v for k, v in row.items() if k != "seq"} for row in rows])


@bp.get("/healthz")
def healthz():
    """Liveness: `{"status": "ok"}` while the process answers."""
    return jsonify({"status": "ok"})


bp.add_url_rule("/readyz", view_func=readiness.readyz)

"""Interactive documentation: the OpenAPI 3 document built by apispec from the
same marshmallow schemas that validate requests (/openapi.json), and Swagger UI
from the swagger-ui-dist files installed at set-up (no CDN) at /docs."""

import functools
import os
from pathlib import Path

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from flask import Blueprint, Response, send_from_directory

from app.common.config import PROJECT_ROOT
from app.common.failures import NotFound, Unavailable
from app.common.headers import content_security_policy
from app.notebook.routes import payloads as s
from app.notebook.routes.http import settings

# The files of app/notebook/static (the documentation's stylesheet and scripts) at /docs/assets.
bp = Blueprint(
    "docs", __name__, static_folder=str(Path(__file__).parent.parent / "static"), static_url_path="/docs/assets"
)

VERSION = (PROJECT_ROOT / "VERSION").read_text().strip()
UI_FILES = {
    "swagger-ui.css",
    "swagger-ui-bundle.js",
    "swagger-ui-standalone-preset.js",
    "favicon-32x32.png",
    "favicon-16x16.png",
}

# (method, path, tag, summary, request, {status: response schema or None}, errors)
# request: ("json", Schema) | ("optional json", Schema) | ("query", Schema)
#   | ("source", None) for the JSON-or-multipart add.
OPERATIONS = [
    ("get", "/health", "system", "Health: 200 when the database answers", None, {200: s.Health}, [503]),
    (
        "get",
        "/config",
        "system",
        "Open Notebook's UI configuration: version, no update check, dbStatus (public)",
        None,
        {200: s.ConfigOut},
        [],
    ),
    ("get", "/auth/status", "system", "Whether a password is needed (public)", None, {200: s.AuthStatus}, []),
    ("get", "/notebooks", "notebooks", "List notebooks", ("query", s.NotebookListQuery), {200: [s.NotebookOut]}, [400]),
    (
        "post",
        "/notebooks",
        "notebooks",
        "Create a notebook",
        ("json", s.NotebookCreate),
        {201: s.NotebookOut},
        [400, 413, 415],
    ),
    ("get", "/notebooks/{notebook_id}", "notebooks", "Read a notebook", None, {200: s.NotebookOut}, [404]),
    (
        "put",
        "/notebooks/{notebook_id}",
        "notebooks",
        "Update a notebook",
        ("json", s.NotebookUpdate),
        {200: s.NotebookOut},
        [400, 404, 413, 415],
    ),
    (
        "delete",
        "/notebooks/{notebook_id}",
        "notebooks",
        "Delete a notebook and its notes; shared sources are unlinked, sources only it holds are kept unless "
        "delete_exclusive_sources=true",
        ("query", s.NotebookDeleteQuery),
        {200: s.NotebookDeleted},
        [400, 404],
    ),
    (
        "get",
        "/notebooks/{notebook_id}/delete-preview",
        "notebooks",
        "What deleting the notebook would do: its notes, the sources only it holds, the shared ones",
        None,
        {200: s.NotebookDeletePreview},
        [404],
    ),
    (
        "post",
        "/notebooks/{notebook_id}/sources/{source_id}",
        "notebooks",
        "Add an existing source to the notebook (again: no change)",
        None,
        {200: s.LinkChanged},
        [404],
    ),
    (
        "delete",
        "/notebooks/{notebook_id}/sources/{source_id}",
        "notebooks",
        "Remove a source from the notebook (the source stays)",
        None,
        {200: s.LinkChanged},
        [404],
    ),
    (
        "post",
        "/notebooks/{notebook_id}/context",
        "notebooks",
        "A notebook's context in Open Notebook's shape (as /chat/context/build)",
        ("json", s.NotebookContextRequest),
        {200: s.NotebookContextOut},
        [400, 404, 413, 415],
    ),
    (
        "get",
        "/recently-viewed",
        "notebooks",
        "The notebooks and sources read last, newest first",
        ("query", s.RecentlyViewedQuery),
        {200: [s.RecentlyViewed]},
        [400],
    ),
    (
        "get",
        "/sources",
        "sources",
        "List sources (X-Total-Count: the total)",
        ("query", s.SourceListQuery),
        {200: [s.SourceOut]},
        [400, 404],
    ),
    (
        "post",
        "/sources",
        "sources",
        "Add a source: upload (multipart), link or text; async_processing answers at once with the source, its "
        "command and the status new; a synchronous add answers the processed source (command_id and status null)",
        ("source", s.SourceCreate),
        {201: s.SourceDetail, 202: s.SourceDetail},
        [400, 404, 409, 413, 415],
    ),
    (
        "post",
        "/sources/json",
        "sources",
        "Add a link or text source from JSON (as POST /sources; Open Notebook's path)",
        ("json", s.SourceCreate),
        {201: s.SourceDetail, 202: s.SourceDetail},
        [400, 404, 409, 413, 415],
    ),
    ("get", "/sources/{source_id}", "sources", "Read a source with its full text", None, {200: s.SourceDetail}, [404]),
    (
        "put",
        "/sources/{source_id}",
        "sources",
        "Update a source's title or topics",
        ("json", s.SourceUpdate),
        {200: s.SourceDetail},
        [400, 404, 413, 415],
    ),
    (
        "delete",
        "/sources/{source_id}",
        "sources",
        "Delete a source: its file, chunks and embeddings; its unfinished job is canceled",
        None,
        {200: s.SourceDeleted},
        [404],
    ),
    (
        "get",
        "/sources/{source_id}/status",
        "sources",
        "Processing status of a source",
        None,
        {200: s.SourceStatus},
        [404],
    ),
    (
        "post",
        "/sources/{source_id}/retry",
        "sources",
        "Process a failed or canceled source again",
        None,
        {202: s.SourceDetail},
        [400, 404],
    ),
    ("get", "/sources/{source_id}/download", "sources", "The original uploaded file", None, {200: "file"}, [404]),
    ("get", "/notes", "notes", "List notes", ("query", s.NoteListQuery), {200: [s.NoteOut]}, [400, 404]),
    ("post", "/notes", "notes", "Create a note", ("json", s.NoteCreate), {201: s.NoteOut}, [400, 404, 413, 415]),
    ("get", "/notes/{note_id}", "notes", "Read a note", None, {200: s.NoteOut}, [404]),
    (
        "put",
        "/notes/{note_id}",
        "notes",
        "Update a note",
        ("json", s.NoteUpdate),
        {200: s.NoteOut},
        [400, 404, 413, 415],
    ),
    ("delete", "/notes/{note_id}", "notes", "Delete a note", None, {200: s.Deleted}, [404]),
    (
        "get",
        "/commands",
        "commands",
        "List commands (background jobs)",
        ("query", s.CommandListQuery),
        {200: s.CommandList},
        [400],
    ),
    ("get", "/commands/{command_id}", "commands", "Status of a command", None, {200: s.CommandOut}, [404]),
    (
        "get",
        "/commands/jobs/{command_id}",
        "commands",
        "Status of a command (Open Notebook's path)",
        None,
        {200: s.CommandOut},
        [404],
    ),
    (
        "get",
        "/podcasts/jobs/{command_id}",
        "podcasts",
        "Status of a podcast's job (Open Notebook's path; the same as /commands/{command_id})",
        None,
        {200: s.CommandOut},
        [404],
    ),
    (
        "delete",
        "/commands/{command_id}",
        "commands",
        "Cancel a command that has not finished",
        None,
        {200: s.CommandOut},
        [404, 409],
    ),
    (
        "post",
        "/search",
        "search",
        "Full-text (BM25) or vector (cosine) search",
        ("json", s.SearchRequest),
        {200: s.SearchResponse},
        [400, 404, 413, 415],
    ),
    # -- settings, embedding
    ("get", "/settings", "settings", "Open Notebook's application settings", None, {200: s.SettingsOut}, []),
    (
        "put",
        "/settings",
        "settings",
        "Change settings (null: unchanged); used: default_embedding_option, auto_delete_files",
        ("json", s.SettingsUpdate),
        {200: s.SettingsOut},
        [400, 413, 415],
    ),
    (
        "post",
        "/embed",
        "embedding",
        "Embed a processed source or a note with the configured model",
        ("json", s.EmbedRequest),
        {200: s.EmbedOut, 202: s.EmbedOut},
        [400, 404, 409, 413, 415, 503],
    ),
    (
        "post",
        "/embeddings/rebuild",
        "embedding",
        "Queue an embedding rebuild (what the configured model did not embed)",
        ("json", s.RebuildRequest),
        {200: s.RebuildOut},
        [400, 404, 413, 415, 503],
    ),
    (
        "post",
        "/rebuild",
        "embedding",
        "onb-mcp's rebuild: a notebook's embeddings (mode all unless given)",
        ("json", s.RebuildRequest),
        {200: s.RebuildOut},
        [400, 404, 413, 415, 503],
    ),
    (
        "get",
        "/embeddings/rebuild/{command_id}/status",
        "embedding",
        "A rebuild's status, progress and counts",
        None,
        {200: s.RebuildStatus},
        [404],
    ),
    # -- provider credentials
    (
        "get",
        "/credentials",
        "credentials",
        "List credentials (keys never shown: has_api_key)",
        ("query", s.CredentialListQuery),
        {200: [s.CredentialOut]},
        [400],
    ),
    (
        "post",
        "/credentials",
        "credentials",
        "Create a credential (the API key is stored encrypted; names are unique)",
        ("json", s.CredentialCreate),
        {201: s.CredentialOut},
        [400, 409, 413, 415],
    ),
    (
        "get",
        "/credentials/status",
        "credentials",
        "Which providers are configured ({configured}), and where ({source}: database, environment, none)",
        None,
        {200: s.CredentialsStatus},
        [],
    ),
    (
        "get",
        "/credentials/env-status",
        "credentials",
        "{provider: whether its environment variables configure it}",
        None,
        {200: s.EnvStatus},
        [],
    ),
    (
        "post",
        "/credentials/migrate-from-env",
        "credentials",
        "Credentials from the environment variables",
        None,
        {200: s.Migrated},
        [],
    ),
    ("get", "/credentials/{credential_id}", "credentials", "Read a credential", None, {200: s.CredentialOut}, [404]),
    (
        "put",
        "/credentials/{credential_id}",
        "credentials",
        "Update a credential (api_key null removes it)",
        ("json", s.CredentialUpdate),
        {200: s.CredentialOut},
        [400, 404, 409, 413, 415],
    ),
    (
        "delete",
        "/credentials/{credential_id}",
        "credentials",
        "Delete a credential and its models (?migrate_to=<id> moves them instead; ?delete_models=false "
        "refuses, 409, while there are any)",
        ("query", s.CredentialDeleteQuery),
        {200: s.CredentialDeleted},
        [400, 404, 409],
    ),
    (
        "post",
        "/credentials/{credential_id}/test",
        "credentials",
        "A real minimal call: {success, message}",
        None,
        {200: s.CredentialTest},
        [404],
    ),
    (
        "post",
        "/credentials/{credential_id}/discover",
        "credentials",
        "The provider's models ({discovered}), each with the type its name suggests",
        None,
        {200: s.Discovered},
        [404, 502, 503, 504],
    ),
    (
        "post",
        "/credentials/{credential_id}/register-models",
        "credentials",
        "Register models under the credential (existing ones counted, not doubled); without a body, every "
        "model the provider lists, typed by its name",
        ("optional json", s.RegisterModels),
        {200: s.Registered},
        [400, 404, 413, 415, 502, 503, 504],
    ),
    # -- providers, capabilities
    (
        "get",
        "/providers",
        "providers",
        "The providers the notebook can call",
        None,
        {200: [s.ProviderInfo]},
        [],
    ),
    ("get", "/capabilities", "providers", "Optional extraction runtimes", None, {200: s.Capabilities}, []),
    # -- models
    (
        "post",
        "/models/auto-assign",
        "models",
        "Fill the empty chat and embedding defaults from the registered models",
        None,
        {200: s.AutoAssigned},
        [],
    ),
    (
        "post",
        "/models/{model_id}/test",
        "models",
        "Call the model once: {success, message}",
        None,
        {200: s.ModelTested},
        [404],
    ),
    ("get", "/models", "models", "Registered models", ("query", s.ModelListQuery), {200: [s.ModelOut]}, [400]),
    (
        "post",
        "/models",
        "models",
        "Register a model",
        ("json", s.ModelCreate),
        {201: s.ModelOut},
        [400, 404, 409, 413, 415],
    ),
    ("get", "/models/defaults", "models", "The default models", None, {200: s.Defaults}, []),
    (
        "put",
        "/models/defaults",
        "models",
        "Set default models (null clears one)",
        ("json", s.DefaultsUpdate),
        {200: s.Defaults},
        [400, 404, 413, 415],
    ),
    (
        "post",
        "/models/config",
        "models",
        "Set default models (as PUT /models/defaults)",
        ("json", s.DefaultsUpdate),
        {200: s.Defaults},
        [400, 404, 413, 415],
    ),
    ("get", "/models/{model_id}", "models", "Read a model", None, {200: s.ModelOut}, [404]),
    (
        "delete",
        "/models/{model_id}",
        "models",
        "Delete a model (defaults naming it are cleared)",
        None,
        {200: s.Deleted},
        [404],
    ),
    # -- transformations, insights
    ("get", "/transformations", "transformations", "List transformations", None, {200: [s.TransformationOut]}, []),
    (
        "post",
        "/transformations",
        "transformations",
        "Create a transformation (its prompt is never a template)",
        ("json", s.TransformationCreate),
        {201: s.TransformationOut},
        [400, 404, 409, 413, 415],
    ),
    (
        "get",
        "/transformations/default-prompt",
        "transformations",
        "The instructions put before every transformation's prompt",
        None,
        {200: s.DefaultPrompt},
        [],
    ),
    (
        "put",
        "/transformations/default-prompt",
        "transformations",
        "Set the instructions put before every transformation's prompt",
        ("json", s.DefaultPrompt),
        {200: s.DefaultPrompt},
        [400, 413, 415],
    ),
    (
        "post",
        "/transformations/execute",
        "transformations",
        "Apply a transformation to a text now",
        ("json", s.TransformationExecute),
        {200: s.TransformationExecuted},
        [400, 404, 413, 415, 502, 503, 504],
    ),
    (
        "get",
        "/transformations/{transformation_id}",
        "transformations",
        "Read a transformation",
        None,
        {200: s.TransformationOut},
        [404],
    ),
    (
        "put",
        "/transformations/{transformation_id}",
        "transformations",
        "Update a transformation",
        ("json", s.TransformationUpdate),
        {200: s.TransformationOut},
        [400, 404, 409, 413, 415],
    ),
    (
        "delete",
        "/transformations/{transformation_id}",
        "transformations",
        "Delete a transformation",
        None,
        {200: s.Deleted},
        [404],
    ),
    (
        "post",
        "/sources/{source_id}/insights",
        "sources",
        "Apply a transformation to a source (a job)",
        ("json", s.InsightCreate),
        {202: s.InsightQueued},
        [400, 404, 413, 415],
    ),
    ("get", "/sources/{source_id}/insights", "sources", "The source's insights", None, {200: [s.InsightOut]}, [404]),
    ("get", "/insights/{insight_id}", "sources", "Read an insight", None, {200: s.InsightOut}, [404]),
    ("delete", "/insights/{insight_id}", "sources", "Delete an insight", None, {200: s.Deleted}, [404]),
    # -- chat, ask
    (
        "get",
        "/chat/sessions",
        "chat",
        "List chat sessions",
        ("query", s.ChatSessionQuery),
        {200: [s.ChatSessionOut]},
        [400, 404],
    ),
    (
        "post",
        "/chat/sessions",
        "chat",
        "Create a chat session",
        ("json", s.ChatSessionCreate),
        {201: s.ChatSessionOut},
        [400, 404, 413, 415],
    ),
    ("get", "/chat/sessions/{session_id}", "chat", "A session with its messages", None, {200: s.ChatSessionOut}, [404]),
    (
        "put",
        "/chat/sessions/{session_id}",
        "chat",
        "Update a session",
        ("json", s.ChatSessionUpdate),
        {200: s.ChatSessionOut},
        [400, 404, 413, 415],
    ),
    (
        "delete",
        "/chat/sessions/{session_id}",
        "chat",
        "Delete a session and its messages",
        None,
        {200: s.Deleted},
        [404],
    ),
    (
        "post",
        "/chat/context/build",
        "chat",
        "The context of chosen sources and notes, with sizes",
        ("json", s.ChatContextRequest),
        {200: s.ChatContextOut},
        [400, 404, 413, 415],
    ),
    (
        "post",
        "/chat/context",
        "chat",
        "As /chat/context/build",
        ("json", s.ChatContextRequest),
        {200: s.ChatContextOut},
        [400, 404, 413, 415],
    ),
    (
        "post",
        "/chat/execute",
        "chat",
        "Send a message: the reply and the history (stream: SSE delta records)",
        ("json", s.ChatExecute),
        {200: s.ChatReply},
        [400, 404, 413, 415, 502, 503, 504],
    ),
    (
        "get",
        "/sources/{source_id}/chat/sessions",
        "chat",
        "A source's chat sessions",
        None,
        {200: [s.SourceChatSessionOut]},
        [404],
    ),
    (
        "post",
        "/sources/{source_id}/chat/sessions",
        "chat",
        "Start a chat session about a source",
        ("json", s.SourceChatCreate),
        {201: s.SourceChatSessionOut},
        [400, 404, 413, 415],
    ),
    (
        "get",
        "/sources/{source_id}/chat/sessions/{session_id}",
        "chat",
        "A source chat session with its messages",
        None,
        {200: s.SourceChatSessionOut},
        [404],
    ),
    (
        "put",
        "/sources/{source_id}/chat/sessions/{session_id}",
        "chat",
        "Update a source chat session",
        ("json", s.SourceChatUpdate),
        {200: s.SourceChatSessionOut},
        [400, 404, 413, 415],
    ),
    (
        "delete",
        "/sources/{source_id}/chat/sessions/{session_id}",
        "chat",
        "Delete a source chat session and its messages",
        None,
        {200: s.SourceChatDeleted},
        [404],
    ),
    (
        "post",
        "/sources/{source_id}/chat/sessions/{session_id}/messages",
        "chat",
        "Send a message about the source: SSE records user_message, ai_message…, context_indicators, complete "
        "(or error)",
        ("json", s.SourceChatMessage),
        {200: "sse"},
        [400, 404, 413, 415],
    ),
    (
        "post",
        "/ask",
        "ask",
        "Ask: SSE records strategy, answer…, final_answer, complete (or error)",
        ("json", s.AskRequest),
        {200: "sse"},
        [400, 404, 413, 415],
    ),
    (
        "post",
        "/search/ask",
        "ask",
        "As /ask (Open Notebook's path)",
        ("json", s.AskRequest),
        {200: "sse"},
        [400, 404, 413, 415],
    ),
    (
        "post",
        "/search/ask/simple",
        "ask",
        "Ask without a stream: {answer, question}",
        ("json", s.AskRequest),
        {200: s.AskAnswer},
        [400, 404, 413, 415, 502, 503, 504],
    ),
    # -- podcasts
    (
        "post",
        "/podcasts/generate",
        "podcasts",
        "Generate an episode (a job)",
        ("json", s.PodcastCreate),
        {202: s.PodcastQueued},
        [400, 404, 413, 415],
    ),
    ("get", "/podcasts/episodes", "podcasts", "List episodes", None, {200: [s.EpisodeOut]}, []),
    ("get", "/podcasts/episodes/{episode_id}", "podcasts", "Read an episode", None, {200: s.EpisodeOut}, [404]),
    ("get", "/podcasts/episodes/{episode_id}/audio", "podcasts", "The episode's MP3", None, {200: "mp3"}, [404]),
    (
        "delete",
        "/podcasts/episodes/{episode_id}",
        "podcasts",
        "Delete an episode and its audio",
        None,
        {200: s.Deleted},
        [404],
    ),
    (
        "post",
        "/podcasts/episodes/{episode_id}/retry",
        "podcasts",
        "Make a failed or canceled episode again (a new job)",
        None,
        {202: s.Queued},
        [400, 404],
    ),
    ("get", "/episode-profiles", "podcasts", "The built-in episode profiles", None, {200: [s.EpisodeProfileOut]}, []),
    (
        "get",
        "/episode-profiles/{profile_id}",
        "podcasts",
        "A built-in episode profile, by id or name",
        None,
        {200: s.EpisodeProfileOut},
        [404],
    ),
    ("get", "/speaker-profiles", "podcasts", "The built-in speaker profiles", None, {200: [s.SpeakerProfileOut]}, []),
    (
        "get",
        "/speaker-profiles/{profile_id}",
        "podcasts",
        "A built-in speaker profile, by id or name",
        None,
        {200: s.SpeakerProfileOut},
        [404],
    ),
    ("get", "/languages", "podcasts", "The languages of an episode", None, {200: [s.LanguageOut]}, []),
    *[
        (method, path, "podcasts", "405: the profiles are built in and read-only", None, {}, [405])
        for method, path in (
            ("post", "/episode-profiles"),
            ("post", "/speaker-profiles"),
            ("put", "/episode-profiles/{profile_id}"),
            ("put", "/speaker-profiles/{profile_id}"),
            ("delete", "/episode-profiles/{profile_id}"),
            ("delete", "/speaker-profiles/{profile_id}"),
            ("post", "/episode-profiles/{profile_id}/duplicate"),
            ("post", "/speaker-profiles/{profile_id}/duplicate"),
        )
    ],
]

_PATH_PARAMS = {
    "notebook_id": "notebook:<key>",
    "source_id": "source:<key>",
    "note_id": "note:<key>",
    "command_id": "command:<key>",
    "credential_id": "credential:<key>",
    "model_id": "model:<key>",
    "transformation_id": "transformation:<key>",
    "insight_id": "insight:<key>",
    "session_id": "chat_session:<key>",
    "episode_id": "episode:<key>",
    "profile_id": "a built-in profile's id or name",
}


def _content(schema):
    if schema == "sse":
        return {"text/event-stream": {"schema": {"type": "string"}}}
    if schema == "mp3":
        return {"audio/mpeg": {"schema": {"type": "string", "format": "binary"}}}
    if schema == "file":
        return {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    if isinstance(schema, list):
        return {"application/json": {"schema": {"type": "array", "items": schema[0]}}}
    return {"application/json": {"schema": schema}}


def _multipart_schema():
    """The multipart form of POST /sources: the JSON fields as strings, plus the file."""
    return {
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {"type": "string", "enum": list(s.SOURCE_TYPES)},
            "notebook_id": {"type": "string"},
            "notebooks": {"type": "string", "description": "a JSON list of ids"},
            "file": {"type": "string", "format": "binary"},
            "url": {"type": "string"},
            "content": {"type": "string"},
            "title": {"type": "string"},
            "async_processing": {"type": "boolean"},
            "embed": {"type": "boolean"},
            "delete_source": {"type": "boolean"},
            "transformations": {"type": "string", "description": "a JSON list of transformation ids"},
        },
    }


def _operation(method, path, tag, summary, request, responses, errors):
    op = {
        "tags": [tag],
        "summary": summary,
        "operationId": f"{method}_{path}".replace("/", "_").strip("_").replace("{", "").replace("}", ""),
        "responses": {
            str(code): {"description": "OK" if code < 300 else "Accepted", "content": _content(schema)}
            for code, schema in responses.items()
        },
    }
    params = [
        {"in": "path", "name": name, "required": True, "schema": {"type": "string"}, "description": example}
        for name, example in _PATH_PARAMS.items()
        if "{" + name + "}" in path
    ]
    if request and request[0] == "query":
        params.append({"in": "query", "schema": request[1]})
    elif request and request[0] in ("json", "optional json"):
        op["requestBody"] = {
            "required": request[0] == "json",
            "content": {"application/json": {"schema": request[1]}},
        }
    elif request and request[0] == "source":
        op["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": request[1]},
                "multipart/form-data": {"schema": _multipart_schema()},
            },
        }
    if params:
        op["parameters"] = params
    for code in sorted({*errors, 400, 401, 405, 500} if path not in PUBLIC_PATHS else set(errors)):
        if str(code) not in op["responses"]:
            op["responses"][str(code)] = {
                "description": _ERROR_TEXT.get(code, "Error"),
                "content": {"application/json": {"schema": "Error"}},
            }
    if path in PUBLIC_PATHS:
        op["security"] = []
    else:
        op["responses"]["401"]["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
    return op


# Documented without the password (web.PUBLIC_ENDPOINTS serves them so).
PUBLIC_PATHS = {"/health", "/config", "/auth/status"}

_ERROR_TEXT = {
    400: "Invalid input",
    401: "Missing or wrong password",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Too large",
    415: "Unsupported media type",
    500: "Server error",
    502: "The model provider failed or refused",
    503: "Unavailable (or the provider is rate limiting)",
    504: "The model provider did not answer in time",
}


@functools.lru_cache(maxsize=1)
def document():
    spec = APISpec(
        title="Research notebook API",
        version=VERSION,
        openapi_version="3.0.3",
        plugins=[MarshmallowPlugin()],
        info={
            "description": "Every route is also served under /api (Open Notebook's paths). "
            "Send Authorization: Bearer <NOTEBOOK_PASSWORD>."
        },
    )
    spec.components.security_scheme("bearer", {"type": "http", "scheme": "bearer"})
    spec.components.schema("Error", schema=s.Error)
    paths = {}
    for method, path, tag, summary, request, responses, errors in OPERATIONS:
        paths.setdefault(path, {})[method] = _operation(method, path, tag, summary, request, responses, errors)
    for path, operations in paths.items():
        spec.path(path=path, operations=operations)
    result = spec.to_dict()
    result["security"] = [{"bearer": []}]
    return result


@bp.get("/openapi.json")
def openapi_document():
    """The API's OpenAPI document."""
    return document()


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Research notebook API</title>
<link rel="stylesheet" href="{base}/docs/ui/swagger-ui.css">
<link rel="icon" type="image/png" href="{base}/docs/ui/favicon-32x32.png"></head>
<body><div id="swagger-ui" data-spec="{base}/openapi.json"></div>
<script src="{base}/docs/ui/swagger-ui-bundle.js"></script>
<script src="{base}/docs/ui/swagger-ui-standalone-preset.js"></script>
<script src="{base}/docs/assets/docs.js"></script></body></html>
"""


def _ui_dir():
    directory = settings().swagger_ui_dir
    if not os.path.isfile(os.path.join(directory, "swagger-ui-bundle.js")):
        raise Unavailable(
            "Swagger UI is not installed: run `make setup` (python3 -m devtools.browser_assets) "
            "or set NOTEBOOK_SWAGGER_UI_DIR; /openapi.json works without it"
        )
    return directory


@bp.get("/docs")
@content_security_policy(style_src_elem="'self' 'unsafe-inline'")  # Swagger UI injects a <style> element
def docs_page():
    """The API's documentation page (Swagger UI, served from the service's own files)."""
    from flask import request

    _ui_dir()
    base = "/api" if request.path.startswith("/api/") else ""
    return Response(_PAGE.format(base=base), mimetype="text/html")


@bp.get("/docs/ui/<name>")
def docs_vendor(name):
    """One of Swagger UI's files."""
    if name not in UI_FILES:
        raise NotFound(f"not found: {name[:80]}")
    return send_from_directory(_ui_dir(), name, max_age=3600)

"""Open Notebook's web UI against ours, for its first screens, chat, source chat, ask and
default transformation prompt: the calls its code makes (frontend/src/lib/api/ and its
hooks), with its bodies and headers, read as it reads them.

- Its axios client: `{apiUrl}/api` + path, `Authorization: Bearer <token>`, a JSON
  Content-Type on POST/PUT/PATCH; before login, `/api/config` and `/api/auth/status`
  (with `Cache-Control: no-store`) without a password; the password checked by a plain
  `GET /api/notebooks`.
- Its Next server's SSE proxy (`/api/search/ask`, a source chat's messages): a POST to
  INTERNAL_API_URL + `/api/...` forwarding only Authorization, with `Accept:
  text/event-stream`; the streams read line by line as its hooks do (`data: ` lines;
  the source chat's parser splits each network read without carrying a partial line
  over, so each record must arrive whole in one read)."""

import json
import time
from dataclasses import dataclass, field
from urllib.parse import quote

import psycopg
import pytest
import requests

from app.common.config import RELEASE
from tests.support.notebook import PASSWORD, add_note, add_text_source, credential, notebook_env, restored

ORIGIN = "https://notebook-ui.example.org"


# --------------------------------------------------------------------------- the UI's client


class UiClient:
    """The UI's two ways to the API: axios (`call`) and its Next server's SSE proxy (`proxy_stream`)."""

    def __init__(self, base_url, token=PASSWORD):
        self.base_url, self.token = base_url, token

    def call(self, method, path, json_body=None, params=None, headers=None, auth=True):
        sent = {**({"Authorization": f"Bearer {self.token}"} if auth else {}), **(headers or {})}
        if method in ("POST", "PUT", "PATCH"):
            sent["Content-Type"] = "application/json"
        data = json.dumps(json_body) if json_body is not None else None
        return requests.request(
            method, self.base_url + "/api" + path, data=data, params=params, headers=sent, timeout=60
        )

    def ok(self, method, path, json_body=None, params=None):
        response = self.call(method, path, json_body, params)
        assert response.ok, f"{method} {path}: {response.status_code} {response.text}"
        return response.json()

    def source_chat_message(self, source_id, session_id, body):
        """The Next route of a source chat's messages: both ids encodeURIComponent'd."""
        path = f"/sources/{quote(source_id, safe='')}/chat/sessions/{quote(session_id, safe='')}/messages"
        return self.proxy_stream(path, body)

    def proxy_stream(self, path, body):
        """sseProxy: the browser's body re-posted as text, only Authorization forwarded."""
        return requests.post(
            self.base_url + "/api" + path,
            data=json.dumps(body),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self.token}",
                "Accept": "text/event-stream",
            },
            stream=True,
            timeout=60,
        )


@dataclass
class SourceChatRead:
    """What useSourceChat makes of a stream: the AI bubble, the indicators, the error it throws."""

    types: list = field(default_factory=list)
    ai_text: str | None = None
    indicators: dict | None = None
    error: str | None = None
    unparsed: list = field(default_factory=list)


def read_source_chat(response) -> SourceChatRead:
    """useSourceChat's loop: each network read decoded and split on newlines (no partial
    line carried over), `data: ` lines parsed; an unparsable one is logged and skipped
    (kept here in `unparsed`: none may be); an `error` record ends the reading."""
    read = SourceChatRead()
    for chunk in response.iter_content(chunk_size=None):
        for line in chunk.decode("utf-8").split("\n"):
            if not line.startswith("data: "):
                continue
            try:
                data = json.loads(line[6:])
            except ValueError:
                read.unparsed.append(line)
                continue
            read.types.append(data["type"])
            if data["type"] == "ai_message":
                read.ai_text = (read.ai_text or "") + (data.get("content") or "")
            elif data["type"] == "context_indicators":
                read.indicators = data["data"]
            elif data["type"] == "error":
                read.error = data.get("message") or "Stream error"
                return read
    return read


def read_ask(response):
    """useAsk's loop: a buffer of lines across reads; strategy, answers, the final answer."""
    state = {"strategy": None, "answers": [], "final": None, "error": None}
    buffer = ""
    for chunk in response.iter_content(chunk_size=None):
        buffer += chunk.decode("utf-8")
        *lines, buffer = buffer.split("\n")
        for line in lines:
            if not line.startswith("data: ") or not line[6:].strip():
                continue
            data = json.loads(line[6:].strip())
            if data["type"] == "strategy":
                state["strategy"] = {"reasoning": data.get("reasoning") or "", "searches": data.get("searches") or []}
            elif data["type"] == "answer":
                state["answers"].append(data.get("content") or "")
            elif data["type"] == "final_answer":
                state["final"] = data.get("content") or ""
            elif data["type"] == "complete":
                state["final"] = data["final_answer"] if data.get("final_answer") is not None else state["final"]
            elif data["type"] == "error":
                state["error"] = data.get("message")
                return state
    return state


def completions_with(fake, marker):
    """The chat completion requests the fake provider got whose messages hold `marker`."""
    return [
        r["body"]
        for r in fake.requests_to("/chat/completions")
        if marker in json.dumps((r["body"] or {}).get("messages", []))
    ]


def stored_messages(nb, session_id):
    """How many messages the database holds for a chat session (read past the API)."""
    ((count,),) = [
        tuple(row) for row in nb.query("SELECT COUNT(*) FROM chatmessage WHERE session_id = ?", (session_id[13:],))
    ]
    return count


def system_of(body):
    return next(m["content"] for m in body["messages"] if m["role"] == "system")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def ui(llm_nb):
    return UiClient(llm_nb.url)


@pytest.fixture(scope="module")
def chat_model(llm_nb):
    """A language model under an openai credential (the fake), the default chat model
    for this module (the one before it back at the end: the stack is shared)."""
    before = llm_nb.get("/models/defaults").json()["default_chat_model"]
    cred = credential(llm_nb, "openai", key="sk-good")
    made = llm_nb.post(
        "/models", json={"name": "fake-chat", "provider": "openai", "type": "language", "credential": cred["id"]}
    ).json()
    assert llm_nb.post("/models/config", json={"default_chat_model": made["id"]}).status_code == 200
    yield made
    assert llm_nb.post("/models/config", json={"default_chat_model": before}).status_code == 200


@pytest.fixture(scope="module")
def studied_source(llm_nb, ui, chat_model):
    """A notebook with a text source that has one insight (made by the worker's job)."""
    notebook = llm_nb.notebook()
    source = add_text_source(
        llm_nb, notebook, "Fjords", "Fjords are long narrow inlets carved by glaciers into coastal mountains."
    )
    transformation = ui.ok(
        "POST",
        "/transformations",
        {
            "name": f"gist {time.monotonic_ns()}",
            "title": "Gist",
            "description": "the gist",
            "prompt": "Give the gist.",
            "apply_default": False,
        },
    )
    queued = ui.ok("POST", f"/sources/{source}/insights", {"transformation_id": transformation["id"]})
    assert llm_nb.wait_command(queued["command_id"])["status"] == "completed"
    (insight,) = ui.ok("GET", f"/sources/{source}/insights")
    return {"notebook": notebook, "source": source, "insight": insight}


@pytest.fixture(scope="module")
def browser_facing(start_module_service, tmp_path_factory):
    """A notebook with a password that allows the UI's origin (NOTEBOOK_CORS_ORIGINS):
    the UI's browser calls it directly when API_URL points at it."""
    data_dir = tmp_path_factory.mktemp("notebook-ui-cors")
    env = notebook_env(data_dir, NOTEBOOK_EMBEDDING_PROVIDER="none", NOTEBOOK_CORS_ORIGINS=ORIGIN)
    return start_module_service("notebook", data_dir=data_dir, env=env)


# --------------------------------------------------------------------------- first screens, CORS


def test_the_first_screens_need_no_password(browser_facing):
    ui = UiClient(browser_facing.base_url)
    for path in ("/api/config", "/config"):
        config = requests.get(browser_facing.base_url + path, timeout=10)  # fetch(), no credentials
        assert config.status_code == 200, config.text
        assert config.json() == {"version": RELEASE, "latestVersion": None, "hasUpdate": False, "dbStatus": "online"}
    status = ui.call("GET", "/auth/status", headers={"Cache-Control": "no-store"}, auth=False)
    assert status.status_code == 200 and status.json()["auth_enabled"] is True
    # Then the login page probes the password with a plain GET /api/notebooks.
    assert UiClient(browser_facing.base_url, token="wrong").call("GET", "/notebooks").status_code == 401
    assert ui.call("GET", "/notebooks").status_code == 200
    assert ui.call("GET", "/notebooks", auth=False).status_code == 401  # the rest still needs it


def test_the_config_says_offline_while_the_database_refuses(start_service, postgres_server, tmp_path):
    """dbStatus is a real query, made even when no connection can be had (the UI then
    shows "database offline" rather than "unable to connect")."""
    database_url = postgres_server.new_database()
    name = database_url.rsplit("/", 1)[1]
    env = notebook_env(tmp_path / "data", NOTEBOOK_EMBEDDING_PROVIDER="none", DATABASE_URL=database_url)
    service = start_service("notebook", data_dir=tmp_path / "data", env=env)
    config = service.base_url + "/api/config"
    assert requests.get(config, timeout=10).json()["dbStatus"] == "online"
    with psycopg.connect(postgres_server.url(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        try:
            offline = requests.get(config, timeout=10)
            assert offline.status_code == 200 and offline.json()["dbStatus"] == "offline", offline.text
            assert requests.get(service.base_url + "/health", timeout=10).status_code == 503
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    assert requests.get(config, timeout=10).json()["dbStatus"] == "online"


def test_the_auth_status_of_a_notebook_without_password(start_module_service, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("notebook-ui-open")
    env = notebook_env(
        data_dir, NOTEBOOK_PASSWORD="", NOTEBOOK_ALLOW_NO_PASSWORD="1", NOTEBOOK_EMBEDDING_PROVIDER="none"
    )
    service = start_module_service("notebook", data_dir=data_dir, env=env)
    status = requests.get(service.base_url + "/api/auth/status", headers={"Cache-Control": "no-store"}, timeout=10)
    assert status.json()["auth_enabled"] is False
    # The UI then sends the literal token "not-required": no password, any token passes.
    notebooks = UiClient(service.base_url, token="not-required").call("GET", "/notebooks")
    assert notebooks.status_code == 200


def test_the_preflight_allows_what_the_ui_sends(browser_facing):
    url = browser_facing.base_url
    asks = [
        ("GET", "/api/auth/status", "cache-control"),
        ("POST", "/api/chat/context", "authorization,content-type"),
        ("PUT", "/api/transformations/default-prompt", "authorization,content-type"),
        ("PATCH", "/api/notebooks/notebook:x", "authorization,content-type"),
        ("DELETE", "/api/chat/sessions/chat_session:x", "authorization"),
        ("POST", "/api/search/ask", "accept,authorization,content-type"),
    ]
    for method, path, headers in asks:
        preflight = requests.options(
            url + path,
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": method,
                "Access-Control-Request-Headers": headers,
            },
            timeout=10,
        )
        assert preflight.status_code == 204, (path, preflight.text)
        assert preflight.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert method in preflight.headers["Access-Control-Allow-Methods"].split(", ")
        allowed = {h.strip().lower() for h in preflight.headers["Access-Control-Allow-Headers"].split(",")}
        assert set(headers.split(",")) <= allowed, (path, allowed)
    status = requests.get(url + "/api/auth/status", headers={"Origin": ORIGIN, "Cache-Control": "no-store"}, timeout=10)
    assert status.status_code == 200 and status.headers["Access-Control-Allow-Origin"] == ORIGIN
    # A 401 is readable cross-origin too: the UI sends the browser to /login on it.
    refused = requests.get(url + "/api/notebooks", headers={"Origin": ORIGIN}, timeout=10)
    assert refused.status_code == 401 and refused.headers["Access-Control-Allow-Origin"] == ORIGIN


# --------------------------------------------------------------------------- the notebook chat


def test_the_notebook_chat_as_the_ui_drives_it(llm_nb, ui, chat_model, studied_source):
    notebook, kept, insight = studied_source["notebook"], studied_source["source"], studied_source["insight"]
    left_out = add_text_source(llm_nb, notebook, "Moraines", "Moraines are ridges of debris left by glaciers.")
    note = add_note(llm_nb, notebook, "Field trip", "Bring crampons to the glacier walk.")
    other_note = add_note(llm_nb, notebook, "Budget", "The budget allows two nights in Bergen.")
    assert ui.ok("GET", "/chat/sessions", params={"notebook_id": notebook}) == []

    def build_context(sources, notes):
        built = ui.ok(
            "POST", "/chat/context", {"notebook_id": notebook, "context_config": {"sources": sources, "notes": notes}}
        )
        assert built["char_count"] > 0 and built["token_count"] > 0
        return built["context"]

    # useNotebookChat: every source and note is in context_config, the excluded ones as "not in".
    context = build_context({kept: "insights", left_out: "not in"}, {note: "full content", other_note: "not in"})
    assert [(i["id"], i["mode"]) for i in context["sources"]] == [(kept, "insights")]
    assert insight["content"] in context["sources"][0]["content"]
    assert [i["id"] for i in context["notes"]] == [note]
    full = build_context({kept: "full content", left_out: "not in context"}, {note: "not in", other_note: "not in"})
    assert "carved by glaciers" in full["sources"][0]["content"] and full["notes"] == []

    # No session yet: the first message creates one (model_override left out: undefined), then executes.
    session = ui.ok("POST", "/chat/sessions", {"notebook_id": notebook, "title": "Which glaciers carve fjords?"})
    assert (session["notebook_id"], session["message_count"], session["model_override"]) == (notebook, 0, None)
    marker = f"crampons? {time.monotonic_ns()}"
    reply = ui.ok("POST", "/chat/execute", {"session_id": session["id"], "message": marker, "context": context})
    assert reply["session_id"] == session["id"]
    assert [(m["type"], m["content"][:9]) for m in reply["messages"]] == [("human", marker[:9]), ("ai", "Reply fro")]
    assert all(m["id"] and m["timestamp"] for m in reply["messages"])
    (sent,) = completions_with(llm_nb.fake, marker)
    assert insight["content"] in system_of(sent) and "Bring crampons" in system_of(sent)
    assert "Moraines are ridges" not in system_of(sent) and "two nights in Bergen" not in system_of(sent)

    listed = ui.ok("GET", "/chat/sessions", params={"notebook_id": notebook})
    assert [(s["id"], s["message_count"]) for s in listed] == [(session["id"], 2)]
    assert [m["type"] for m in ui.ok("GET", f"/chat/sessions/{session['id']}")["messages"]] == ["human", "ai"]
    changed = ui.ok("PUT", f"/chat/sessions/{session['id']}", {"model_override": chat_model["id"]})
    assert changed["model_override"] == chat_model["id"]
    assert ui.ok("PUT", f"/chat/sessions/{session['id']}", {"model_override": None})["model_override"] is None
    assert ui.call("DELETE", f"/chat/sessions/{session['id']}").status_code == 200
    assert ui.call("GET", f"/chat/sessions/{session['id']}").status_code == 404


def test_chat_context_refuses_what_it_cannot_take(llm_nb, ui):
    notebook = llm_nb.notebook()
    source = add_text_source(llm_nb, notebook, "Cirques", "Cirques are bowl-shaped hollows.")
    cases = [
        (
            {"notebook_id": notebook, "context_config": {"sources": {source: "not included"}}},
            400,
            "context_config.sources",
        ),
        ({"notebook_id": notebook, "context_config": {"notes": {"note:x": "summary"}}}, 400, "context_config.notes"),
        ({"notebook_id": notebook, "context_config": {"sources": {source: 3}}}, 400, "context_config"),
        ({"notebook_id": notebook, "context_config": {}, "budget": 5}, 400, "budget"),
        ({"notebook_id": "notebook:nosuch", "context_config": {}}, 404, "notebook:nosuch"),
        ({"context_config": {}}, 400, "notebook_id"),
    ]
    for body, status, named in cases:
        response = ui.call("POST", "/chat/context", body)
        assert response.status_code == status, (body, response.text)
        assert named in response.json()["detail"] + response.json().get("field", ""), (body, response.json())


# --------------------------------------------------------------------------- the source chat


def test_the_source_chat_as_the_ui_drives_it(llm_nb, ui, chat_model, studied_source):
    source, insight = studied_source["source"], studied_source["insight"]
    assert ui.ok("GET", f"/sources/{source}/chat/sessions") == []
    # sourceChatApi.createSession: the path's id, and the key alone as source_id in the body.
    created = ui.call(
        "POST", f"/sources/{source}/chat/sessions", {"title": "How deep are fjords?", "source_id": source[7:]}
    )
    assert created.status_code == 201, created.text
    session = created.json()
    assert (session["source_id"], session["title"], session["message_count"]) == (source, "How deep are fjords?", 0)
    assert session["messages"] == [] and session["context_indicators"] is None and session["created"]

    marker = f"How deep are they? {time.monotonic_ns()}"
    response = ui.source_chat_message(source, session["id"], {"message": marker})
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/event-stream")
    read = read_source_chat(response)
    assert read.unparsed == [] and read.error is None
    assert read.types[0] == "user_message" and read.types[-2:] == ["context_indicators", "complete"]
    assert read.types.count("ai_message") > 1  # the reply in pieces, appended into one bubble
    assert read.ai_text.startswith(f"Reply from fake-chat [{source}] to: {marker[:20]}")
    assert read.indicators == {"sources": [source], "insights": [insight["id"]], "notes": []}
    (sent,) = completions_with(llm_nb.fake, marker)
    assert "coastal mountains" in system_of(sent) and insight["content"] in system_of(sent)

    # Then the hook refetches the session: the turn is stored, the indicators are there.
    again = ui.ok("GET", f"/sources/{source}/chat/sessions/{session['id']}")
    assert [(m["type"], m["content"]) for m in again["messages"]] == [("human", marker), ("ai", read.ai_text)]
    assert again["context_indicators"] == read.indicators and again["message_count"] == 2
    # A second turn carries the first as history.
    follow_up = f"And their width? {time.monotonic_ns()}"
    assert read_source_chat(ui.source_chat_message(source, session["id"], {"message": follow_up})).error is None
    (second,) = completions_with(llm_nb.fake, follow_up)
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]

    listed = ui.ok("GET", f"/sources/{source}/chat/sessions")
    assert [(s["id"], s["message_count"], s["source_id"]) for s in listed] == [(session["id"], 4, source)]
    # One mechanism: it is a chat session, and not one of its notebook's chat.
    assert ui.ok("GET", f"/chat/sessions/{session['id']}")["source_id"] == source
    notebook_chats = ui.ok("GET", "/chat/sessions", params={"notebook_id": studied_source["notebook"]})
    assert session["id"] not in {s["id"] for s in notebook_chats}
    via_execute = f"Asked through /chat/execute {time.monotonic_ns()}"  # without a context: the source's
    assert len(ui.ok("POST", "/chat/execute", {"session_id": session["id"], "message": via_execute})["messages"]) == 6
    (third,) = completions_with(llm_nb.fake, via_execute)
    assert "coastal mountains" in system_of(third)

    renamed = ui.ok("PUT", f"/sources/{source}/chat/sessions/{session['id']}", {"title": "Fjord depths"})
    assert renamed["title"] == "Fjord depths" and renamed["message_count"] == 6
    with_model = ui.ok("PUT", f"/sources/{source}/chat/sessions/{session['id']}", {"model_override": chat_model["id"]})
    assert with_model["model_override"] == chat_model["id"]
    deleted = ui.call("DELETE", f"/sources/{source}/chat/sessions/{session['id']}")
    assert deleted.status_code == 200 and deleted.json()["success"] is True
    assert ui.call("GET", f"/sources/{source}/chat/sessions/{session['id']}").status_code == 404
    assert stored_messages(llm_nb, session["id"]) == 0


def test_the_source_chat_refuses_bad_input(llm_nb, ui, chat_model, studied_source):
    source = studied_source["source"]
    other = add_text_source(llm_nb, studied_source["notebook"], "Eskers", "Eskers are ridges of sand.")
    mine = ui.ok("POST", f"/sources/{source}/chat/sessions", {"title": "mine"})["id"]
    theirs = ui.ok("POST", f"/sources/{other}/chat/sessions", {"title": "theirs"})["id"]
    notebook_chat = ui.ok("POST", "/chat/sessions", {"notebook_id": studied_source["notebook"], "title": "nb"})["id"]
    sessions = f"/sources/{source}/chat/sessions"
    cases = [
        ("GET", "/sources/source:nosuch/chat/sessions", None, 404, "source:nosuch"),
        ("POST", "/sources/source:nosuch/chat/sessions", {"title": "t"}, 404, "source:nosuch"),
        ("GET", f"{sessions}/chat_session:nosuch", None, 404, "chat_session:nosuch"),
        ("GET", f"{sessions}/{theirs}", None, 404, theirs),
        ("GET", f"{sessions}/{notebook_chat}", None, 404, notebook_chat),
        ("PUT", f"{sessions}/{theirs}", {"title": "x"}, 404, theirs),
        ("DELETE", f"{sessions}/{theirs}", None, 404, theirs),
        ("POST", f"{sessions}/{theirs}/messages", {"message": "hi"}, 404, theirs),
        ("POST", f"/sources/source:nosuch/chat/sessions/{mine}/messages", {"message": "hi"}, 404, "source:nosuch"),
        ("POST", sessions, {"title": "t", "notebook_id": studied_source["notebook"]}, 400, "notebook_id"),
        ("POST", sessions, {"title": "t", "source_id": other}, 400, "source_id"),
        ("POST", sessions, {"title": 7}, 400, "title"),
        ("POST", sessions, {"model_override": "model:nosuch"}, 404, "model_override"),
        ("PUT", f"{sessions}/{mine}", {}, 400, "give at least one"),
        ("PUT", f"{sessions}/{mine}", {"messages": []}, 400, "messages"),
        ("POST", f"{sessions}/{mine}/messages", {"message": "  "}, 400, "message"),
        ("POST", f"{sessions}/{mine}/messages", {}, 400, "message"),
        ("POST", f"{sessions}/{mine}/messages", {"message": "hi", "stream": True}, 400, "stream"),
        (
            "POST",
            f"{sessions}/{mine}/messages",
            {"message": "hi", "model_override": "model:nosuch"},
            404,
            "model_override",
        ),
    ]
    for method, path, body, status, named in cases:
        response = ui.call(method, path, body)
        assert response.status_code == status, (method, path, body, response.text)
        assert response.headers["Content-Type"] == "application/json"  # what the proxy hands back
        assert named in response.json()["detail"] + response.json().get("field", ""), (path, response.json())
    for session in (mine, theirs):  # nothing changed
        assert stored_messages(llm_nb, session) == 0
    assert [s["id"] for s in ui.ok("GET", sessions)] == [mine]
    # A source's chat sessions go with it.
    assert ui.call("DELETE", f"/sources/{other}").status_code == 200
    assert [tuple(r) for r in llm_nb.query("SELECT COUNT(*) FROM chatsession WHERE id = ?", (theirs[13:],))] == [(0,)]


def test_the_source_chat_without_a_model_says_so(llm_nb, ui, chat_model, studied_source):
    source = studied_source["source"]
    session = ui.ok("POST", f"/sources/{source}/chat/sessions", {"title": "no model"})["id"]
    assert llm_nb.post("/models/config", json={"default_chat_model": None}).status_code == 200
    try:
        response = ui.source_chat_message(source, session, {"message": "Anyone?"})
        read = read_source_chat(response)
        assert read.types == ["user_message", "error"] and read.ai_text is None
        assert "default_chat_model" in read.error  # what the UI shows in its toast
    finally:
        assert llm_nb.post("/models/config", json={"default_chat_model": chat_model["id"]}).status_code == 200
    assert ui.ok("GET", f"/sources/{source}/chat/sessions/{session}")["messages"] == []


# --------------------------------------------------------------------------- ask


def test_ask_streams_through_the_api_prefix(llm_nb, ui, chat_model, studied_source):
    models = {field: chat_model["id"] for field in ("strategy_model", "answer_model", "final_answer_model")}
    response = ui.proxy_stream("/search/ask", {"question": "Which glaciers carve fjords?", **models})
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["X-Accel-Buffering"] == "no"
    state = read_ask(response)
    assert state["error"] is None and state["strategy"]["searches"]
    assert state["answers"] and state["final"].startswith("Reply from fake-chat")
    # A refusal before the stream is JSON with the detail the UI shows.
    refused = ui.proxy_stream("/search/ask", {"question": "Why?", **models, "strategy_model": "model:nosuch"})
    assert refused.status_code == 404 and "strategy_model" in refused.json()["detail"]
    unknown = ui.proxy_stream("/search/ask", {"question": "Why?", **models, "temperature": 0.2})
    assert unknown.status_code == 400 and "temperature" in unknown.json()["detail"]


# --------------------------------------------------------------------------- the default prompt


def test_the_default_prompt_goes_before_every_transformation(llm_nb, ui, chat_model, studied_source):
    marker = f"Write in plain words ({time.monotonic_ns()})."
    # The stack is shared: the prompt another module left is read, and set back after.
    with restored(llm_nb, "/transformations/default-prompt") as (before,):
        assert set(before) == {"transformation_instructions"} and isinstance(before["transformation_instructions"], str)
        saved = ui.ok("PUT", "/transformations/default-prompt", {"transformation_instructions": marker})
        assert saved == {"transformation_instructions": marker}
        assert llm_nb.get("/transformations/default-prompt").json() == saved  # stored: any path, any worker
        made = ui.ok(
            "POST",
            "/transformations",
            {"name": f"outline {time.monotonic_ns()}", "title": "Outline", "description": "", "prompt": "Outline it."},
        )
        ui.ok(
            "POST",
            "/transformations/execute",
            {"transformation_id": made["id"], "input_text": "Ice.", "model_id": None},
        )
        queued = ui.ok("POST", f"/sources/{studied_source['source']}/insights", {"transformation_id": made["id"]})
        assert llm_nb.wait_command(queued["command_id"])["status"] == "completed"
        sent = completions_with(llm_nb.fake, marker)
        assert [system_of(body) for body in sent] == [f"{marker}\n\nOutline it."] * 2  # the route and the job
        for body, named in (
            ({}, "transformation_instructions"),
            ({"transformation_instructions": 5}, "transformation_instructions"),
            ({"transformation_instructions": "x", "prompt": "y"}, "prompt"),
        ):
            refused = ui.call("PUT", "/transformations/default-prompt", body)
            assert refused.status_code == 400 and named in refused.json()["detail"], refused.text
        assert ui.ok("GET", "/transformations/default-prompt") == saved  # unchanged by the refusals

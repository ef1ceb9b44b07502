"""Open Notebook's web UI as our notebook sees it: the HTTP calls of its Next.js app
(lfnovo/open-notebook, `frontend/src/lib/`), written from reading that code, none of
it copied. `UiClient` makes requests the way its axios instance does (`lib/api/client.ts`),
its two raw `fetch` calls (`lib/config.ts`, `lib/stores/auth-store.ts`) and its two
streams (`lib/api/search.ts`, `lib/api/source-chat.ts`, read as `lib/hooks/use-ask.ts`
and `lib/hooks/use-source-chat.ts` read them).

What the UI does that matters to a server:
- axios: `baseURL` `{apiUrl}/api`; `Authorization: Bearer <token>` once logged in (none
  before: `/auth/status` goes out without it); `Content-Type: application/json` on a
  POST/PUT/PATCH that has a body, none on one without (axios drops it when there is no
  data) and the browser's multipart boundary for a FormData; query parameters with
  booleans as `true`/`false`. Any status outside 2xx rejects the call: `UiCallFailed`.
- The streams are plain `fetch` POSTs with JSON and the token; a non-2xx is an error
  (the ask page shows the body's `detail`); the body is read line by line, each
  `data: ` line parsed as JSON.
"""

import codecs
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import requests

from tests.support.notebook import credential, model, restored

FormValue = str | tuple[str, bytes, str]  # a FormData field: a string or (file name, bytes, type)
TIMEOUT = 120  # a chat or an ask with the fake providers answers in seconds


class UiCallFailed(AssertionError):
    """A call the UI would see rejected: its status and body, to read in the test's failure."""

    def __init__(self, method: str, path: str, response: requests.Response) -> None:
        self.status = response.status_code
        self.body = response.text[:2000]
        super().__init__(f"{method} /api{path} -> {self.status}: {self.body}")


def _query(params: dict[str, Any] | None) -> dict[str, str] | None:
    """axios serializes a boolean parameter as `true`/`false` (requests would send `True`)."""
    if params is None:
        return None
    return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in params.items() if v is not None}


class UiClient:
    """One browser tab of the UI: its API base and, once logged in, its token."""

    def __init__(self, origin: str) -> None:
        self.origin = origin  # what the UI's `/config` answers as apiUrl
        self.api = origin + "/api"
        self.token: str | None = None

    # ------------------------------------------------------------------ axios (lib/api/client.ts)

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        form: list[tuple[str, FormValue]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> requests.Response:
        sent: dict[str, str] = {"Accept": "application/json, text/plain, */*"}
        if self.token:
            sent["Authorization"] = f"Bearer {self.token}"
        data: Any = None
        if json_body is not None:
            sent["Content-Type"] = "application/json"
            data = json.dumps(json_body)
        sent.update(headers or {})
        # A FormData is always multipart, in the order of its appends, file or not.
        files = [(name, (None, v) if isinstance(v, str) else v) for name, v in form] if form is not None else None
        response = requests.request(
            method, self.api + path, headers=sent, params=_query(params), data=data, files=files, timeout=TIMEOUT
        )
        if not 200 <= response.status_code < 300:
            raise UiCallFailed(method, path, response)
        return response

    def _data(self, response: requests.Response) -> Any:
        """axios's `response.data`: the parsed JSON of a JSON answer, else its text."""
        if not response.content:
            return ""
        if "json" in response.headers.get("Content-Type", ""):
            return response.json()
        return response.text

    def get(self, path: str, **kwargs: Any) -> Any:
        return self._data(self.request("GET", path, **kwargs))

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self._data(self.request("POST", path, json_body=body, **kwargs))

    def put(self, path: str, body: Any, **kwargs: Any) -> Any:
        return self._data(self.request("PUT", path, json_body=body, **kwargs))

    def post_form(self, path: str, form: list[tuple[str, FormValue]]) -> Any:
        """A FormData POST (lib/api/sources.ts create): the browser sets the multipart type."""
        return self._data(self.request("POST", path, form=form))

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self._data(self.request("DELETE", path, **kwargs))

    # ------------------------------------------------------------------ raw fetches

    def backend_config(self) -> dict[str, Any]:
        """lib/config.ts fetchConfig: `{apiUrl}/api/config` with `cache: 'no-store'` (the
        browser adds `Cache-Control`/`Pragma: no-cache`), no credentials; any non-2xx
        is the "Unable to connect to API" screen."""
        response = requests.get(
            self.api + "/config", headers={"Cache-Control": "no-cache", "Pragma": "no-cache"}, timeout=TIMEOUT
        )
        if not response.ok:
            raise UiCallFailed("GET", "/config", response)
        return response.json()

    def try_password(self, password: str) -> requests.Response:
        """lib/stores/auth-store.ts login/checkAuth: a raw `GET {apiUrl}/api/notebooks`
        with the candidate password as the bearer token (no interceptors)."""
        return requests.get(
            self.api + "/notebooks",
            headers={"Authorization": f"Bearer {password}", "Content-Type": "application/json"},
            timeout=TIMEOUT,
        )

    # ------------------------------------------------------------------ streams

    def stream(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The SSE calls (lib/api/search.ts askKnowledgeBase, lib/api/source-chat.ts
        sendMessage): `fetch` POST with JSON and the token; then every `data: ` line of
        the body parsed as JSON, blank payloads skipped (lib/hooks/use-ask.ts)."""
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        with requests.post(
            self.api + path, headers=headers, data=json.dumps(body), stream=True, timeout=TIMEOUT
        ) as response:
            if not response.ok:
                raise UiCallFailed("POST", path, response)
            decoder = codecs.getincrementaldecoder("utf-8")()  # the UI's TextDecoder with stream: true
            return list(_data_lines(decoder.decode(chunk) for chunk in response.iter_content(chunk_size=None)))


def _data_lines(chunks: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The UI's reader: split the text on newlines, keep the last partial line for the
    next chunk, parse each `data: ` line (a line that is not JSON is an error here:
    the UI would log and drop it, and the test should say so)."""
    buffer = ""
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split("\n")
        for line in lines:
            if line.startswith("data: ") and line[6:].strip():
                yield json.loads(line[6:].strip())
    if buffer.startswith("data: ") and buffer[6:].strip():
        yield json.loads(buffer[6:].strip())


# --------------------------------------------------------------------------- set-up through our own API


def fake_openai_models(nb: Any) -> dict[str, str]:
    """A chat and an embedding model of the fake OpenAI (`llm_nb`), made through our
    own API, so that a journey under test is not also its own set-up."""
    cred = credential(nb, "openai", key="sk-good")
    return {
        "chat": model(nb, "fake-chat", "openai", cred)["id"],
        "embedding": model(nb, "fake-embed", "openai", cred, kind="embedding")["id"],
    }


@contextmanager
def default_models(nb: Any, models: dict[str, str]) -> Iterator[dict[str, str]]:
    """The defaults the model journeys need, set for the `with` block and the ones
    before put back after it (the stack is shared between modules: a later one must
    not inherit, say, an embedding default). Yields `models`."""
    with restored(nb, "/models/defaults"):
        answer = nb.put(
            "/models/defaults",
            json={
                "default_chat_model": models["chat"],
                "default_transformation_model": models["chat"],
                "default_embedding_model": models["embedding"],
            },
        )
        assert answer.status_code == 200, answer.text
        yield models

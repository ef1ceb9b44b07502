"""The deck review pages (the home page and the review page), tested through the
real service under gunicorn: the HTML, the static JS and CSS they load, and the
JS itself (syntax and the pure reconnect helpers) when node is installed.

A real-browser test of the pages is left for later (no Playwright here)."""

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
import requests

TIMEOUT = 10
# Module scripts run only when served with a JavaScript MIME type; which of the two
# names Python's mimetypes picks depends on the host's /etc/mime.types.
JS_TYPES = ("text/javascript", "application/javascript")
NODE = shutil.which("node")


def node():
    """node's path: `make test` installs it (Debian's nodejs); a missing one fails."""
    assert NODE, "node is not installed (Debian package nodejs; make test installs it)"
    return NODE


class Page(HTMLParser):
    """What the tests look at in a page: scripts, stylesheets, elements by id,
    labels and form controls, and the text of the first <h1>."""

    def __init__(self, html):
        super().__init__()
        self.scripts, self.stylesheets, self.controls = [], [], []
        self.by_id, self.label_for = {}, set()
        self.h1, self._label_depth, self._in_h1 = None, 0, False
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.by_id[attrs["id"]] = (tag, attrs)
        if tag == "script" and attrs.get("src"):
            self.scripts.append(attrs)
        elif tag == "link" and attrs.get("rel") == "stylesheet":
            self.stylesheets.append(attrs["href"])
        elif tag == "label":
            self._label_depth += 1
            if attrs.get("for"):
                self.label_for.add(attrs["for"])
        elif tag in ("input", "select", "textarea"):
            self.controls.append((tag, attrs, self._label_depth > 0))
        elif tag == "h1" and self.h1 is None:
            self._in_h1, self.h1 = True, ""

    def handle_endtag(self, tag):
        if tag == "label":
            self._label_depth -= 1
        elif tag == "h1":
            self._in_h1 = False

    def handle_data(self, data):
        if self._in_h1:
            self.h1 += data


def get(url, **kwargs):
    return requests.get(url, timeout=TIMEOUT, **kwargs)


def html_page(url):
    response = get(url)
    assert response.status_code == 200, response.text[:500]
    assert response.headers["Content-Type"].startswith("text/html")
    return response.text, Page(response.text)


def check_assets(base_url, page, script, stylesheet="/static/decks.css"):
    """The page loads `script` as an ES module and `stylesheet`, both from this
    service (no CDN), and both are served with the content type a browser needs."""
    sources = [s["src"] for s in page.scripts]
    assert script in sources, sources
    assert all(s.get("type") == "module" for s in page.scripts), page.scripts
    assert stylesheet in page.stylesheets, page.stylesheets
    for url in sources + page.stylesheets:
        assert url.startswith("/static/"), f"{url} is not served by the service itself"
        response = get(base_url + url)
        assert response.status_code == 200, url
        kind = response.headers["Content-Type"].split(";")[0].strip()
        assert kind in (JS_TYPES if url.endswith(".js") else ("text/css",)), (url, kind)
        assert response.text.strip(), f"{url} is empty"


def unlabelled_controls(page):
    """Form controls with no <label for>, no wrapping <label> and no aria label."""
    missing = []
    for tag, attrs, in_label in page.controls:
        if attrs.get("type") in ("hidden", "submit", "button"):
            continue
        labelled = (
            in_label or attrs.get("id") in page.label_for or attrs.get("aria-label") or attrs.get("aria-labelledby")
        )
        if not labelled:
            missing.append((tag, attrs))
    return missing


def static_text(base_url, name):
    response = get(f"{base_url}/static/{name}")
    assert response.status_code == 200, name
    return response.text


def test_home_page_is_html_and_loads_its_module_and_css(decks_server):
    _, page = html_page(decks_server.base_url + "/")
    check_assets(decks_server.base_url, page, "/static/index.js")
    # The hooks index.js fills in: the start form, and the two lists with their status lines.
    for element_id in (
        "start-form",
        "start-deck",
        "start-title",
        "start-error",
        "decks-status",
        "decks-list",
        "sessions-status",
        "sessions-list",
    ):
        assert element_id in page.by_id, element_id
    assert unlabelled_controls(page) == []


def test_review_page_shows_the_session_it_links_from(deck_session):
    service, session = deck_session
    # The link the API hands out is the page's address.
    text, page = html_page(service.base_url + session["link"])
    check_assets(service.base_url, page, "/static/review.js")
    assert session["id"] in text
    assert page.h1 == session["title"] == "Welcome to deck review"
    tag, attrs = page.by_id["review"]
    assert attrs["data-session-id"] == session["id"]
    assert attrs["data-deck-id"] == session["deck_id"] == "welcome"
    # review.js draws on these: the slide stage with its scribble canvas, the
    # navigation, the connection state, the forms and the feed.
    for element_id in (
        "stage",
        "slide",
        "pad",
        "overlays",
        "prev",
        "next",
        "notes",
        "conn",
        "conn-state",
        "author",
        "comment-form",
        "verdict-form",
        "scribble-send",
        "scribble-clear",
        "show-scribbles",
        "feed",
    ):
        assert element_id in page.by_id, element_id
    assert page.by_id["pad"][0] == "canvas"
    assert unlabelled_controls(page) == []


def test_review_page_escapes_the_session_title(decks_server):
    url = decks_server.base_url
    requests.post(f"{url}/api/decks/import", json=decks_server.import_body, timeout=TIMEOUT).raise_for_status()
    title = '<script>alert("x")</script> & <b>bold</b>'
    response = requests.post(f"{url}/api/sessions", json={"deck_id": "welcome", "title": title}, timeout=TIMEOUT)
    assert response.status_code == 201, response.text
    text, page = html_page(url + response.json()["link"])
    assert "<script>alert" not in text and "<b>bold" not in text
    assert page.h1 == title  # shown as text, exactly as typed


@pytest.mark.parametrize("session_id", ["0123456789abcdef0123456789abcdef", "no.such-id"])
def test_review_page_of_a_missing_session_is_404(decks_server, session_id):
    response = get(f"{decks_server.base_url}/review/{session_id}")
    assert response.status_code == 404
    assert "does not exist" in response.json()["error"]


def test_review_js_reconnects_with_the_spec_backoff(decks_server):
    """Spec 000 B: backoff from 1 s to a 30 s ceiling, cursor from the events held,
    reopened with ?after=. The constants and helpers are exported so the node test
    below can run them; this check needs no node."""
    js = static_text(decks_server.base_url, "review.js")
    assert re.search(r"^export const FIRST_DELAY_S = 1;", js, re.M), "backoff must start at 1 s"
    assert re.search(r"^export const MAX_DELAY_S = 30;", js, re.M), "backoff ceiling must be 30 s"
    for name in ("nextDelay", "cursorOf", "streamUrl"):
        assert re.search(rf"^export function {name}\(", js, re.M), f"{name} is not exported"
    assert "/stream?after=${cursor}" in js
    # The browser's own EventSource retry must never run: every error closes it.
    assert re.search(r"onerror = \(\) => \{\s*es\.close\(\);", js)


def test_page_scripts_never_insert_event_text_as_html(decks_server):
    """Only the server-rendered slide HTML goes in as HTML; event and API text is
    always set with textContent. A new innerHTML use has to be looked at here."""
    for name, allowed in (("review.js", ["slide.html"]), ("index.js", [])):
        js = static_text(decks_server.base_url, name)
        assert re.findall(r"\.innerHTML\s*=\s*([^;\n]+)", js) == allowed, name
        assert "outerHTML" not in js and "insertAdjacentHTML" not in js and "document.write" not in js, name


def test_javascript_files_parse(decks_server, tmp_path):
    for name in ("index.js", "review.js"):
        # The files are ES modules; node treats a .js file outside a "type": "module"
        # package as CommonJS, so check a copy named .mjs.
        copy = tmp_path / name.replace(".js", ".mjs")
        copy.write_text(static_text(decks_server.base_url, name))
        result = subprocess.run([node(), "--check", str(copy)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{name}: {result.stderr}"


def test_reconnect_helpers_under_node(decks_server, tmp_path):
    """Runs review.js's pure helpers: importing the module outside a browser must
    have no side effects (no document), and the backoff and cursor must follow the spec."""
    (tmp_path / "review.mjs").write_text(static_text(decks_server.base_url, "review.js"))
    (tmp_path / "run.mjs").write_text("""
import { nextDelay, cursorOf, streamUrl, eventSummary, FIRST_DELAY_S, MAX_DELAY_S } from "./review.mjs";
const delays = [];
let delay = 0;  // 0: the stream last opened fine
for (let i = 0; i < 8; i++) delays.push(delay = nextDelay(delay));
const held = new Map([[2, {seq: 2}], [9, {seq: 9}], [4, {seq: 4}]]);
console.log(JSON.stringify({
  constants: [FIRST_DELAY_S, MAX_DELAY_S],
  delays,
  afterUndefined: nextDelay(undefined),
  emptyCursor: cursorOf([]),
  cursor: cursorOf(held.values()),
  cursorIgnoresJunk: cursorOf([{seq: 3}, {}, null, {seq: "99"}, {seq: 1}]),
  url: streamUrl("abc123", 9),
  taskDone: eventSummary({type: "task_done", seq: 5, task_seq: 3}),
  verdict: eventSummary({type: "verdict", seq: 6, value: "changes_requested", text: "<b>no</b>"}),
}));
""")
    result = subprocess.run([node(), str(tmp_path / "run.mjs")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["constants"] == [1, 30]
    assert got["delays"] == [1, 2, 4, 8, 16, 30, 30, 30]
    assert got["afterUndefined"] == 1
    assert got["emptyCursor"] == 0
    assert got["cursor"] == 9
    assert got["cursorIgnoresJunk"] == 3
    assert got["url"] == "/api/sessions/abc123/stream?after=9"
    assert got["taskDone"] == {"label": "Task done", "text": "Task #3 marked done"}
    assert got["verdict"] == {"label": "Verdict: Changes requested", "text": "<b>no</b>"}

"""Workspace apps on hosts of their own (WORKSPACE_WILDCARD_ACCESS_URL), through a real
nginx that serves the wildcard beside the platform, with a real agent and real apps:
the handshake that signs a browser in on an app host, the limits of its app token (its
own host only, single-use tickets, sign-out), sharing on app hosts and on paths (locked
down; the dangerous flags and their sandbox), and what an app's answer may not do (set
the platform's cookies, speak to nginx)."""

import json
import socket
import time
from types import SimpleNamespace
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
import requests

from app.workspace.access.app_hosts import sealer
from tests.support.proxy import ATTACKER_TOKEN, HostileApp
from tests.support.workspace import (
    APPS_SUFFIX,
    PLATFORM_HOST,
    TOKEN_HEADER,
    AgentProcess,
    create_workspace,
    platform_behind_nginx,
    wait_status,
)

PLATFORM, APPS = PLATFORM_HOST, APPS_SUFFIX
SANDBOX = "sandbox allow-scripts allow-forms allow-popups allow-downloads"
HTML = {"Accept": "text/html,*/*"}
JSON = {"Accept": "application/json"}
NOT_FOUND = {"message": "Workspace app not found."}


def _set_cookie(line):
    """(name, value, {attribute: value}) of a Set-Cookie line (values may hold '=')."""
    pair, *attributes = [part.strip() for part in line.split(";")]
    name, _, value = pair.partition("=")
    return name, value, {a.partition("=")[0].lower(): a.partition("=")[2] for a in attributes}


class Browser:
    """requests, as a browser goes: every *.localhost name reaches the nginx on
    127.0.0.1 (glibc does not resolve them, Chromium does), cookies are kept per host
    (host-only, as the platform and the apps set them) and redirects are followed
    across hosts. `.set_cookies` lists every Set-Cookie received: (host, line)."""

    def __init__(self, port):
        self.port, self.jar, self.set_cookies = port, {}, []

    def request(self, method, url, headers=None, follow=True, **kwargs):
        hops = []
        while True:
            parts = urlsplit(url)
            sent = {"Host": parts.netloc, **HTML, **(headers or {})}
            if self.jar.get(parts.hostname):
                sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.jar[parts.hostname].items())
            target = f"http://127.0.0.1:{self.port}{parts.path or '/'}" + (f"?{parts.query}" if parts.query else "")
            response = requests.request(method, target, headers=sent, allow_redirects=False, timeout=10, **kwargs)
            for line in response.raw.headers.getlist("Set-Cookie"):
                self.set_cookies.append((parts.hostname, line))
                name, value, attributes = _set_cookie(line)
                if attributes.get("max-age") == "0" or not value:
                    self.jar.get(parts.hostname, {}).pop(name, None)
                else:
                    self.jar.setdefault(parts.hostname, {})[name] = value
            hops.append((response.status_code, url))
            if not follow or response.status_code not in (301, 302, 303, 307, 308):
                response.hops, response.final_url = hops, url
                return response
            assert len(hops) < 10, hops
            url = urljoin(url, response.headers["Location"])
            method = "GET" if response.status_code == 303 else method

    def get(self, url, **kwargs):
        return self.request("GET", url, **kwargs)


def _direct(port, host, path, headers=None, method="GET", **kwargs):
    """One request through nginx to `host`, no redirect followed."""
    return requests.request(
        method,
        f"http://127.0.0.1:{port}{path}",
        headers={"Host": host, **(headers or {})},
        allow_redirects=False,
        timeout=10,
        **kwargs,
    )


def _platform(start_module_service, tmp_path_factory, env, wildcard):
    """A platform behind nginx at http://workspace.localhost:PORT (and the app hosts
    *.apps.localhost:PORT when `wildcard`), an Owner (an administrator) and `other`."""
    ws, proxy, port = platform_behind_nginx(start_module_service, tmp_path_factory.mktemp("nginx"), env, wildcard)
    setup = SimpleNamespace(ws=ws, proxy=proxy, port=port, owner=ws.first_user())
    requests.post(
        ws.api + "/users",
        json={"email": "other@example.com", "username": "other", "password": "second good passphrase"},
        headers=ws.as_user(setup.owner),
        timeout=10,
    ).raise_for_status()
    setup.other = ws.login("other@example.com", "second good passphrase").json()["session_token"]
    return setup


def _workspaces(setup, local_app, hostile, tmp_path_factory):
    """Owner's `dev.main` (apps echo: owner only; shared and hostile: signed-in users)
    with its agent connected; other's `own.main` (app mine, owner only, no agent)."""
    agent = create_workspace(
        setup.ws,
        setup.owner,
        "dev",
        [
            {
                "name": "main",
                "apps": [
                    {"slug": "echo", "url": local_app.url},
                    {"slug": "shared", "url": local_app.url, "sharing_level": "authenticated"},
                    {"slug": "hostile", "url": hostile.url, "sharing_level": "authenticated"},
                ],
            }
        ],
    )["agents"][0]
    create_workspace(
        setup.ws, setup.other, "own", [{"name": "main", "apps": [{"slug": "mine", "url": "http://127.0.0.1:9"}]}]
    )
    setup.agent = AgentProcess(tmp_path_factory.mktemp("agent"), setup.ws.url, agent["token"])
    wait_status(setup.ws, setup.owner, agent["id"], "connected")


@pytest.fixture(scope="module")
def hostile():
    app = HostileApp()
    yield app
    app.stop()


def _running(start_module_service, local_app, hostile, tmp_path_factory, env, wildcard):
    """A module fixture's platform with its workspaces (below); stopped after the module."""
    setup = _platform(start_module_service, tmp_path_factory, env, wildcard=wildcard)
    try:
        _workspaces(setup, local_app, hostile, tmp_path_factory)
        yield setup
    finally:
        if hasattr(setup, "agent"):
            setup.agent.stop()
        setup.proxy.stop()


@pytest.fixture(scope="module")
def hosted(start_module_service, local_app, hostile, tmp_path_factory):
    """App hosts on, path apps as locked down as by default."""
    yield from _running(start_module_service, local_app, hostile, tmp_path_factory, {}, wildcard=True)


@pytest.fixture(scope="module")
def dangerous(start_module_service, local_app, hostile, tmp_path_factory):
    """No app hosts; path apps shared and opened by administrators, as the flags allow."""
    yield from _running(
        start_module_service,
        local_app,
        hostile,
        tmp_path_factory,
        {
            "WORKSPACE_DANGEROUS_ALLOW_PATH_APP_SHARING": "true",
            "WORKSPACE_DANGEROUS_ALLOW_PATH_APP_SITE_OWNER_ACCESS": "true",
        },
        wildcard=False,
    )


def app_host(setup, slug, workspace="dev", user="owner"):
    return f"{slug}--main--{workspace}--{user}{APPS}:{setup.port}"


def signed_in(setup, token):
    browser = Browser(setup.port)
    browser.jar[PLATFORM] = {"workspace_session_token": token}
    return browser


def _ticket_for(setup, token, slug):
    """The platform's answer to the handshake for app `slug`: (its Location, the ticket)."""
    back = f"http://{app_host(setup, slug)}/hello"
    answer = _direct(
        setup.port,
        PLATFORM,
        "/api/v2/applications/auth-redirect",
        HTML,
        params={"redirect_uri": back},
        cookies={"workspace_session_token": token},
    )
    assert answer.status_code == 303, answer.text
    location = answer.headers["Location"]
    assert location.startswith(back + "?workspace_app_ticket=")
    return location, parse_qs(urlsplit(location).query)["workspace_app_ticket"][0]


# --------------------------------------------------------------------------- the handshake


def test_the_handshake_signs_a_browser_in_on_the_app_host(hosted):
    browser = signed_in(hosted, hosted.other)
    url = f"http://{app_host(hosted, 'shared')}/headers?x=1"
    answer = browser.get(url)
    assert answer.status_code == 200, answer.hops
    assert [status for status, _ in answer.hops] == [303, 303, 303, 200]
    assert urlsplit(answer.hops[1][1]).netloc == f"{PLATFORM}:{hosted.port}"  # the platform issued the ticket
    assert "workspace_app_ticket=" in answer.hops[2][1] and answer.final_url == url  # then the clean URL
    seen = answer.json()
    assert seen["path"] == "/headers?x=1"  # the app's own path: no prefix, no ticket
    headers = {name.lower(): value for name, value in seen["headers"]}
    assert "cookie" not in headers and "x-forwarded-prefix" not in headers
    ((host, line),) = [(h, line) for h, line in browser.set_cookies if line.startswith("workspace_app_token=")]
    name, value, attributes = _set_cookie(line)
    assert host == app_host(hosted, "shared").split(":")[0]
    assert {"httponly", "path"} <= set(attributes) and "domain" not in attributes and "secure" not in attributes
    assert attributes["samesite"] == "Lax" and attributes["path"] == "/"
    assert 0 < int(attributes["max-age"]) <= 8 * 3600
    # The platform's session cookie was never sent to the app host, and is as it was.
    assert browser.jar[PLATFORM] == {"workspace_session_token": hosted.other}
    again = browser.get(f"http://{app_host(hosted, 'shared')}/hello")
    assert again.hops == [(200, again.final_url)] and again.text == "hello from the app\n"


def test_a_browser_not_signed_in_is_sent_to_the_login_page_and_back(hosted):
    browser = Browser(hosted.port)
    answer = browser.get(f"http://{app_host(hosted, 'shared')}/hello")
    assert answer.status_code == 200 and urlsplit(answer.final_url).path == "/login"
    back = parse_qs(urlsplit(answer.final_url).query)["redirect"][0]
    assert back.startswith("/api/v2/applications/auth-redirect?redirect_uri=")
    machine = _direct(hosted.port, app_host(hosted, "shared"), "/hello", JSON)
    assert machine.status_code == 401 and machine.json()["message"] == "You must be signed in to do this."


def test_the_platform_refuses_a_ticket_for_an_app_the_visitor_may_not_open(hosted):
    browser = signed_in(hosted, hosted.other)
    answer = browser.get(f"http://{app_host(hosted, 'echo')}/hello")
    assert answer.status_code == 404 and urlsplit(answer.final_url).hostname == PLATFORM
    assert not any(line.startswith("workspace_app_token=") for _, line in browser.set_cookies)
    for bad in (
        "https://evil.example/",
        f"http://{PLATFORM}:{hosted.port}/",
        f"http://a--b{APPS}:{hosted.port}/",
        f"http://{app_host(hosted, 'echo').split(':')[0]}:1/",
    ):
        refused = _direct(
            hosted.port,
            PLATFORM,
            "/api/v2/applications/auth-redirect",
            JSON,
            params={"redirect_uri": bad},
            cookies={"workspace_session_token": hosted.owner},
        )
        assert refused.status_code in (400, 404) and "Location" not in refused.headers, bad


# --------------------------------------------------------------------------- tickets and app tokens


def test_a_ticket_is_bound_to_its_host_and_spent_at_its_first_use(hosted):
    location, ticket = _ticket_for(hosted, hosted.other, "shared")
    elsewhere = _direct(hosted.port, app_host(hosted, "hostile"), f"/?workspace_app_ticket={ticket}", JSON)
    assert elsewhere.status_code == 401 and "not valid" in elsewhere.json()["detail"]
    path = "/" + location.split("/", 3)[3]
    first = _direct(hosted.port, app_host(hosted, "shared"), path, JSON)
    assert first.status_code == 303 and first.headers["Location"] == f"http://{app_host(hosted, 'shared')}/hello"
    assert first.headers["Set-Cookie"].startswith("workspace_app_token=")
    second = _direct(hosted.port, app_host(hosted, "shared"), path, JSON)
    assert second.status_code == 401 and "used already" in second.json()["detail"]


def test_a_ticket_expires_after_a_minute(hosted):
    _, ticket = _ticket_for(hosted, hosted.other, "shared")
    seal = sealer((hosted.ws.service.data_dir / "app-token-secret").read_text().strip())
    payload = seal.decrypt(ticket.encode())
    old = seal.encrypt_at_time(payload, int(time.time()) - 61).decode()  # as if issued 61 s ago
    refused = _direct(hosted.port, app_host(hosted, "shared"), f"/?workspace_app_ticket={old}", JSON)
    assert refused.status_code == 401 and "not valid" in refused.json()["detail"]
    assert oct((hosted.ws.service.data_dir / "app-token-secret").stat().st_mode & 0o777) == "0o600"


def _app_token(setup, token, slug):
    browser = signed_in(setup, token)
    assert browser.get(f"http://{app_host(setup, slug)}/hello").status_code == 200
    return browser.jar[app_host(setup, slug).split(":")[0]]["workspace_app_token"]


def test_the_app_token_is_good_on_its_own_host_only(hosted):
    token = _app_token(hosted, hosted.other, "shared")
    cookie = {"Cookie": f"workspace_app_token={token}", **JSON}
    assert _direct(hosted.port, app_host(hosted, "shared"), "/hello", cookie).status_code == 200
    other_app = _direct(hosted.port, app_host(hosted, "hostile"), "/seen", cookie)
    assert other_app.status_code == 401 and "not valid" in other_app.json()["detail"]
    for sent in (
        {"Cookie": f"workspace_app_token={token}"},
        {"Cookie": f"workspace_session_token={token}"},
        {TOKEN_HEADER: token},
    ):
        api = _direct(hosted.port, PLATFORM, "/api/v2/users/me", sent)
        assert api.status_code == 401, sent
    # Nor does the platform's own session cookie open an app host.
    platform_cookie = _direct(
        hosted.port, app_host(hosted, "shared"), "/hello", {"Cookie": f"workspace_session_token={hosted.other}", **JSON}
    )
    assert platform_cookie.status_code == 401


def test_an_app_token_planted_by_a_sibling_app_host_neither_hides_nor_replaces_the_host_s_own(hosted):
    """Every app host is under one domain: a page of one can set a cookie for all of them
    (Domain=<apps domain>). The browser then sends both under one name."""
    own = _app_token(hosted, hosted.other, "shared")
    planted = _app_token(hosted, hosted.owner, "echo")  # the attacker's own, for his own app
    for cookies in (
        f"workspace_app_token=junk; workspace_app_token={own}",
        f"workspace_app_token={planted}; workspace_app_token={own}",
    ):
        seen = _direct(hosted.port, app_host(hosted, "shared"), "/headers", {"Cookie": cookies, **JSON})
        assert seen.status_code == 200, cookies
    alone = _direct(
        hosted.port, app_host(hosted, "shared"), "/hello", {"Cookie": f"workspace_app_token={planted}", **JSON}
    )
    assert alone.status_code == 401  # another host's token opens nothing here


def test_signing_out_stops_the_app_token(hosted):
    session = hosted.ws.login("other@example.com", "second good passphrase").json()["session_token"]
    token = _app_token(hosted, session, "shared")
    cookie = {"Cookie": f"workspace_app_token={token}", **JSON}
    assert _direct(hosted.port, app_host(hosted, "shared"), "/hello", cookie).status_code == 200
    assert (
        requests.post(hosted.ws.api + "/users/logout", headers={TOKEN_HEADER: session}, timeout=10).status_code == 200
    )
    refused = _direct(hosted.port, app_host(hosted, "shared"), "/hello", cookie)
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]
    browser = _direct(
        hosted.port, app_host(hosted, "shared"), "/hello", {"Cookie": f"workspace_app_token={token}", **HTML}
    )
    assert browser.status_code == 303 and "/api/v2/applications/auth-redirect?" in browser.headers["Location"]


def test_a_cookie_authenticated_post_from_another_app_host_is_refused(hosted):
    token = _app_token(hosted, hosted.other, "shared")
    cookie = {"Cookie": f"workspace_app_token={token}", **JSON}
    sibling = {"Origin": f"http://{app_host(hosted, 'hostile')}", "Sec-Fetch-Site": "same-site"}
    refused = _direct(
        hosted.port, app_host(hosted, "shared"), "/headers", {**cookie, **sibling}, method="POST", data=b"x"
    )
    assert refused.status_code == 403
    own = {"Origin": f"http://{app_host(hosted, 'shared')}", "Sec-Fetch-Site": "same-origin"}
    assert (
        _direct(
            hosted.port, app_host(hosted, "shared"), "/headers", {**cookie, **own}, method="POST", data=b"x"
        ).status_code
        == 200
    )


# --------------------------------------------------------------------------- who opens what, where


def test_sharing_on_app_hosts_with_the_session_header(hosted):
    def status(token, slug, workspace="dev", user="owner"):
        return _direct(
            hosted.port, app_host(hosted, slug, workspace, user), "/hello", {TOKEN_HEADER: token}
        ).status_code

    assert status(hosted.other, "shared") == 200
    assert status(hosted.other, "echo") == 404
    assert status(hosted.owner, "echo") == 200
    assert status(hosted.owner, "mine", "own", "other") == 502  # an administrator may: its agent is away
    assert status(hosted.other, "mine", "own", "other") == 502


def test_the_api_and_the_dashboard_name_each_app_s_own_host(hosted):
    workspaces = requests.get(
        hosted.ws.api + "/users/me/workspaces", headers=hosted.ws.as_user(hosted.owner), timeout=10
    )
    apps = {
        app["slug"]: app for workspace in workspaces.json() for agent in workspace["agents"] for app in agent["apps"]
    }
    assert apps["shared"]["host_url"] == f"http://{app_host(hosted, 'shared')}/"
    page = requests.get(hosted.ws.url + "/", cookies={"workspace_session_token": hosted.owner}, timeout=10)
    assert f'href="http://{app_host(hosted, "shared")}/"' in page.text


def test_unknown_apps_and_hosts_are_one_404(hosted):
    for host in (
        app_host(hosted, "nope"),
        app_host(hosted, "echo", "nope"),
        app_host(hosted, "echo", user="nobody"),
        app_host(hosted, "echo"),
        f"a--b{APPS}",
        f"x--main--dev--owner--more{APPS}",
        f"a.b{APPS}",  # several labels: nginx's wildcard serves them too (tests/proxy/test_apps_host_proxy.py)
    ):
        answer = _direct(hosted.port, host, "/hello", {TOKEN_HEADER: hosted.other, **JSON})
        assert answer.status_code == 404 and answer.json() == NOT_FOUND, host


def test_the_platform_s_routes_are_the_app_s_paths_on_an_app_host(hosted):
    answer = _direct(hosted.port, app_host(hosted, "shared"), "/api/v2/users/me", {TOKEN_HEADER: hosted.other})
    assert answer.status_code == 404 and answer.json() == {"error": "no route /api/v2/users/me"}  # the app's


def test_path_apps_are_locked_down_by_default(hosted):
    def path(token, path, headers=None):
        return _direct(hosted.port, PLATFORM, path, {TOKEN_HEADER: token, **(headers or JSON)})

    assert path(hosted.other, "/@owner/dev.main/apps/shared/hello").json() == NOT_FOUND
    assert path(hosted.owner, "/@other/own.main/apps/mine/").json() == NOT_FOUND  # an administrator may not
    assert path(hosted.other, "/@other/own.main/apps/mine/").status_code == 502  # its owner may
    mine = path(hosted.owner, "/@owner/dev.main/apps/echo/hello")
    assert mine.status_code == 200 and "Content-Security-Policy" not in mine.headers
    # A browser refused a path that the app's host serves is sent there.
    browser = path(hosted.other, "/@owner/dev.main/apps/shared/hello?x=1", HTML)
    assert browser.status_code == 307
    assert browser.headers["Location"] == f"http://{app_host(hosted, 'shared')}/hello?x=1"


def test_the_dangerous_flags_open_path_apps_inside_a_sandbox(dangerous):
    def path(token, path):
        return _direct(dangerous.port, PLATFORM, path, {TOKEN_HEADER: token, **JSON})

    shared = path(dangerous.other, "/@owner/dev.main/apps/shared/hello")
    assert shared.status_code == 200 and shared.headers["Content-Security-Policy"] == SANDBOX
    assert path(dangerous.owner, "/@other/own.main/apps/mine/").status_code == 502  # allowed: the agent is away
    assert path(dangerous.other, "/@owner/dev.main/apps/echo/hello").json() == NOT_FOUND  # owner only stays so
    assert "Content-Security-Policy" not in path(dangerous.owner, "/@owner/dev.main/apps/echo/hello").headers


# --------------------------------------------------------------------------- what an app's answer may not do


def _both_kinds(setup):
    """(host, path prefix) of the hostile app on its host and on its path (the owner's)."""
    return [(app_host(setup, "hostile"), ""), (PLATFORM, "/@owner/dev.main/apps/hostile")]


def _raw_upgrade(setup, host, path):
    """An upgrade request through nginx on a connection of its own: the answer's head."""
    with socket.create_connection(("127.0.0.1", setup.port), timeout=10) as client:
        client.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                f"{TOKEN_HEADER}: {setup.owner}\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            data = client.recv(65536)
            assert data, head
            head += data
    return head.split(b"\r\n\r\n")[0].decode("latin-1")


def test_an_app_cannot_set_the_platform_s_cookies(hosted):
    for host, prefix in _both_kinds(hosted):
        answer = _direct(hosted.port, host, prefix + "/cookies", {TOKEN_HEADER: hosted.owner})
        assert answer.status_code == 200, host
        assert answer.raw.headers.getlist("Set-Cookie") == ["app_cookie=kept; Path=/"], host


def test_an_app_cannot_make_nginx_answer_a_platform_route(hosted):
    for host, prefix in _both_kinds(hosted):
        answer = _direct(
            hosted.port,
            host,
            prefix + "/accel",
            {TOKEN_HEADER: hosted.owner, "Cookie": f"workspace_session_token={hosted.owner}"},
        )
        assert answer.status_code == 200 and answer.text == "the app's own body\n", host
        assert not [name for name in answer.headers if name.lower().startswith("x-accel")], host


def test_an_app_s_upgrade_answer_cannot_set_the_platform_s_cookie(hosted):
    for host, prefix in _both_kinds(hosted):
        head = _raw_upgrade(hosted, host, prefix + "/ws")
        assert head.startswith("HTTP/1.1 101 "), head
        assert ATTACKER_TOKEN not in head and "x-accel" not in head.lower(), head


def test_an_upgrade_the_app_does_not_switch_is_never_spliced(hosted, hostile):
    """An app that answers an upgrade with a 204 and keeps its stream would, once
    spliced, get whatever nginx sends next on that kept connection: another user's
    request with her credentials. The platform answers such an upgrade itself."""
    for host, prefix in _both_kinds(hosted):
        for route in ("/ws-204", "/ws-bare-lf"):
            head = _raw_upgrade(hosted, host, prefix + route)
            assert head.startswith("HTTP/1.1 502 "), head
            assert ATTACKER_TOKEN not in head, head
        for _ in range(8):  # the next requests on nginx's kept connections reach the platform
            me = _direct(hosted.port, PLATFORM, "/api/v2/users/me", {TOKEN_HEADER: hosted.other, **JSON})
            assert me.status_code == 200 and me.json()["username"] == "other"
    assert not any(hosted.other.encode() in data for data in hostile.captured), hostile.captured


def test_the_app_never_sees_the_app_token_or_the_ticket(hosted):
    browser = signed_in(hosted, hosted.other)
    seen = browser.get(f"http://{app_host(hosted, 'hostile')}/seen?q=1").json()
    assert seen["path"] == "/seen?q=1"
    assert "workspace_app_token" not in json.dumps(seen) and hosted.other not in json.dumps(seen)


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("wildcard", "problem"),
    [
        ("apps.example.org", "must be a host pattern"),
        ("https://*.apps.example.org", "must be a host pattern"),
        ("*.apps.example.org/x", "must be a host pattern"),
        ("*.apps.example.org:0", "must be a host pattern"),
        ("*.apps.example.org:70000", "must be a host pattern"),
        ("*.*.example.org", "must be a host pattern"),
        ("*.example.org", "is one of WORKSPACE_WILDCARD_ACCESS_URL's app hosts"),
    ],
)
def test_a_bad_wildcard_stops_the_start(monkeypatch, tmp_path, wildcard, problem):
    from app.common.config import ConfigError
    from app.workspace.settings import WorkspaceSettings

    monkeypatch.setenv("WORKSPACE_ACCESS_URL", "https://code.example.org")
    monkeypatch.setenv("WORKSPACE_WILDCARD_ACCESS_URL", wildcard)
    with pytest.raises(ConfigError, match=problem):
        WorkspaceSettings.from_env(str(tmp_path))


def test_a_wildcard_with_a_port_gives_app_urls_with_it(monkeypatch, tmp_path):
    from app.workspace.access.app_hosts import app_url
    from app.workspace.settings import WorkspaceSettings

    monkeypatch.setenv("WORKSPACE_ACCESS_URL", "https://code.example.org")
    monkeypatch.setenv("WORKSPACE_WILDCARD_ACCESS_URL", "*.Apps.Example.org:8443")
    settings = WorkspaceSettings.from_env(str(tmp_path))
    assert app_url(settings, "code", "main", "dev", "Alice") == "https://code--main--dev--alice.apps.example.org:8443/"
    assert app_url(settings, "my--app", "main", "dev", "alice") is None  # its label would be ambiguous


def test_every_name_under_the_apps_domain_but_the_platform_s_is_an_app_host(monkeypatch, tmp_path):
    from app.workspace.access.app_hosts import app_host_of
    from app.workspace.settings import WorkspaceSettings

    monkeypatch.setenv("WORKSPACE_ACCESS_URL", "https://ws.corp.example.org")
    monkeypatch.setenv("WORKSPACE_WILDCARD_ACCESS_URL", "*.example.org")
    settings = WorkspaceSettings.from_env(str(tmp_path))

    def of(host):
        return app_host_of({"HTTP_HOST": host}, settings)

    assert of("ws.corp.example.org") == (False, None) and of("WS.Corp.Example.org.:443") == (False, None)
    assert of("example.org") == (False, None) and of("other.org") == (False, None)
    on_app_host, app_host = of("code--main--dev--alice.example.org:443")
    assert on_app_host and app_host.path_prefix == "/@alice/dev.main/apps/code"
    for host in ("a.b.example.org", "x.code--main--dev--alice.example.org", "corp.example.org", "nope.example.org"):
        assert of(host) == (True, None), host

"""The workspace apps' wildcard host through a real nginx in front of the real platform:
nginx's `*.apps.localhost` matches names of several labels too (`a.b.apps.localhost`),
and the platform answers every one of them as the host of an unknown app, a 404 on
every path: never its own routes (the API, the sign-in page, `/metrics`)."""

import http.client
import json

import pytest

from tests.support.workspace import APPS_SUFFIX, PLATFORM_HOST, TOKEN_HEADER, platform_behind_nginx

PLATFORM, APPS = PLATFORM_HOST, APPS_SUFFIX
NOT_FOUND = {"message": "Workspace app not found."}
# Names under the apps' wildcard that name no app: several labels, an app's label below
# another, a one-label name that is not an app's.
NO_APP_HOSTS = (f"a.b{APPS}", f"x.code--main--dev--owner{APPS}", f"a.b.c.d{APPS}", f"metrics{APPS}")
# The platform's own routes, which such a host must never reach.
PLATFORM_PATHS = (
    "/metrics",
    "/api/v2/buildinfo",
    "/api/v2/users/me",
    "/api/v2/users/first",
    "/api/v2/workspaceagents/me/rpc",
    "/healthz",
    "/readyz",
    "/login",
    "/",
)


@pytest.fixture(scope="module")
def behind_nginx(start_module_service, tmp_path_factory):
    """(platform, nginx, an owner's session token): app hosts on *.apps.localhost."""
    ws, proxy, _port = platform_behind_nginx(start_module_service, tmp_path_factory.mktemp("nginx"))
    yield ws, proxy, ws.first_user()
    proxy.stop()


def get(port, host, target, headers=None):
    """(status, body) of GET `target` on 127.0.0.1:`port`, sent as written, Host `host`."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
        connection.putheader("Host", host)
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


def test_the_platform_answers_on_its_own_host_and_its_metrics_on_its_loopback_port(behind_nginx):
    ws, proxy, owner = behind_nginx
    status, body = get(proxy.port, PLATFORM, "/api/v2/users/me", {TOKEN_HEADER: owner})
    assert status == 200 and '"username"' in body
    assert get(proxy.port, PLATFORM, "/metrics")[0] == 404  # nginx's snippets/no_metrics.conf
    status, body = get(ws.service.port, "127.0.0.1", "/metrics")
    assert status == 200 and "bundle_build_info" in body


@pytest.mark.parametrize("host", NO_APP_HOSTS)
def test_a_name_under_the_apps_wildcard_never_reaches_the_platform_s_routes(behind_nginx, host):
    ws, proxy, owner = behind_nginx
    for path in PLATFORM_PATHS:
        for headers in ({"Accept": "application/json"}, {"Accept": "text/html", TOKEN_HEADER: owner}):
            status, body = get(proxy.port, f"{host}:{proxy.port}", path, headers)
            assert status == 404, (host, path, status, body[:200])
            assert "bundle_" not in body and '"username"' not in body and '"version"' not in body, (host, path)
            if headers["Accept"] == "application/json":
                assert json.loads(body) == NOT_FOUND, (host, path, body[:200])


def test_the_platform_itself_refuses_such_a_name_without_nginx(behind_nginx):
    """The same on the service's loopback port: the platform tells the host, not nginx."""
    ws, _proxy, owner = behind_nginx
    for host in NO_APP_HOSTS:
        for path in ("/metrics", "/api/v2/users/me", "/api/v2/buildinfo"):
            status, body = get(ws.service.port, host, path, {"Accept": "application/json", TOKEN_HEADER: owner})
            assert status == 404 and "bundle_" not in body, (host, path, status, body[:200])

"""`/metrics` is never served through a public host: every site of nginx/ answers 404
to every spelling that would reach the route (snippets/no_metrics.conf), and passes
the rest on. A real nginx in front of a stand-in backend that records what reaches it,
then in front of a real deck service, whose loopback port still serves its metrics."""

import http.client

import pytest
import requests

from devtools import nginx as nginx_tool
from tests.support.proxy import EchoServer

SERVICES = ("workspace", "decks", "notebook", "audio", "wizard")
# What a client may send to reach `/metrics`: nginx normalises each to the route's URI
# (or the service would: werkzeug decodes `%6d` in the raw target it is given).
SPELLINGS = (
    "/metrics",
    "/metrics/",
    "//metrics",
    "///metrics/",
    "/%6detrics",
    "/%6Detrics",
    "/%2Fmetrics",
    "/metrics?x=1",
    "/metrics?",
    "/metrics;x",
    "/metrics%3Bx",
    "/METRICS",
    "/Metrics",
    "/./metrics",
    "/static/../metrics",
    "/metrics%2F",
    "/metrics/.",
    "/metrics%20",
    "/metrics.txt",
)
# Near misses that are not the route: they pass on as any other path.
PASSED_ON = ("/healthz", "/metricsx", "/api/metrics", "/metrics-history")


def get(proxy, host, target):
    """(status, body) of GET `target`, sent exactly as written (no client-side
    normalisation), with `host` as the Host header."""
    connection = http.client.HTTPConnection(proxy.address, proxy.port, timeout=10)
    try:
        connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
        connection.putheader("Host", host)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


@pytest.fixture
def echo_sites(tmp_path):
    """Every service's site in one nginx, each in front of the same recording backend;
    the workspace's apps wildcard host too."""
    backend = EchoServer("any")
    upstreams = {service: f"127.0.0.1:{backend.port}" for service in SERVICES}
    variables = {
        "workspace_apps_host": "*.apps.localhost",
        "wizard_uploads_dir": str(tmp_path / "uploads"),
        "wizard_lists_dir": str(tmp_path / "lists"),
    }
    proxy = nginx_tool.start(tmp_path / "nginx", upstreams=upstreams, variables=variables)
    yield proxy, backend
    proxy.stop()
    backend.stop()


@pytest.mark.parametrize("service", SERVICES)
def test_every_public_site_answers_404_to_every_spelling_of_metrics(echo_sites, service):
    proxy, backend = echo_sites
    for target in SPELLINGS + (f"http://{proxy.host(service)}/metrics",):
        status, _ = get(proxy, proxy.host(service), target)
        assert status == 404, (service, target)
    assert backend.seen == [], f"reached the backend through {service}'s site: {backend.seen}"
    for target in PASSED_ON:
        status, _ = get(proxy, proxy.host(service), target)
        assert status == 200, (service, target)
    assert [seen["path"] for seen in backend.seen] == list(PASSED_ON)


def test_a_workspace_apps_host_passes_metrics_on_to_the_app(echo_sites):
    """On an app's host every path is the app's: the platform routes it to the app, never
    to its own `/metrics`, so an app may have a `/metrics` of its own."""
    proxy, backend = echo_sites
    status, _ = get(proxy, "someapp--ws--alice.apps.localhost", "/metrics")
    assert status == 200
    assert [seen["path"] for seen in backend.seen] == ["/metrics"]


def test_a_real_service_serves_its_metrics_on_its_loopback_port_only(start_service, nginx_for):
    service = start_service("decks")
    direct = requests.get(f"{service.base_url}/metrics", timeout=10)
    assert direct.status_code == 200 and "bundle_build_info" in direct.text
    # The service itself answers some spellings (werkzeug decodes the raw target): nginx must stop them.
    assert requests.get(f"{service.base_url}/%6detrics", timeout=10).status_code == 200
    proxy = nginx_for(service)
    for target in SPELLINGS:
        status, body = get(proxy, proxy.host("decks"), target)
        assert status == 404 and "bundle_" not in body, target
    assert get(proxy, proxy.host("decks"), "/healthz")[0] == 200

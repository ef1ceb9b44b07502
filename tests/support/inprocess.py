"""The in-process tier: a service's Flask app called through werkzeug's test client
inside the test's own process, for route logic (validation, permissions, error
bodies, what a write changes) that does not depend on the server.

What depends on the server (gunicorn's gevent worker, streams, websockets, several
workers, signals, nginx) keeps running on a real gunicorn: `start_service`.

The test clients (tests.support.*) speak `requests`. While an app is in process,
requests sends what is addressed to its `http://<service>-<n>.in-process` base URL
to the app, and everything else to the network; so one client class and one test
serve both tiers, and a module moves from gunicorn to the in-process tier with its
`pytestmark = pytest.mark.in_process` alone.
"""
import http.client
import itertools
import os
import types
from contextlib import ExitStack, contextmanager
from urllib.parse import urlsplit

import requests
from requests.cookies import extract_cookies_to_jar
from requests.structures import CaseInsensitiveDict
from requests.utils import get_encoding_from_headers
from werkzeug.test import Client

from app import create_app

_APPS = {}  # base URL -> Flask app
_serial = itertools.count(1)  # each app its own address, as each server its own port
# The caller is this process, as a request to a loopback-bound gunicorn comes from it.
LOOPBACK_PEER = {"REMOTE_ADDR": "127.0.0.1", "REMOTE_PORT": "40000"}


class InProcessService:
    """A service's app in this process: what tests use of a RunningService (name,
    base_url, data_dir, env)."""

    def __init__(self, name, app, data_dir, env):
        self.name, self.app, self.data_dir, self.env = name, app, data_dir, env
        self.base_url = f"http://{name}-{next(_serial)}.in-process"


@contextmanager
def in_process(name, data_dir, env=None):
    """The app of `name` on `data_dir`, built with the environment `env` adds. The
    environment is the process's only while the app is built (as a service reads it
    at its start): a gunicorn service a test starts meanwhile inherits none of it."""
    env = {"SERVICE": name, "DATA_DIR": str(data_dir), **(env or {})}
    with _environment(env):
        service = InProcessService(name, create_app(name, {"TESTING": True}), data_dir, env)
    _APPS[service.base_url] = service.app
    try:
        yield service
    finally:
        del _APPS[service.base_url]


@contextmanager
def _environment(env):
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class InProcessStarter:
    """start(name, data_dir=None, env=None) -> InProcessService, as ServiceStarter
    starts one on gunicorn (tests.support.shared); `stop_all` drops them all."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self.running = {}  # service name -> ExitStack of its app

    def __call__(self, name, data_dir=None, workers=1, env=None):
        assert workers == 1, "the in-process tier has one process: run this module on gunicorn"
        # A service's modules bind its models to one database per process: an app of
        # the same service started later (another backend) replaces the earlier one.
        self.stop(name)
        data_dir = data_dir or self.tmp_path_factory.mktemp(f"{name}-data")
        stack = self.running[name] = ExitStack()
        return stack.enter_context(in_process(name, data_dir, env))

    def stop(self, name):
        stack = self.running.pop(name, None)
        if stack is not None:
            stack.close()

    def stop_all(self):
        for name in list(self.running):
            self.stop(name)


def _get_adapter(session, url):
    """requests' choice of transport, which reaches an in-process app when `url` is
    on its address: the clients (tests.support.*) and plain requests.get alike."""
    base, _, _ = url.partition(".in-process")
    app = _APPS.get(base + ".in-process") if _ else None
    return WsgiAdapter(app) if app is not None else _network_adapter(session, url)


_network_adapter = requests.Session.get_adapter
requests.Session.get_adapter = _get_adapter  # only the tests import this module


class WsgiAdapter(requests.adapters.BaseAdapter):
    """requests' transport to a WSGI app through werkzeug's test client. The whole
    answer is read before it is returned (no endless streams on this tier); cookies
    are the Session's, as over the network."""

    def __init__(self, app):
        super().__init__()
        self.client = Client(app, use_cookies=False)

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        url = urlsplit(request.url)
        body = request.body
        answer = self.client.open(
            path=url.path or "/", query_string=url.query, method=request.method,
            base_url=f"{url.scheme}://{url.netloc}", headers=list(request.headers.items()),
            data=body.encode() if isinstance(body, str) else (body or b""),
            environ_base=LOOPBACK_PEER)
        try:
            return self._response(request, answer)
        finally:
            answer.close()

    def _response(self, request, answer):
        response = requests.Response()
        response.status_code = answer.status_code
        response.reason = answer.status.partition(" ")[2]
        response.headers = CaseInsensitiveDict(answer.headers.items())
        response.encoding = get_encoding_from_headers(response.headers)
        response.url, response.request, response.connection = request.url, request, self
        response._content = answer.get_data()
        response._content_consumed = True
        # The Session takes cookies from raw._original_response.msg, as urllib3 gives it.
        message = http.client.HTTPMessage()
        for name, value in answer.headers.items():
            message[name] = value
        response.raw = types.SimpleNamespace(_original_response=types.SimpleNamespace(msg=message))
        extract_cookies_to_jar(response.cookies, request, response.raw)
        return response

    def close(self):
        pass

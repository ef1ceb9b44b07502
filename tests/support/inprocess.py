"""The in-process tier: a service's Flask app called through werkzeug's test client
inside the test's own process, for route logic (validation, permissions, error
bodies, what a write changes) that does not depend on the server.

What depends on the server (gunicorn's gevent worker, streams, websockets, several
workers, signals, nginx) keeps running on a real gunicorn: `start_service`.

The test clients (tests.support.*) speak `requests`. While an app is in process,
requests sends what is addressed to its `http://<service>-<n>.in-process` base URL
to the app, and everything else to the network; so one client class and one test
serve both tiers. Every module of tests/unit/ is in process (tests/conftest.py marks
it `in_process`), so a module moves from gunicorn to the in-process tier by moving
from tests/<area>/ to tests/unit/<area>/ alone.
"""

import http.client
import io
import itertools
import os
from contextlib import ExitStack, contextmanager
from urllib.parse import urlsplit

import requests
import urllib3
from requests.cookies import extract_cookies_to_jar
from requests.structures import CaseInsensitiveDict
from requests.utils import get_encoding_from_headers
from werkzeug.test import Client

from app import create_app

_APPS = {}  # host of an in-process base URL -> InProcessService
_serial = itertools.count(1)  # each app its own address, as each server its own port


class InProcessService:
    """A service's app in this process: what tests use of a RunningService (name,
    base_url, data_dir, env). Its callers come from a loopback address of its own,
    as from this process to a loopback-bound gunicorn, so that what a process keeps
    per client address (the login limiter) is not shared by two apps."""

    def __init__(self, name, app, data_dir, env):
        self.name, self.app, self.data_dir, self.env = name, app, data_dir, env
        n = next(_serial)
        self.host = f"{name}-{n}.in-process"
        self.base_url = f"http://{self.host}"
        self.peer = {"REMOTE_ADDR": f"127.0.{n // 250 % 250}.{n % 250 + 1}", "REMOTE_PORT": "40000"}


@contextmanager
def in_process(name, data_dir, env=None):
    """The app of `name` on `data_dir`, built with the environment `env` adds. The
    environment is the process's only while the app is built (as a service reads it
    at its start): a gunicorn service a test starts meanwhile inherits none of it. What
    a service reads per request (REDIS_URL, for its broker and limits) is therefore not
    the app's: a module that needs Redis runs on gunicorn."""
    env = {"SERVICE": name, "DATA_DIR": str(data_dir), **(env or {})}
    with _environment(env):
        service = InProcessService(name, create_app(name, {"TESTING": True}), data_dir, env)
    _APPS[service.host] = service
    try:
        yield service
    finally:
        del _APPS[service.host]


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
    parts = urlsplit(url)
    service = _APPS.get(parts.netloc) if parts.scheme == "http" else None
    return WsgiAdapter(service) if service is not None else _network_adapter(session, url)


_network_adapter = requests.Session.get_adapter
requests.Session.get_adapter = _get_adapter  # only the tests import this module


class WsgiAdapter(requests.adapters.BaseAdapter):
    """requests' transport to a WSGI app through werkzeug's test client. The whole
    answer is read before it is returned (no endless streams on this tier); cookies
    are the Session's, as over the network."""

    def __init__(self, service):
        super().__init__()
        self.service = service
        self.client = Client(service.app, use_cookies=False)

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        url = urlsplit(request.url)
        # A body requests would send chunked arrives whole here, with its length.
        headers = [(k, v) for k, v in request.headers.items() if k.lower() != "transfer-encoding"]
        answer = self.client.open(
            path=url.path or "/",
            query_string=url.query,
            method=request.method,
            base_url=f"{url.scheme}://{url.netloc}",
            headers=headers,
            data=_body_bytes(request.body),
            environ_base=self.service.peer,
        )
        try:
            return self._response(request, answer)
        finally:
            answer.close()

    def _response(self, request, answer):
        content = answer.get_data()
        # Several fields of one name are one, their values joined, as urllib3 gives them.
        joined = {}
        for name, value in answer.headers.items():
            joined[name] = f"{joined[name]}, {value}" if name in joined else value
        message = http.client.HTTPMessage()  # every field apart: the cookie jar reads it
        for name, value in answer.headers.items():
            message[name] = value
        raw = urllib3.HTTPResponse(
            body=io.BytesIO(content), headers=joined, status=answer.status_code, preload_content=False
        )
        raw._original_response = _Answered(message)  # where the Session takes cookies
        response = requests.Response()
        response.status_code, response.reason = answer.status_code, answer.status.partition(" ")[2]
        response.headers = CaseInsensitiveDict(joined)
        response.encoding = get_encoding_from_headers(response.headers)
        response.url, response.request, response.connection, response.raw = request.url, request, self, raw
        response._content, response._content_consumed = content, True
        extract_cookies_to_jar(response.cookies, request, raw)
        return response

    def close(self):
        pass


class _Answered:
    """What urllib3 keeps of http.client's response, as far as requests reads it: the
    header fields one by one (the cookie jar's source), and that it is over."""

    def __init__(self, msg):
        self.msg = msg

    def isclosed(self):
        return True

    def close(self):
        pass


def _body_bytes(body):
    """A prepared request's body as bytes: requests leaves a str, bytes, None, or the
    iterable it would send chunked."""
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    return b"".join(chunk.encode() if isinstance(chunk, str) else chunk for chunk in body)

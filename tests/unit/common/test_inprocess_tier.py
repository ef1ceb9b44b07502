"""The in-process tier's transport (tests/support/inprocess.py) answers as the network
would: headers of one name joined, cookies kept by the Session, bodies of every
kind, a readable raw body, and only exact in-process addresses routed to an app."""

import types

import requests
from flask import Flask, Response, request

from tests.support import inprocess


def _service():
    app = Flask(__name__)

    @app.post("/echo")
    def echo():
        response = Response(request.get_data(), mimetype="application/octet-stream")
        response.set_cookie("a", "1")
        response.set_cookie("b", "2")
        response.headers.add("Vary", "Origin")
        response.headers.add("Vary", "Cookie")
        return response

    @app.get("/cookies")
    def cookies():
        return dict(request.cookies)

    @app.get("/peer")
    def peer():
        return {"remote": request.remote_addr}

    host = "probe-0.in-process"
    return types.SimpleNamespace(
        app=app, host=host, base_url=f"http://{host}", peer={"REMOTE_ADDR": "127.0.9.9", "REMOTE_PORT": "40000"}
    )


def test_answers_as_over_the_network(monkeypatch):
    service = _service()
    monkeypatch.setitem(inprocess._APPS, service.host, service)
    http = requests.Session()
    answer = http.post(service.base_url + "/echo", data=(part for part in (b"chunk one, ", b"chunk two")))
    assert answer.content == b"chunk one, chunk two"
    assert answer.headers["Vary"] == "Origin, Cookie"
    assert answer.headers["Set-Cookie"].count("Path=/") == 2
    assert http.get(service.base_url + "/cookies").json() == {"a": "1", "b": "2"}
    assert http.get(service.base_url + "/peer").json() == {"remote": "127.0.9.9"}
    streamed = http.post(service.base_url + "/echo", data=b"raw", stream=True)
    assert streamed.raw.read() == b"raw"


def test_only_an_exact_in_process_host_reaches_an_app(monkeypatch):
    service = _service()
    monkeypatch.setitem(inprocess._APPS, service.host, service)
    session = requests.Session()
    assert isinstance(session.get_adapter(service.base_url + "/peer"), inprocess.WsgiAdapter)
    for elsewhere in (
        "http://probe-0.in-process.example/peer",
        "https://probe-0.in-process/peer",
        "http://probe-1.in-process/peer",
    ):
        assert not isinstance(session.get_adapter(elsewhere), inprocess.WsgiAdapter), elsewhere

"""The worker class of every service (gunicorn_worker.py): a connection's first
request is not held to the keep-alive idle time, the idle wait after one is.

This was the cause of the deck test's rare "Remote end closed connection without
response": of 200 client threads on two busy cores, one connected and sent its
POST more than 2 s later, and gunicorn's gevent worker had closed it unanswered.
"""

import socket
import time

import pytest

KEEPALIVE = 2.0  # gunicorn.conf.py


def _request(sock):
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: decks.test\r\n\r\n")


def _first_bytes(sock, size=64):
    sock.settimeout(10)
    try:
        return sock.recv(size)
    except ConnectionResetError:
        return b""


@pytest.fixture(scope="module")
def decks(start_module_service, tmp_path_factory):
    return start_module_service("decks", data_dir=tmp_path_factory.mktemp("worker"), workers=2)


def test_a_request_sent_later_than_the_keepalive_after_connecting_is_answered(decks):
    with socket.create_connection(("127.0.0.1", decks.port)) as sock:
        connected = time.monotonic()
        while time.monotonic() - connected < KEEPALIVE + 1:
            time.sleep(0.1)  # a client slower than the keep-alive time: the condition is time itself
        _request(sock)
        assert _first_bytes(sock).startswith(b"HTTP/1.1 200 ")


def test_an_idle_kept_alive_connection_is_closed_after_the_keepalive(decks):
    with socket.create_connection(("127.0.0.1", decks.port)) as sock:
        _request(sock)
        assert _first_bytes(sock).startswith(b"HTTP/1.1 200 ")
        answered = time.monotonic()
        sock.settimeout(KEEPALIVE + 10)
        while True:  # the rest of the first answer, then the server's close
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
        assert time.monotonic() - answered >= KEEPALIVE - 0.5  # closed by the idle timer, not at once


# --------------------------------------------------------------------------- one send for a small answer


class _RecordingSocket:
    """What gunicorn's response writes, one entry per send."""

    def __init__(self):
        self.sends = []

    def sendall(self, data):
        self.sends.append(bytes(data))


class _Request:
    """The parts of gunicorn's request that its response reads."""

    def __init__(self, method="GET"):
        self.method, self.version = method, (1, 1)

    def should_close(self):
        return False


def _response(method="GET"):
    from gunicorn.config import Config

    from gunicorn_worker import OneSendResponse

    sock = _RecordingSocket()
    return OneSendResponse(_Request(method), sock, Config()), sock


def test_a_small_answer_goes_out_in_one_send_with_its_head():
    response, sock = _response()
    response.start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "11")])
    response.write(b'{"ok":true}')
    response.close()
    assert len(sock.sends) == 1
    head, _, body = sock.sends[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Length: 11" in head
    assert body == b'{"ok":true}'


def test_a_large_body_is_sent_after_its_head_as_it_is():
    from gunicorn_worker import ONE_SEND_BYTES

    body = b"x" * (ONE_SEND_BYTES + 1)
    response, sock = _response()
    response.start_response("200 OK", [("Content-Length", str(len(body)))])
    response.write(body)
    response.close()
    assert [len(data) for data in sock.sends[1:]] == [len(body)]
    assert sock.sends[0].startswith(b"HTTP/1.1 200 OK\r\n") and sock.sends[0].endswith(b"\r\n\r\n")


def test_later_writes_and_chunked_framing_are_gunicorns():
    response, sock = _response()
    response.start_response("200 OK", [("Content-Type", "text/event-stream")])  # no length: chunked
    response.write(b"data: 1\n\n")
    response.write(b"data: 2\n\n")
    response.close()
    assert len(sock.sends) == 3
    assert b"Transfer-Encoding: chunked" in sock.sends[0]
    assert sock.sends[0].endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n")
    assert sock.sends[1:] == [b"9\r\ndata: 2\n\n\r\n", b"0\r\n\r\n"]


def test_a_head_request_gets_the_head_alone_once():
    response, sock = _response("HEAD")
    response.start_response("200 OK", [("Content-Length", "11")])
    response.write(b'{"ok":true}')
    response.close()
    assert len(sock.sends) == 1 and sock.sends[0].endswith(b"\r\n\r\n")


def test_the_service_answers_head_and_body_together(decks):
    """Through real gunicorn: the first read of a small answer holds all of it (two
    sends would put the head alone in the first read whenever the reader is quick).
    A connection per request: a first request is not held to the keep-alive time."""
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", decks.port)) as sock:
            _request(sock)
            first = _first_bytes(sock, 65536)
            head, _, body = first.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 "), first
            length = int(
                next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
            )
            assert len(body) == length, first


# --------------------------------------------------------------------------- a connection accepted as the worker stops


def test_the_listeners_name_is_known_after_the_stopping_worker_closed_it():
    """gunicorn asks the listener its name as each connection's greenlet begins; a
    stopping worker has closed it by then for a connection accepted just before."""
    from gunicorn_worker import _NamedListener

    listener = socket.create_server(("127.0.0.1", 0))
    name = listener.getsockname()
    named = _NamedListener(listener)
    listener.close()
    with pytest.raises(OSError):
        listener.getsockname()
    assert named.getsockname() == name
    assert named.fileno() == -1  # everything else is the listener's own

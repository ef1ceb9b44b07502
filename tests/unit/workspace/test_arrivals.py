"""A worker's gate on agents' arrivals: a reconnect storm waits its turn, then is refused."""

import gevent
import pytest

from app.common.failures import Unavailable
from app.workspace.tunnel.agents import STORM_ADMISSIONS, _Arrivals


def test_past_its_handshakes_at_once_an_arrival_is_refused_with_a_retry_after_until_one_is_done():
    arrivals = _Arrivals(2, wait=0)
    first, second = arrivals.admit(), arrivals.admit()
    with pytest.raises(Unavailable) as refused:
        arrivals.admit()
    assert refused.value.extra["retry_after"] == 10
    first()
    first()  # released twice (the view's finally and the connection's): counted once
    third = arrivals.admit()
    with pytest.raises(Unavailable):
        arrivals.admit()
    second()
    third()
    arrivals.admit()
    arrivals.admit()


def test_an_arrival_waits_its_turn_and_is_admitted_when_one_is_done():
    arrivals = _Arrivals(1, wait=10)
    first = arrivals.admit()
    waiting = gevent.spawn(arrivals.admit)
    gevent.sleep(0)  # it waits: no slot
    assert not waiting.ready()
    first()
    assert callable(waiting.get(timeout=10))


def test_an_arrival_whose_agent_left_the_line_is_dropped_when_its_turn_comes_and_frees_its_slot():
    arrivals = _Arrivals(1, wait=0)
    with pytest.raises(Unavailable) as dropped:
        arrivals.admit(still_there=lambda: False)
    assert "left" in dropped.value.message
    arrivals.admit(still_there=lambda: True)  # the slot was given back


def test_a_worker_is_settling_a_storm_while_agents_wait_in_line_or_many_were_just_admitted():
    arrivals = _Arrivals(1, wait=0)
    assert not arrivals.settling()  # a lone agent's reconnect is no storm
    release = arrivals.admit()
    assert arrivals.settling()  # every slot taken: arrivals are in line
    release()
    assert not arrivals.settling()
    for _ in range(STORM_ADMISSIONS - 1):
        arrivals.admit()()
    assert arrivals.settling()  # STORM_ADMISSIONS within the window
    many = _Arrivals(STORM_ADMISSIONS, wait=0)
    for _ in range(STORM_ADMISSIONS - 1):
        many.admit()()
    assert not many.settling()


@pytest.mark.parametrize(
    ("peer", "expected"),
    [("silent", True), ("sent more", True), ("closed", False), ("reset", False)],
)
def test_a_client_is_still_there_unless_its_end_is_closed(peer, expected):
    import select
    import socket
    import struct

    from flask import Flask

    from app.workspace.transport.websocket import client_still_there

    with socket.create_server(("127.0.0.1", 0)) as listener:
        theirs = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
    with ours, theirs:
        if peer == "sent more":
            theirs.sendall(b"x")
            select.select([ours], [], [], 10)  # it has arrived
        elif peer in ("closed", "reset"):
            if peer == "reset":
                theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            theirs.close()
            select.select([ours], [], [], 10)  # the FIN or RST has arrived
        ours.settimeout(7.0)
        with Flask(__name__).test_request_context(environ_base={"gunicorn.socket": ours}):
            assert client_still_there() is expected
        assert ours.gettimeout() == 7.0  # as it was: a look changes nothing
        if peer == "sent more":
            assert ours.recv(1) == b"x"  # still there to read

"""A worker's gate on agents' arrivals: a reconnect storm waits its turn, then is refused."""

import gevent
import pytest

from app.common.failures import Unavailable
from app.workspace.tunnel.agents import _Arrivals


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

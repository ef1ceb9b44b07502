"""The in-process broker and the SSE helper."""
import time

import gevent
import pytest

from app.common.broker import Broker, SubscriptionClosed
from app.common.sse import _records, format_record


def test_each_subscriber_gets_every_message_in_order():
    broker = Broker()
    a, b = broker.subscribe("t"), broker.subscribe("t")
    for n in range(3):
        broker.publish("t", {"n": n})
    assert [a.get(0)["n"] for _ in range(3)] == [0, 1, 2]
    assert [b.get(0)["n"] for _ in range(3)] == [0, 1, 2]
    assert a.get(timeout=0.01) is None


def test_laggard_is_dropped_without_blocking_the_publisher():
    broker = Broker(max_pending=5)
    slow, fast = broker.subscribe("t"), broker.subscribe("t")
    for n in range(10):
        broker.publish("t", n)
        fast.get(0)
    # The slow one still gets what was queued, then learns it was dropped.
    assert [slow.get(0) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(SubscriptionClosed, match="lagging"):
        slow.get(0)
    assert broker.subscriber_count("t") == 1


def test_close_all_wakes_waiting_readers():
    broker = Broker()
    sub = broker.subscribe("t")
    waiter = gevent.spawn(sub.get, 30)
    gevent.sleep(0)
    broker.close_all("server is stopping")
    with pytest.raises(SubscriptionClosed, match="stopping"):
        waiter.get(timeout=2)


def test_format_record():
    assert format_record({"a": 1}, 7) == b'id: 7\ndata: {"a":1}\n\n'


def test_every_stream_sends_the_bytes_the_first_one_rendered():
    """One message object published to many streams is rendered once; another object,
    or the same one under another id, is rendered anew."""
    broker = Broker()
    subs = [broker.subscribe("t") for _ in range(3)]
    streams = [_records([], sub, lambda m: m["seq"], 0, 60, "/t") for sub in subs]
    for stream in streams:
        assert next(stream) == b": stream open\n\n"
    message = {"seq": 5, "text": "once"}
    broker.publish("t", message)
    sent = [next(stream) for stream in streams]
    assert sent[0] == format_record(message, 5) and all(chunk is sent[0] for chunk in sent)
    broker.publish("t", {"seq": 6, "text": "once"})
    later = [next(stream) for stream in streams]
    assert later[0] == format_record({"seq": 6, "text": "once"}, 6) and later[0] is not sent[0]
    for stream in streams:
        stream.close()


def test_records_skip_duplicates_and_keep_a_fixed_keepalive_schedule():
    """Replay, then live with duplicates skipped; keepalives keep their own schedule
    while events flow more often than the interval (a timer reset by each event
    would never fire), and never come early. No upper bound on when they come: that
    would measure the machine, not the helper."""
    broker = Broker()
    sub = broker.subscribe("t")
    interval = 0.3
    stream = _records([{"seq": 1}, {"seq": 2}], sub, lambda m: m["seq"], 0, interval, "/t")
    started = time.monotonic()
    published = []

    def publisher():
        seq = 2  # 2 is a duplicate of the replay
        while len(published) < 400:  # bounded: 20 s at the least, ~60 keepalive intervals
            broker.publish("t", {"seq": seq})
            published.append(seq)
            seq += 1
            gevent.sleep(0.05)

    feeder = gevent.spawn(publisher)
    seqs, keepalives = [], []
    for chunk in stream:
        if chunk.startswith(b": keepalive"):
            keepalives.append((time.monotonic() - started, len(published)))
            if len(keepalives) == 3:
                break
        elif chunk.startswith(b"id:"):
            seqs.append(int(chunk.split(b"\n")[0][4:]))
    stream.close()
    feeder.kill()
    assert len(keepalives) == 3, "keepalives stopped while events flowed"
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 3  # in order, the duplicate skipped
    for n, (at, _) in enumerate(keepalives, start=1):
        assert at >= n * interval - 0.01, keepalives  # never early
    assert keepalives[-1][1] < 400, "the keepalives came only after the events stopped"
    assert broker.subscriber_count("t") == 0  # closing the stream unsubscribed


def test_subscriptions_made_after_close_all_are_closed_at_once():
    broker = Broker()
    broker.close_all("server is stopping")
    late = broker.subscribe("t")
    broker.publish("t", "never delivered")
    with pytest.raises(SubscriptionClosed, match="stopping"):
        late.get(timeout=5)
    assert broker.subscriber_count("t") == 0

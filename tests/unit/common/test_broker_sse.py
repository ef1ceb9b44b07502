"""The in-process broker and the SSE helper."""

import time

import gevent
import pytest
from flask import Flask

from app.common.broker import LocalBroker, SubscriptionClosed
from app.common.sse import RECONNECT_MS, _records, format_record, stream_response


def test_each_subscriber_gets_every_message_in_order():
    broker = LocalBroker()
    a, b = broker.subscribe("t"), broker.subscribe("t")
    for n in range(3):
        broker.publish("t", {"n": n})
    assert [a.get(0)["n"] for _ in range(3)] == [0, 1, 2]
    assert [b.get(0)["n"] for _ in range(3)] == [0, 1, 2]
    assert a.get(timeout=0.01) is None


def test_laggard_is_dropped_without_blocking_the_publisher():
    broker = LocalBroker(max_pending=5)
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
    broker = LocalBroker()
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
    broker = LocalBroker()
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
    broker = LocalBroker()
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
    broker = LocalBroker()
    broker.close_all("server is stopping")
    late = broker.subscribe("t")
    broker.publish("t", "never delivered")
    with pytest.raises(SubscriptionClosed, match="stopping"):
        late.get(timeout=5)
    assert broker.subscriber_count("t") == 0


# --------------------------------------------------------------------------- waking and keepalives


def _wait_until(condition, what, timeout=10):
    """Yield to the loop until `condition()` holds: a bound on a hang, not a figure."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        gevent.sleep(0.01)


def test_one_publish_wakes_every_waiting_reader_once():
    broker = LocalBroker()
    subs = [broker.subscribe("t") for _ in range(50)]
    readers = [gevent.spawn(sub.get) for sub in subs]
    gevent.sleep(0)  # every reader is waiting
    broker.publish("t", {"n": 1})
    assert [r.get(timeout=10) for r in readers] == [{"n": 1}] * 50
    # Each was handed the message once: nothing more is waiting for it.
    assert all(sub.get(0) is None for sub in subs)


def test_interrupt_returns_none_after_the_messages_already_there():
    broker = LocalBroker()
    sub = broker.subscribe("t")
    waiter = gevent.spawn(sub.get)
    gevent.sleep(0)
    sub.interrupt()
    assert waiter.get(timeout=10) is None
    broker.publish("t", "queued")
    sub.interrupt()  # while not waiting: the next get that finds nothing returns None
    assert sub.get() == "queued"
    assert sub.get() is None
    broker.publish("t", "next")
    assert sub.get() == "next"


def test_close_all_ends_every_waiting_reader_promptly():
    broker = LocalBroker()
    subs = [broker.subscribe(f"t{n % 3}") for n in range(30)]
    readers = [gevent.spawn(sub.get) for sub in subs]  # no time-out: only the close ends them
    gevent.sleep(0)
    broker.close_all("server is stopping")
    gevent.joinall(readers, timeout=10)
    assert all(
        isinstance(r.exception, SubscriptionClosed) and r.exception.reason == "server is stopping" for r in readers
    )
    assert all(broker.subscriber_count(f"t{n}") == 0 for n in range(3))


def test_a_reader_closed_from_elsewhere_wakes_and_the_others_go_on_waiting():
    broker = LocalBroker()
    gone, other = broker.subscribe("t"), broker.subscribe("t")
    readers = [gevent.spawn(gone.get), gevent.spawn(other.get)]
    gevent.sleep(0)
    gone.close()
    with pytest.raises(SubscriptionClosed, match="closed"):
        readers[0].get(timeout=10)
    assert not readers[1].ready()
    broker.publish("t", "still here")
    assert readers[1].get(timeout=10) == "still here"


def test_a_topic_keeps_only_what_its_slowest_reader_has_not_read():
    """The messages are stored once per topic; what every reader has read is dropped
    (within a small batch), however many messages go through."""
    from app.common.broker import SCAN_AT_LEAST

    broker = LocalBroker(max_pending=100)
    fast, slow = broker.subscribe("t"), broker.subscribe("t")
    for n in range(500):
        broker.publish("t", n)
        assert fast.get(0) == n
        if n % 10 == 0:
            while slow.get(0) is not None:
                pass  # the slow reader catches up every ten messages
    topic = broker._local._topics["t"]
    assert len(topic.log) <= 2 * max(SCAN_AT_LEAST, 10)
    assert slow.get(0) == 491  # and it still has what it had not read, in order


def test_a_slow_stream_is_ended_with_the_reason_after_what_it_was_owed():
    """A stream whose client does not read falls behind; it is ended (its subscription
    forgotten at once), sends what it was owed, then says why it ends."""
    broker = LocalBroker(max_pending=5)
    stream = _records([], broker.subscribe("t"), lambda m: m["seq"], 0, 60, "/t")
    assert next(stream) == b": stream open\n\n"
    for seq in range(1, 10):
        broker.publish("t", {"seq": seq})
    assert broker.subscriber_count("t") == 0
    rest = list(stream)
    assert rest == [format_record({"seq": s}, s) for s in range(1, 6)] + [
        b": closed: lagging: the client fell too far behind\n\n"
    ]


def test_the_one_ticker_sends_keepalives_on_idle_streams():
    """Idle streams get their keepalives from the process's one ticker (no timer of
    their own), each on its own fixed schedule, and an ended stream leaves it."""
    from app.common import ticker

    broker = LocalBroker()
    before = ticker.current().pending()
    streams = [_records([], broker.subscribe("t"), None, None, 0.05, "/t") for _ in range(20)]
    for stream in streams:
        assert next(stream) == b": stream open\n\n"
    readers = [gevent.spawn(lambda s=stream: [next(s), next(s)]) for stream in streams]
    assert all(r.get(timeout=10) == [b": keepalive\n\n"] * 2 for r in readers)
    assert ticker.current().pending() == before + 20
    for stream in streams:
        stream.close()
    assert broker.subscriber_count("t") == 0
    assert ticker.current().pending() == before


def test_ticker_schedules_are_fixed_never_early_and_survive_a_faulty_callback():
    from app.common.ticker import Ticker

    ticker = Ticker()
    calls = []
    started = time.monotonic()

    def faulty():
        raise RuntimeError("boom")

    ticker.every(0.02, faulty)
    alarm = ticker.every(0.05, lambda: calls.append(time.monotonic() - started))
    cancelled = ticker.every(0.01, lambda: calls.append("cancelled"))
    cancelled.cancel()
    _wait_until(lambda: len(calls) >= 4, "four calls")
    alarm.cancel()
    assert "cancelled" not in calls
    assert all(at >= n * 0.05 for n, at in enumerate(calls, start=1)), calls  # never early
    _wait_until(lambda: ticker._greenlet is None, "the idle ticker to end")


def test_a_stream_tells_browsers_a_reconnection_delay_drawn_per_stream():
    """After a restart every open page reconnects: each stream's `retry:` spreads them."""
    app, broker = Flask(__name__), LocalBroker()
    app.add_url_rule("/events", "events", lambda: stream_response([], broker.subscribe("t")))
    delays = set()
    for _ in range(20):
        with app.test_client().get("/events") as response:
            chunks = response.response  # the generator: read two records, then let it go
            assert next(chunks) == b": stream open\n\n"
            retry = next(chunks)
            assert retry.startswith(b"retry: ") and retry.endswith(b"\n\n")
            delays.add(int(retry[7:]))
            chunks.close()
    low, high = RECONNECT_MS
    assert all(low <= delay <= high for delay in delays) and len(delays) > 1

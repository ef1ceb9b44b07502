"""The wizard on several gunicorn workers that share live events through Redis: a
write on any worker reaches the /api/events streams of every worker, in one order and
once; a generation's thoughts reach its tab and its phases its identity whichever
worker holds the stream; Redis going away closes the streams, never a committed write,
and the streams opened again after it is back hear the next write. Without REDIS_URL
the service refuses to start on several workers."""

import os
import subprocess
import uuid

import pytest
import redis

from app.common.sse_client import iter_records
from devtools.fake_providers import FakeProviders
from devtools.services import GUNICORN, ROOT, free_port
from devtools.waiting import wait_for
from tests.support.shared import serving_pid
from tests.support.wizard import TEST_IDENTITY, WizardClient

WORKERS = 4
KEY = "sk-test-wizard-scale-out"


@pytest.fixture(scope="module")
def fake_ai():
    with FakeProviders(host="127.0.0.1", keys={"openai": KEY}) as fake:
        yield fake


@pytest.fixture(scope="module")
def scaled(start_module_service, redis_server, postgres_server, fake_ai):
    """Four workers on PostgreSQL and Redis, as a scaled-out deployment runs."""
    service = start_module_service(
        "wizard",
        workers=WORKERS,
        env={
            **TEST_IDENTITY,
            "REDIS_URL": redis_server.new_url(),
            "DATABASE_URL": postgres_server.new_database(),
            "WIZ_AI_BASE_URL": fake_ai.base_url(),
            "WIZ_AI_API_KEY": KEY,
            "WIZ_TEXT_MODEL": "fake-text",
            "WIZ_AI_PROVIDER": "fake-openai",
        },
    )
    wait_for(lambda: len(service.worker_pids()) == WORKERS, f"{WORKERS} workers")
    return service


# --------------------------------------------------------------------------- which worker holds a connection


def on_every_worker(service, open_one):
    """One stream held by each worker: `open_one()` opens a Stream on a new connection,
    again until every worker holds one (the kernel hands a connection to whichever
    worker accepts it first, and a worker still loading the app accepts none); the
    extra ones are closed."""
    pids, held = set(service.worker_pids()), {}

    def one_more():
        stream = open_one()
        pid = serving_pid(service, stream.response)
        if pid in held:
            stream.close()
        else:
            held[pid] = stream
        return set(held) == pids

    try:
        wait_for(one_more, f"a stream held by each of the {len(pids)} workers")
    except TimeoutError:
        close_all(held.values())
        raise
    return list(held.values())


class Stream:
    """An SSE stream on a connection of its own, open once the server answered its
    headers (the subscription is made, and confirmed by Redis, before them). One
    parser for its whole life: records are read from it in several turns."""

    def __init__(self, client, path):
        fresh = client.as_user(client.user, client.groups)
        self.response = fresh.http.get(fresh.base_url + path, headers=fresh.headers(), stream=True, timeout=30)
        assert self.response.status_code == 200, self.response.text
        self._records = iter_records(self.response, include_comments=True)

    def next(self, count, until=None):
        """The next `count` data records (or up to the first for which `until` is true)."""
        seen = []
        for record in self._records:
            if record.comment is None:
                seen.append(record.json())
                if len(seen) == count or (until and until(seen[-1])):
                    return seen
        raise AssertionError(f"the stream ended after {seen}")

    def ending(self):
        """Read to the end of the stream; the comment that closed it."""
        comments = [record.comment for record in self._records if record.comment is not None]
        return comments[-1] if comments else None

    def close(self):
        self.response.close()


def close_all(streams):
    for stream in streams:
        stream.close()


# --------------------------------------------------------------------------- collection events


def write_on_every_worker(service, write):
    """Call `write(client)` on new connections until writes were served by every
    worker; returns how many were made, each answered 201 (committed)."""
    pids, served, statuses = set(service.worker_pids()), set(), []

    def one_more():
        response = write(WizardClient(service.base_url, "alice"))
        served.add(serving_pid(service, response))
        statuses.append(response.status_code)
        assert response.status_code == 201, response.text
        response.close()
        return served == pids

    wait_for(one_more, f"writes served by each of the {len(pids)} workers")
    return len(statuses)


def post_prompt(client, text="x"):
    return client.post("/api/collections/saved_prompts", json={"text": text}, stream=True)


def test_writes_on_every_worker_reach_streams_on_every_worker_once_and_in_order(scaled):
    reader = WizardClient(scaled.base_url, "reader")
    streams = on_every_worker(scaled, lambda: Stream(reader, "/api/events"))
    try:
        writes = write_on_every_worker(scaled, post_prompt)
        WizardClient(scaled.base_url, "alice").post("/api/collections/wizards", json={"name": "the last write"})
        expected = ["saved_prompts"] * writes + ["wizards"]
        for stream in streams:
            # Exactly these: no write lost, none announced twice (by another worker's watcher).
            assert [r["collection"] for r in stream.next(len(expected))] == expected
    finally:
        close_all(streams)


# --------------------------------------------------------------------------- thoughts and phases


def text_call(client, tab, request_id):
    response = client.post(
        "/api/ai/text",
        json={"messages": [{"role": "user", "content": "Say hello."}], "thoughtsTab": tab, "requestId": request_id},
    )
    assert response.status_code == 200, response.text
    return response.json()["content"]


def test_thoughts_reach_their_tab_and_phases_their_identity_whichever_worker_holds_the_stream(scaled):
    alice, bob = WizardClient(scaled.base_url, "alice"), WizardClient(scaled.base_url, "bob")
    tab, other_tab = uuid.uuid4().hex, uuid.uuid4().hex
    thoughts = on_every_worker(scaled, lambda: Stream(alice, f"/api/ai/thoughts/{tab}"))
    phases = on_every_worker(scaled, lambda: Stream(alice, "/api/ai/phases"))
    others = {
        "alice's other tab": Stream(alice, f"/api/ai/thoughts/{other_tab}"),
        "bob's thoughts on the same tab id": Stream(bob, f"/api/ai/thoughts/{tab}"),
        "bob's phases": Stream(bob, "/api/ai/phases"),
    }
    try:
        content = text_call(alice, tab, "r1")
        for stream in thoughts:
            heard = []
            while "".join(heard) != content:
                [record] = stream.next(1)
                assert record["requestId"] == "r1", record
                heard.append(record.get("text", ""))
        for stream in phases:
            seen = stream.next(3, until=lambda m: m["phase"] == "done")
            assert [(m["requestId"], m["phase"]) for m in seen] == [("r1", "queued"), ("r1", "started"), ("r1", "done")]
        # The others heard nothing of r1: the first thing each hears is a later call of its own.
        text_call(alice, other_tab, "alice-other-tab")
        text_call(bob, tab, "bob-1")
        firsts = {name: stream.next(1)[0]["requestId"] for name, stream in others.items()}
        assert firsts == {
            "alice's other tab": "alice-other-tab",
            "bob's thoughts on the same tab id": "bob-1",
            "bob's phases": "bob-1",
        }
    finally:
        close_all(thoughts + phases + list(others.values()))


# --------------------------------------------------------------------------- Redis restarted


def subscribed_pids(redis_server, url):
    """The pids of the processes with a subscriber connection to the database of `url`,
    as Redis lists them (connections are named bundle-<role>-<pid>)."""
    db = url.rsplit("/", 1)[1]
    listed = redis.Redis.from_url(redis_server.url()).client_list()
    return {
        int(c["name"].rsplit("-", 1)[1])
        for c in listed
        if c.get("name", "").startswith("bundle-subscriber-") and c.get("db") == db
    }


def test_redis_restarted_closes_the_streams_never_a_committed_write(start_service, redis_server):
    url = redis_server.new_url()
    service = start_service("wizard", workers=2, env={**TEST_IDENTITY, "REDIS_URL": url})
    reader = WizardClient(service.base_url, "reader")
    streams = on_every_worker(service, lambda: Stream(reader, "/api/events"))
    try:
        redis_server.stop()
        for stream in streams:
            assert stream.ending().startswith("closed: live events were interrupted")
        # While Redis is away: writes commit and answer as usual; a new stream says why it ends at once.
        writes = write_on_every_worker(service, lambda client: post_prompt(client, "during the outage"))
        refused = Stream(reader, "/api/events")
        assert refused.ending().startswith("closed: live events are unavailable")
        redis_server.start()
        wait_for(lambda: subscribed_pids(redis_server, url) == set(service.worker_pids()), "both workers back on Redis")
        streams = on_every_worker(service, lambda: Stream(reader, "/api/events"))
        WizardClient(service.base_url, "alice").post("/api/collections/wizards", json={"name": "after the outage"})
        for stream in streams:
            assert stream.next(1) == [{"collection": "wizards"}]
        texts = [
            row["text"] for row in WizardClient(service.base_url, "alice").get("/api/collections/saved_prompts").json()
        ]
        assert texts.count("during the outage") == writes
    finally:
        close_all(streams)
        if redis_server.process.poll() is not None:
            redis_server.start()  # the session's other tests need it


# --------------------------------------------------------------------------- no Redis, one worker only


def test_several_workers_without_redis_url_refuse_to_start(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(SERVICE="wizard", HOST="127.0.0.1", PORT=str(free_port()), DATA_DIR=str(tmp_path), WEB_CONCURRENCY="2")
    done = subprocess.run(
        [str(GUNICORN), "-c", "gunicorn.conf.py", "wsgi:app"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "REDIS_URL" in lines[0], done.stderr

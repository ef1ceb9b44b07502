"""The collection event stream: headers, one event per affected collection, every
write reaching every open stream."""

from app.common.sse_client import iter_records


def open_stream(client):
    response = client.http.get(client.base_url + "/api/events", headers=client.headers(), stream=True, timeout=10)
    assert response.status_code == 200
    return response


def next_collections(response, count):
    seen = []
    for record in iter_records(response):
        seen.append(record.json()["collection"])
        if len(seen) == count:
            return seen
    raise AssertionError(f"the stream ended after {seen}")


def test_headers_of_the_stream(wizard):
    with open_stream(wizard) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["Cache-Control"] == "no-cache"
        assert response.headers["X-Accel-Buffering"] == "no"


def test_every_write_reaches_every_open_stream(wizard, admin):
    streams = [open_stream(wizard), open_stream(wizard.as_user("bob")), open_stream(wizard.as_user("public"))]
    try:
        row = wizard.post("/api/collections/saved_prompts", json={"text": "x"}).json()
        wizard.patch(f"/api/collections/saved_prompts/{row['id']}", json={"text": "y"})
        wizard.delete(f"/api/collections/saved_prompts/{row['id']}")
        blueprint = wizard.post("/api/collections/blueprints", json={"title": "b", "is_public": True}).json()
        wizard.post("/api/likes/toggle", json={"blueprint_id": blueprint["id"]})
        admin.post("/api/collections/admin_prompts", json={"key": "events.test", "text": "t"})
        expected = ["saved_prompts"] * 3 + ["blueprints", "likes", "blueprints", "admin_prompts"]
        for response in streams:
            assert next_collections(response, len(expected)) == expected
    finally:
        for response in streams:
            response.close()


def test_refused_writes_send_no_event(wizard):
    with open_stream(wizard) as response:
        assert wizard.post("/api/collections/likes", json={}).status_code == 403
        assert (
            wizard.post(
                "/api/collections/saved_prompts", data="x", headers={"Content-Type": "application/json"}
            ).status_code
            == 400
        )
        wizard.post("/api/collections/prompt_history", json={"prompt": "marker"})
        assert next_collections(response, 1) == ["prompt_history"]


def test_writes_in_one_worker_reach_streams_in_every_worker(start_service, redis_server):
    # Two worker processes: the kernel spreads the streams over both, and a write is
    # handled by one of them; the other hears of it through Redis (test_scale_out.py
    # checks that every worker holds streams, and the exact order).
    from tests.support.wizard import TEST_IDENTITY, WizardClient

    service = start_service("wizard", workers=2, env={**TEST_IDENTITY, "REDIS_URL": redis_server.new_url()})
    client = WizardClient(service.base_url, "alice")
    streams = [open_stream(WizardClient(service.base_url, f"reader{i}")) for i in range(8)]
    try:
        client.post("/api/collections/saved_prompts", json={"text": "one"})
        client.post("/api/collections/wizards", json={"name": "two"})
        for response in streams:
            seen = set()
            for record in iter_records(response):
                seen.add(record.json()["collection"])
                if seen == {"saved_prompts", "wizards"}:
                    break
            assert seen == {"saved_prompts", "wizards"}
    finally:
        for response in streams:
            response.close()


# More streams opened at once on one worker than its pool holds connections (SQLite: 64).
BURST = 150


def test_a_burst_of_stream_opens_all_open_and_a_request_is_served_meanwhile(start_service, redis_server):
    """A reconnect storm on one worker whose streams subscribe through Redis (each open
    waits for Redis): every stream opens (the stream route takes no database
    connection, so none waits on the pool or fails for want of one), a request that
    reads the database is served while they are open, and each stream hears the next
    write."""
    from tests.support.metrics import scrape
    from tests.support.stream_burst import streams_opened_at_once
    from tests.support.wizard import TEST_IDENTITY, WizardClient

    service = start_service("wizard", env={**TEST_IDENTITY, "REDIS_URL": redis_server.new_url()})
    client = WizardClient(service.base_url, "alice")
    with streams_opened_at_once(
        service.port, "/api/events", lambda i: {"X-Wiz-Test-User": f"reader{i}"}, BURST
    ) as streams:
        assert [stream.status_line() for stream in streams] == ["HTTP/1.1 200 OK"] * BURST
        assert client.get("/api/collections/saved_prompts").status_code == 200
        samples = scrape(service)
        assert samples.value("bundle_sse_streams_open") == BURST
        assert samples.value("bundle_db_pool_connections_in_use") == 0
        assert not samples.value("bundle_db_pool_waits_total")  # no checkout found the pool empty
        client.post("/api/collections/saved_prompts", json={"text": "x"}).raise_for_status()
        for stream in streams:
            stream.read_until(b'{"collection":"saved_prompts"}')

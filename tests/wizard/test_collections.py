"""Collections written by two worker processes at once: every write waits its turn.
The collections' route logic is tests/unit/wizard/test_collections.py."""

import json
from urllib.parse import quote


def rows(client, name, **wanted):
    query = f"?filter={quote(json.dumps(wanted))}" if wanted else ""
    response = client.get(f"/api/collections/{name}{query}")
    assert response.status_code == 200, response.text
    return response.json()


def test_concurrent_writes_in_two_workers_all_succeed(start_service, redis_server):
    # Two worker processes read-then-write the same rows at once: every write waits
    # its turn for the database, none fails with "database is locked".
    from concurrent.futures import ThreadPoolExecutor

    from tests.support.wizard import TEST_IDENTITY, WizardClient

    service = start_service("wizard", workers=2, env={**TEST_IDENTITY, "REDIS_URL": redis_server.new_url()})
    client = WizardClient(service.base_url, "alice")
    row = client.post("/api/collections/saved_prompts", json={"text": "v0"}).json()

    def write(i):
        mine = WizardClient(service.base_url, "alice")
        if i % 2:
            return mine.patch(f"/api/collections/saved_prompts/{row['id']}", json={"text": f"v{i}"}).status_code
        return mine.post("/api/collections/saved_prompts", json={"text": f"new {i}"}).status_code

    with ThreadPoolExecutor(40) as pool:
        statuses = list(pool.map(write, range(80)))
    assert statuses.count(200) == 40 and statuses.count(201) == 40
    assert len(rows(client, "saved_prompts")) == 41

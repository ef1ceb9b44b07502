"""The deck service's own metrics on `/metrics`, summed over its gunicorn workers:
appends and their fsync time, and the sessions that have listeners."""

import requests

from devtools.waiting import wait_for
from tests.support.decks import StreamReader, copy_sample_deck, post_event
from tests.support.metrics import scrape


def note(text):
    return {"type": "note", "slide": 0, "text": text}


def test_appends_fsyncs_and_sessions_with_listeners(start_service, tmp_path):
    data_dir = tmp_path / "decks-data"
    data_dir.mkdir()
    import_body = copy_sample_deck(data_dir)
    service = start_service("decks", data_dir=data_dir, workers=2)
    url = service.base_url
    requests.post(f"{url}/api/decks/import", json=import_body, timeout=10).raise_for_status()
    session = requests.post(f"{url}/api/sessions", json={"deck_id": "welcome"}, timeout=10).json()

    before = scrape(service)
    appends = before.value("bundle_decks_appends_total")
    fsyncs = before.value("bundle_decks_fsync_duration_seconds_count")
    assert before.value("bundle_decks_sessions_with_listeners") == 0
    for n in range(3):  # one at a time: three batches, three fsyncs, on whichever worker
        post_event(url, session["id"], note(f"n{n}")).raise_for_status()
    after = scrape(service)
    assert after.value("bundle_decks_appends_total") == (appends or 0) + 3
    assert after.value("bundle_decks_fsync_duration_seconds_count") == (fsyncs or 0) + 3
    assert after.value("bundle_decks_fsync_duration_seconds_bucket", le="+Inf") == (fsyncs or 0) + 3
    assert after.value("bundle_decks_fsync_duration_seconds_sum") > 0

    reader = StreamReader(f"{url}/api/sessions/{session['id']}/stream?after=3", until=4)
    reader.start()
    reader.wait_open()
    wait_for(lambda: scrape(service).value("bundle_decks_sessions_with_listeners") == 1, "a session with a listener")
    post_event(url, session["id"], note("heard")).raise_for_status()
    reader.join(10)
    assert reader.seqs == [4] and reader.error is None

    def no_listener_left():
        # The client is gone: its stream notices at its next write, then the feed stops.
        post_event(url, session["id"], note("unheard")).raise_for_status()
        return scrape(service).value("bundle_decks_sessions_with_listeners") == 0

    wait_for(no_listener_left, "the session without listeners", timeout=20)

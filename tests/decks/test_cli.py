"""`python -m app.decks tail`: prints events as they arrive and reconnects by itself."""

import json
import queue
import subprocess
import sys
import threading

import requests

from tests.support.decks import copy_sample_deck, post_event
from tests.support.shared import ROOT


def lines_of(process):
    lines = queue.Queue()

    def pump():
        for line in process.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def test_tail_prints_events_and_survives_a_restart(start_service, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    body = copy_sample_deck(data)
    service = start_service("decks", data_dir=data)
    url = service.base_url
    requests.post(f"{url}/api/decks/import", json=body, timeout=10).raise_for_status()
    sid = requests.post(f"{url}/api/sessions", json={"deck_id": "welcome"}, timeout=10).json()["id"]
    post_event(url, sid, {"type": "note", "slide": 0, "text": "before tail"}).raise_for_status()

    tail = subprocess.Popen(
        [sys.executable, "-m", "app.decks", "tail", sid, "--url", url, "--format", "json"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = lines_of(tail)
        assert json.loads(lines.get(timeout=15))["text"] == "before tail"
        post_event(url, sid, {"type": "task", "slide": 1, "text": "live"}).raise_for_status()
        assert json.loads(lines.get(timeout=15))["seq"] == 2

        service.stop()
        restarted = start_service("decks", data_dir=data, port=service.port)
        post_event(url, sid, {"type": "verdict", "value": "approve"}).raise_for_status()
        resumed = json.loads(lines.get(timeout=30))
        assert resumed["seq"] == 3 and resumed["value"] == "approve"
        assert lines.empty()  # nothing repeated after the reconnect
        assert restarted.port == service.port
    finally:
        tail.terminate()
        tail.wait(10)
    assert "reconnecting in 1 s" in tail.stderr.read()


def test_tail_of_a_missing_session_says_so(shared_decks_server):
    result = subprocess.run(
        [sys.executable, "-m", "app.decks", "tail", "nope", "--url", shared_decks_server.base_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "session nope does not exist" in result.stderr

"""The deck review pages in a real browser, through nginx: live notes between two
tabs, a scribble drawn with the pointer and stored as PNG, and a review page that
reconnects by itself after the service restarts, with no duplicate and no gap."""

import requests
from playwright.sync_api import expect

from tests.support.decks import copy_sample_deck


def review_site(site, tmp_path):
    data_dir = tmp_path / "decks"
    data_dir.mkdir()
    body = copy_sample_deck(data_dir)
    running = site("decks", data_dir=data_dir)
    requests.post(f"{running.api}/api/decks/import", json=body, timeout=10).raise_for_status()
    created = requests.post(
        f"{running.api}/api/sessions", json={"deck_id": "welcome", "title": "Browser review"}, timeout=10
    )
    created.raise_for_status()
    return running, created.json()["id"]


def open_review(context, running, session_id):
    tab = context.new_page()
    tab.goto(f"{running.url}/review/{session_id}")
    expect(tab.locator("#conn")).to_have_attribute("data-state", "live")
    return tab


def feed_seqs(tab):
    return [int(seq) for seq in tab.locator("#feed li").evaluate_all("items => items.map(i => i.dataset.seq)")]


def test_home_lists_the_deck_and_the_session(site, page, tmp_path):
    running, _ = review_site(site, tmp_path)
    page.goto(running.url + "/")
    expect(page.locator("#decks-list")).to_contain_text("welcome")
    expect(page.locator("#sessions-list")).to_contain_text("Browser review")


def test_a_note_added_in_one_tab_appears_in_the_other(site, context, tmp_path):
    running, session_id = review_site(site, tmp_path)
    writer, reader = open_review(context, running, session_id), open_review(context, running, session_id)
    writer.fill("#comment-text", "The chart on this slide needs a legend.")
    writer.get_by_role("button", name="Add note").click()
    expect(reader.locator("#feed")).to_contain_text("The chart on this slide needs a legend.", timeout=2000)


def test_a_scribble_drawn_with_the_pointer_is_stored_as_png(site, context, tmp_path):
    running, session_id = review_site(site, tmp_path)
    tab = open_review(context, running, session_id)
    tab.click("#draw")
    box = tab.locator("#pad").bounding_box()
    tab.mouse.move(box["x"] + 40, box["y"] + 40)
    tab.mouse.down()
    for step in range(1, 20):
        tab.mouse.move(box["x"] + 40 + step * 12, box["y"] + 40 + step * 6)
    tab.mouse.up()
    tab.click("#scribble-send")
    expect(tab.locator("#feed li.event-scribble")).to_have_count(1)
    events = requests.get(f"{running.api}/api/sessions/{session_id}/events", timeout=10).json()
    scribble = next(event for event in events["events"] if event["type"] == "scribble")
    png = requests.get(f"{running.api}/api/sessions/{session_id}/scribbles/{scribble['file']}", timeout=10)
    assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_review_page_reconnects_after_a_restart_with_no_gap_or_duplicate(site, context, tmp_path):
    running, session_id = review_site(site, tmp_path)
    tab = open_review(context, running, session_id)
    post = f"{running.api}/api/sessions/{session_id}/events"
    requests.post(post, json={"type": "note", "slide": 1, "text": "before the restart"}, timeout=10).raise_for_status()
    expect(tab.locator("#feed")).to_contain_text("before the restart")

    running.restart_service()
    # The page notices the stream ended and reconnects by itself (1 s, then doubling).
    expect(tab.locator("#conn")).to_have_attribute("data-state", "live", timeout=30_000)
    for text in ("after the restart 1", "after the restart 2"):
        requests.post(
            f"{running.api}/api/sessions/{session_id}/events",
            json={"type": "note", "slide": 1, "text": text},
            timeout=10,
        ).raise_for_status()
    expect(tab.locator("#feed")).to_contain_text("after the restart 2", timeout=5000)
    seqs = feed_seqs(tab)
    assert sorted(seqs) == list(range(1, max(seqs) + 1)), seqs  # every event, once

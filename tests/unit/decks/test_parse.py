"""Markdown → slides: separators, fences, front matter, notes, images, safety."""

from app.decks.parse import parse_deck


def keep(src):
    return f"/assets/{src}"


def test_splits_on_rules_outside_code_fences_and_drops_blank_slides():
    source = "# One\n\n---\n\n```\n---\n```\n---\n\n---\n# Three\n"
    deck = parse_deck(source, keep)
    assert [s["title"] for s in deck["slides"]] == ["One", None, "Three"]
    assert "---" in deck["slides"][1]["markdown"]


def test_tilde_fences_and_longer_closing_fences():
    source = "~~~~\n---\n~~~\n---\n~~~~~\nend\n---\n# Next"
    deck = parse_deck(source, keep)
    assert len(deck["slides"]) == 2


def test_front_matter_gives_title_and_is_not_a_slide():
    deck = parse_deck("---\ntitle: Quarterly\ndate: 2026-01-02\n---\n# First\n", keep)
    assert deck["title"] == "Quarterly"
    assert deck["meta"] == {"title": "Quarterly", "date": "2026-01-02"}
    assert len(deck["slides"]) == 1


def test_title_falls_back_to_first_heading():
    assert parse_deck("## Intro\ntext", keep)["title"] == "Intro"
    assert parse_deck("no heading", keep)["title"] is None


def test_notes_after_note_line_and_in_comments():
    deck = parse_deck("# A\nbody\n<!-- notes: from comment -->\nNote:\nsay this\nand this", keep)
    slide = deck["slides"][0]
    assert slide["notes"] == "from comment\n\nsay this\nand this"
    assert "say this" not in slide["html"] and "from comment" not in slide["html"]
    assert "body" in slide["html"]


def test_note_line_inside_fence_is_code():
    deck = parse_deck("```\nNote: not a note\n```", keep)
    assert deck["slides"][0]["notes"] == ""


def test_images_rewritten_and_unresolved_reported():
    deck = parse_deck("![a](images/x.png)\n\n![b](missing.png)", lambda s: None if "missing" in s else keep(s))
    slide = deck["slides"][0]
    assert 'src="/assets/images/x.png"' in slide["html"]
    assert slide["images"] == ["/assets/images/x.png"]
    assert deck["warnings"] == ["slide 1: image 'missing.png' is not among the copied assets"]


def test_raw_html_is_escaped_not_rendered():
    deck = parse_deck("<script>alert(1)</script>\n\n<img src=x onerror=alert(1)>", keep)
    html = deck["slides"][0]["html"]
    assert "<script>" not in html and "<img" not in html
    assert "&lt;script&gt;" in html

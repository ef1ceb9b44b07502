"""Text search through the running service, the same assertions on both backends
(SQLite's FTS5 and PostgreSQL's tsvector): the answer's shape, ranking (a title word
above a body word, more of the words above fewer), scope (notebook, sources, notes),
one hit per parent however long its text, snippets, stemming and diacritics, a
renamed source, and input that would be query syntax."""

import pytest

from tests.support.notebook import add_note, add_text_source

HIT_FIELDS = {"id", "parent_id", "type", "title", "score", "relevance", "matches"}
# Longer than one part of PostgreSQL's index (app.notebook.core.index.PART_CHARS): indexed
# in several rows, still one hit.
LONG_WORDS = 30_000


def _search(nb, **body):
    response = nb.post("/search", json={"type": "text", **body})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"results", "total_count", "search_type"}
    assert answer["search_type"] == "text" and answer["total_count"] == len(answer["results"])
    for hit in answer["results"]:
        assert set(hit) == HIT_FIELDS, hit
        assert hit["parent_id"] == hit["id"] and hit["type"] == hit["id"].split(":")[0]
        assert isinstance(hit["score"], float) and hit["score"] == hit["relevance"] and hit["score"] > 0
        assert isinstance(hit["matches"], list) and all(isinstance(m, str) for m in hit["matches"])
    return answer["results"]


def _ids(hits):
    return [hit["id"] for hit in hits]


FILLER = (
    "The survey team measured the river banks, counted the birds along the shore, and wrote "
    "down the weather every morning before breakfast. "
)


@pytest.fixture(scope="module")
def library(nb):
    """A notebook of sources and notes with known words, and a second notebook."""
    notebook, other = nb.notebook(), nb.notebook()
    ids = {
        "title": add_text_source(nb, notebook, "Heliotrope gardens", FILLER * 3),
        "body": add_text_source(nb, notebook, "Garden notes", FILLER + "A heliotrope grew by the wall. " + FILLER * 2),
        "both": add_text_source(nb, notebook, "Orchards", FILLER + "Quinces and medlars ripen late. " + FILLER),
        "one": add_text_source(nb, notebook, "Fruit", FILLER + "Quinces ripen in the autumn sun. " + FILLER),
        "note": add_note(nb, notebook, "Heliotrope seeds", "Sow the heliotrope seeds in spring."),
        "elsewhere": add_text_source(nb, other, "Heliotrope elsewhere", FILLER + "heliotrope " + FILLER),
        "cafe": add_text_source(nb, notebook, "Le café du coin", FILLER + "Un café crème au comptoir. " + FILLER),
        "running": add_text_source(nb, notebook, "Athletics", FILLER + "She runs every day. " + FILLER),
    }
    return notebook, other, ids


def test_the_answer_and_each_hit_have_the_same_shape_on_either_database(nb, library):
    notebook, _, ids = library
    hits = _search(nb, query="heliotrope", notebook_id=notebook)
    assert set(_ids(hits)) == {ids["title"], ids["body"], ids["note"]}
    by_id = {hit["id"]: hit for hit in hits}
    assert by_id[ids["note"]]["type"] == "note" and by_id[ids["body"]]["type"] == "source"
    assert by_id[ids["body"]]["title"] == "Garden notes"
    assert any("heliotrope" in m.lower() for m in by_id[ids["body"]]["matches"])


def test_a_title_word_ranks_above_a_body_word_and_more_words_above_fewer(nb, library):
    notebook, _, ids = library
    hits = _ids(_search(nb, query="heliotrope", notebook_id=notebook, search_notes=False))
    assert hits == [ids["title"], ids["body"]]
    hits = _ids(_search(nb, query="quinces medlars", notebook_id=notebook))
    assert hits == [ids["both"], ids["one"]]  # the words are ORed: one word is enough
    scores = [hit["score"] for hit in _search(nb, query="quinces medlars", notebook_id=notebook)]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[1]


def test_scope_by_notebook_and_kind(nb, library):
    notebook, other, ids = library
    assert _ids(_search(nb, query="heliotrope", notebook_id=other)) == [ids["elsewhere"]]
    assert _ids(_search(nb, query="heliotrope", notebook_id=notebook, search_sources=False)) == [ids["note"]]
    everywhere = _ids(_search(nb, query="heliotrope"))
    assert {ids["title"], ids["body"], ids["note"], ids["elsewhere"]} <= set(everywhere)
    assert len(everywhere) == len(set(everywhere))
    assert len(_search(nb, query="heliotrope", limit=2)) == 2


def test_stemming_and_diacritics(nb, library):
    notebook, _, ids = library
    assert _ids(_search(nb, query="running", notebook_id=notebook)) == [ids["running"]]
    assert _ids(_search(nb, query="cafe", notebook_id=notebook)) == [ids["cafe"]]
    assert _ids(_search(nb, query="CAFÉ", notebook_id=notebook)) == [ids["cafe"]]


def test_a_long_source_is_one_hit_with_a_snippet_of_its_best_passage(nb):
    notebook = nb.notebook()
    words = [f"filler{i % 997}" for i in range(LONG_WORDS)]
    words[100] = "zeppelin"
    words[LONG_WORDS - 100 : LONG_WORDS - 97] = ["zeppelin", "hangar", "zeppelin"]
    long_id = add_text_source(nb, notebook, "A long log", " ".join(words))
    short_id = add_text_source(nb, notebook, "A short log", "A hangar by the sea.")
    hits = {hit["id"]: hit for hit in _search(nb, query="zeppelin hangar", notebook_id=notebook)}
    assert sorted(hits) == sorted([long_id, short_id])  # (which first: each engine's length normalization)
    matches = hits[long_id]["matches"]
    assert any("zeppelin" in m and "hangar" in m for m in matches) and all(len(m) < 400 for m in matches), matches
    deleted = nb.delete(f"/sources/{long_id}")
    assert deleted.status_code == 200, deleted.text
    assert _ids(_search(nb, query="zeppelin hangar", notebook_id=notebook)) == [short_id]


def test_a_renamed_source_is_found_by_its_new_title_only(nb):
    notebook = nb.notebook()
    source = add_text_source(nb, notebook, "Marmalade", "Seville oranges boiled with sugar.")
    assert _ids(_search(nb, query="marmalade", notebook_id=notebook)) == [source]
    renamed = nb.put(f"/sources/{source}", json={"title": "Preserves"})
    assert renamed.status_code == 200, renamed.text
    assert _search(nb, query="marmalade", notebook_id=notebook) == []
    assert _ids(_search(nb, query="preserves", notebook_id=notebook)) == [source]
    assert _ids(_search(nb, query="seville", notebook_id=notebook)) == [source]  # the body stays


@pytest.mark.parametrize(
    "query",
    [
        '"unbalanced',
        "heliotrope OR -seeds",
        "NEAR(heliotrope",
        "helio*",
        "title:heliotrope",
        "heliotrope & !seeds | (",
        "'; DROP TABLE note; --",
        "50% ?",
    ],
)
def test_query_syntax_is_only_words(nb, library, query):
    notebook, _, ids = library
    hits = _search(nb, query=query, notebook_id=notebook)
    assert set(_ids(hits)) <= {ids["title"], ids["body"], ids["note"]}


def test_a_query_without_words_is_400(nb):
    response = nb.post("/search", json={"query": "?!%", "type": "text"})
    assert response.status_code == 400 and response.json()["field"] == "query"

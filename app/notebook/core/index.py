"""The full-text index: one entry per source (its title and full text) and per note
(title and content), each tagged with its parent (`source:…` or `note:…`), found
by an index when the entry is replaced or deleted. Written in the same transaction
as the records it indexes.

SQLite: an FTS5 table (`search_fts`, ranked by BM25), one row per parent, whose
rowid is the `searchdoc` row's id. One row per parent rather than per chunk: "one
hit per parent with its best score" is then the ranking itself, and BM25 scores 1
row per source instead of every chunk that holds a common word (6-8 times fewer
rows to score at 5 KB per source), which is what keeps a query over 1000 sources
in milliseconds.

PostgreSQL: `searchdoc.document`, a tsvector under a GIN index (made by
schema.create_postgres_search), title weighted A and body B. A tsvector holds at
most 1 MB, so a long body is indexed in parts of PART_CHARS characters, one row
each (the title in every part, `body_start` where the part starts in the body):
a search keeps each parent's best part, and its snippet is made from that part.
Diacritics are folded before the text is parsed (the query's too), as SQLite's
`remove_diacritics` does."""

import re
import unicodedata

from app.common.db import run_sql
from app.notebook.core.models import SearchDoc, database, is_sqlite

_WORD = re.compile(r"\w+", re.UNICODE)
_COMBINING = re.compile(r"[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]+")

# PostgreSQL's text search configuration: English stemming (SQLite's is Porter's).
TS_CONFIG = "english"
# A part's characters: its tsvector stays well under PostgreSQL's 1 MB whatever the
# text (a tsvector takes at most ~5 bytes per byte of text, UTF-8 takes <= 4 per
# character, and most characters of a large text are not words).
PART_CHARS = 50_000
# A part also reads this far into the next one, so that no word is cut in two.
PART_OVERLAP = 100


# A part's tsvector: the title's words weighted A, the part's B (parameters: both texts).
_DOCUMENT_SQL = f"setweight(to_tsvector('{TS_CONFIG}', ?), 'A') || setweight(to_tsvector('{TS_CONFIG}', ?), 'B')"


def fold(text):
    """`text` without diacritics (é -> e), as the index and the queries see it."""
    if text.isascii():
        return text
    return _COMBINING.sub("", unicodedata.normalize("NFKD", text))


def parts(body):
    """[(start, text)] of `body`: where each indexed part starts, and its text."""
    if len(body) <= PART_CHARS + PART_OVERLAP:
        return [(0, body)]
    return [(start, body[start : start + PART_CHARS + PART_OVERLAP]) for start in range(0, len(body), PART_CHARS)]


def drop(parent):
    """Remove the indexed rows of `parent`."""
    if is_sqlite():
        database.execute_sql(
            "DELETE FROM search_fts WHERE rowid IN (SELECT id FROM searchdoc WHERE parent = ?)", (parent,)
        )
    SearchDoc.delete().where(SearchDoc.parent == parent).execute()


def put(parent, title, body):
    """Index (or re-index) `parent` with its title and body."""
    drop(parent)
    title, body, kind = title or "", body or "", parent.split(":", 1)[0]
    if is_sqlite():
        doc = SearchDoc.create(parent=parent, part=kind)
        database.execute_sql(
            "INSERT INTO search_fts (rowid, title, body, parent) VALUES (?, ?, ?, ?)", (doc.id, title, body, parent)
        )
        return
    folded_title = fold(title)
    for start, text in parts(body):
        run_sql(
            database,
            f"INSERT INTO searchdoc (parent, part, body_start, document) VALUES (?, ?, ?, {_DOCUMENT_SQL})",
            (parent, kind, start, folded_title, fold(text)),
        )


def set_title(parent, title):
    if is_sqlite():
        database.execute_sql(
            "UPDATE search_fts SET title = ? WHERE rowid IN (SELECT id FROM searchdoc WHERE parent = ?)",
            (title, parent),
        )
        return
    # The body's lexemes (weight B) stay; the title's are replaced.
    run_sql(
        database,
        f"UPDATE searchdoc SET document = setweight(to_tsvector('{TS_CONFIG}', ?), 'A')"
        " || ts_filter(document, '{{b}}') WHERE parent = ?",
        (fold(title or ""), parent),
    )


def words(query):
    """The words of a query (at most 64). None when the query has no word at all."""
    found = _WORD.findall(query)[:64]
    return found or None


def match_expression(query):
    """The user's words as an FTS5 query: each word quoted (so that no input is FTS
    syntax), joined by OR; BM25 ranks the parents with more and rarer words first.
    None when the query has no word at all."""
    found = words(query)
    if found is None:
        return None
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in found)


def websearch_expression(query):
    """The same for PostgreSQL's websearch_to_tsquery: each word quoted (the words
    are `\\w+`, so no quote or operator gets through), joined by `or`, folded as
    the index is. None when the query has no word at all."""
    found = words(fold(query))
    if found is None:
        return None
    return " or ".join(f'"{w}"' for w in found)

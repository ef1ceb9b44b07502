"""The full-text index (SQLite FTS5, ranked by BM25): one row per source (its
title and full text) and per note (title and content), each tagged with its parent
(`source:…` or `note:…`), which `searchdoc` (same rowid) finds by an index when
the row is replaced or deleted.
Written in the same transaction as the records it indexes.

One row per parent rather than per chunk: "one hit per parent with its best
score" is then the ranking itself, and BM25 scores 1 row per source instead of
every chunk that holds a common word (6-8 times fewer rows to score at 5 KB per
source), which is what keeps a query over 1000 sources in milliseconds."""
import re

from app.notebook.models import SearchDoc, database, is_sqlite

_WORD = re.compile(r"\w+", re.UNICODE)


def drop(parent):
    """Remove the indexed row of `parent`."""
    if not is_sqlite():
        return
    database.execute_sql("DELETE FROM search_fts WHERE rowid IN (SELECT id FROM searchdoc WHERE parent = ?)",
                         (parent,))
    SearchDoc.delete().where(SearchDoc.parent == parent).execute()


def put(parent, title, body):
    """Index (or re-index) `parent` with its title and body."""
    if not is_sqlite():
        return
    drop(parent)
    doc = SearchDoc.create(parent=parent, part=parent.split(":", 1)[0])
    database.execute_sql("INSERT INTO search_fts (rowid, title, body, parent) VALUES (?, ?, ?, ?)",
                         (doc.id, title or "", body or "", parent))


def set_title(parent, title):
    if not is_sqlite():
        return
    database.execute_sql("UPDATE search_fts SET title = ? WHERE rowid IN "
                         "(SELECT id FROM searchdoc WHERE parent = ?)", (title, parent))


def match_expression(query):
    """The user's words as an FTS5 query: each word quoted (so that no input is FTS
    syntax), joined by OR; BM25 ranks the parents with more and rarer words first.
    None when the query has no word at all."""
    words = _WORD.findall(query)[:64]
    if not words:
        return None
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in words)

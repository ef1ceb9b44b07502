"""POST /search: full-text (SQLite: FTS5, BM25; PostgreSQL: tsvector, ts_rank) or
vector (cosine similarity with the configured embedding model) over sources and
notes, one hit per parent with its best score, optionally within one notebook."""

import threading

from flask import Blueprint

from app.common.db import run_sql
from app.common.failures import ApiError, Invalid
from app.common.offload import blocking
from app.notebook.core import embeddings
from app.notebook.core.index import PART_CHARS, PART_OVERLAP, TS_CONFIG, match_expression, websearch_expression
from app.notebook.core.models import Chunk, Note, Source, SourceNotebook, database, is_sqlite, vectors_generation
from app.notebook.routes.http import body, settings
from app.notebook.routes.notebooks import get_notebook
from app.notebook.routes.payloads import SearchRequest

bp = Blueprint("search", __name__)


def _scope_sql(data, notebook_key):
    """SQL conditions on the index's `parent` for the kinds and the notebook asked for
    (none when everything is asked for: the cheapest query)."""
    conditions, params = ["1 = 1"], []
    if not (data["search_sources"] and data["search_notes"]):
        conditions.append("parent LIKE ?")
        params.append("source:%" if data["search_sources"] else "note:%")
    if notebook_key:
        conditions.append(
            "(parent IN (SELECT 'source:' || source_id FROM sourcenotebook WHERE notebook_id = ?)"
            " OR parent IN (SELECT 'note:' || id FROM note WHERE notebook_id = ?))"
        )
        params += [notebook_key, notebook_key]
    return " AND ".join(conditions), params


def _details(parents, text_chars=0):
    """{parent: (title, the first `text_chars` characters of its text)} of sources and
    notes, in one query (raw SQL: building it with peewee would cost more than running it)."""
    parts, params, mark = [], [], database.param
    for prefix, model, text in (("source:", Source, "full_text"), ("note:", Note, "content")):
        keys = [p[len(prefix) :] for p in parents if p.startswith(prefix)]
        if keys:
            parts.append(
                f"SELECT '{prefix}' || id, title, substr({text}, 1, {mark}) FROM {model._meta.table_name}"
                f" WHERE id IN ({', '.join(mark for _ in keys)})"
            )
            params += [text_chars, *keys]
    if not parts:
        return {}
    return {
        parent: (title, text)
        for parent, title, text in database.execute_sql(" UNION ALL ".join(parts), params).fetchall()
    }


def _titles(parents):
    return {parent: title for parent, (title, _) in _details(parents).items()}


def _hit(parent, title, score, kind_of_score, match):
    return {
        "id": parent,
        "parent_id": parent,
        "type": parent.split(":", 1)[0],
        "title": title or "",
        "score": score,
        kind_of_score: score,
        "matches": [match] if match else [],
    }


# PostgreSQL: a title word is worth five body words (as SQLite's BM25 weights say);
# ts_rank's weights are {D, C, B, A}. Normalization 1 divides by 1 + log(length).
_PG_WEIGHTS = "'{0.2, 0.2, 0.2, 1.0}'"
_PG_HEADLINE = 'StartSel="", StopSel="", MaxWords=24, MinWords=12, ShortWord=2, MaxFragments=1'


def _ranked(data, notebook_key):
    """(query expression, [(parent, score, index row id)] best first) of a text search."""
    if is_sqlite():
        expression = match_expression(data["query"])
        _require_words(expression)
        where, params = _scope_sql(data, notebook_key)
        rows = database.execute_sql(
            f"SELECT parent, -rank, rowid FROM search_fts WHERE search_fts MATCH ? AND {where} ORDER BY rank LIMIT ?",
            [expression, *params, data["limit"]],
        ).fetchall()
        return expression, rows
    expression = websearch_expression(data["query"])
    _require_words(expression)
    where, params = _scope_sql(data, notebook_key)
    # Each parent's best part (most parents have one), then the best parents.
    rows = run_sql(
        database,
        "SELECT parent, score, id FROM (SELECT DISTINCT ON (parent) parent, id,"
        f" ts_rank({_PG_WEIGHTS}, document, tsq, 1) AS score"
        f" FROM searchdoc, websearch_to_tsquery('{TS_CONFIG}', ?) AS tsq"
        f" WHERE document @@ tsq AND {where} ORDER BY parent, score DESC, id) AS best"
        " ORDER BY score DESC, parent LIMIT ?",
        [expression, *params, data["limit"]],
    ).fetchall()
    return expression, rows


def _require_words(expression):
    if expression is None:
        raise Invalid("query: has no word to search for", field="query")


def text_search(data, notebook_key):
    expression, rows = _ranked(data, notebook_key)
    snippets = _snippets(expression, [r[2] for r in rows])
    titles = _titles([r[0] for r in rows])
    return [
        _hit(parent, titles.get(parent), round(score, 6), "relevance", snippets.get(rid)) for parent, score, rid in rows
    ]


def text_passages(data, notebook_key, text_chars):
    """The best hits of a text search as [{id, title, text}] (the text cut to
    `text_chars`), in two queries: what /ask reads per search."""
    _, rows = _ranked(data, notebook_key)
    details = _details([r[0] for r in rows], text_chars)
    return [
        {"id": parent, "title": details.get(parent, ("", ""))[0] or "", "text": details.get(parent, ("", ""))[1] or ""}
        for parent, _, _ in rows
    ]


def _snippets(expression, rowids):
    """The passage of the body that matches best, for the hits only (snippet() over
    every candidate row would cost more than the ranking)."""
    if not rowids:
        return {}
    marks = ",".join("?" for _ in rowids)
    if is_sqlite():
        cursor = database.execute_sql(
            f"SELECT rowid, snippet(search_fts, -1, '', '', '…', 24) FROM search_fts"
            f" WHERE search_fts MATCH ? AND rowid IN ({marks})",
            [expression, *rowids],
        )
        return dict(cursor.fetchall())
    # The headline of the part that ranked best, read from the record's text (the
    # index keeps lexemes only).
    cursor = run_sql(
        database,
        f"SELECT d.id, ts_headline('{TS_CONFIG}', substr(COALESCE(s.full_text, n.content, ''), d.body_start + 1, ?),"
        f" websearch_to_tsquery('{TS_CONFIG}', ?), ?) FROM searchdoc d"
        " LEFT JOIN source s ON d.part = 'source' AND s.id = substr(d.parent, 8)"
        " LEFT JOIN note n ON d.part = 'note' AND n.id = substr(d.parent, 6)"
        f" WHERE d.id IN ({marks})",
        [PART_CHARS + PART_OVERLAP, expression, _PG_HEADLINE, *rowids],
    )
    return {rid: snippet.strip() for rid, snippet in cursor.fetchall()}


class VectorCache:
    """The vectors of the configured model, held in memory by each web worker and
    reloaded only when `Generation.vectors` says they changed: reading every vector
    from SQLite costs far more than the similarity arithmetic (~9 MB at 1000 sources)."""

    def __init__(self):
        self._lock = threading.Lock()  # gevent's in a patched worker: only greenlets read the cache
        self._key = None
        self._data = None

    def get(self, model_name, dim):
        """(parents, chunk ids or None for notes, matrix) of every vector of this model."""
        generation = vectors_generation()
        with self._lock:
            if self._key != (generation, model_name, dim):
                self._data = self._load(model_name, dim)
                self._key = (generation, model_name, dim)
            return self._data

    @staticmethod
    def _load(model_name, dim):
        import numpy as np

        rows = [
            (f"source:{s}", i, blob)
            for s, i, blob in Chunk.select(Chunk.source, Chunk.id, Chunk.embedding)
            .where((Chunk.embedding_model == model_name) & (Chunk.embedding_dim == dim))
            .tuples()
        ]
        rows += [
            (f"note:{k}", None, blob)
            for k, blob in Note.select(Note.id, Note.embedding)
            .where((Note.embedding_model == model_name) & (Note.embedding_dim == dim))
            .tuples()
        ]
        matrix = np.frombuffer(b"".join(r[2] for r in rows), dtype="<f4").reshape(len(rows), dim)
        return [r[0] for r in rows], [r[1] for r in rows], matrix


_cache = VectorCache()


def _allowed_parents(data, notebook_key):
    """A predicate on parents for the kinds and the notebook asked for."""
    kinds = tuple(k for k, wanted in (("source:", data["search_sources"]), ("note:", data["search_notes"])) if wanted)
    if not notebook_key:
        return lambda parent: parent.startswith(kinds)
    members = {
        f"source:{k}"
        for (k,) in SourceNotebook.select(SourceNotebook.source).where(SourceNotebook.notebook == notebook_key).tuples()
    }
    members |= {f"note:{k}" for (k,) in Note.select(Note.id).where(Note.notebook == notebook_key).tuples()}
    return lambda parent: parent in members and parent.startswith(kinds)


def _vector_search(data, notebook_key, config):
    """The database work here, in the request's greenlet; the CPU work (the query's
    embedding, a local model's first load, the similarity arithmetic) in the
    threadpool. A threadpool thread never takes a pooled connection: the pool's lock
    and condition are gevent's in a patched worker, and a native thread waiting on them
    deadlocked a burst of searches."""
    model = embeddings.default_embedder(config) or blocking(embeddings.env_embedder, config, 1)
    query = blocking(model.embed, [data["query"]])[0]
    parents, chunk_ids, matrix = _cache.get(model.name, len(query))
    if not parents:
        return []
    allowed = _allowed_parents(data, notebook_key)
    ranked = blocking(_most_similar, matrix, query, data["minimum_score"])
    best = {}
    for position, score in ranked:
        if len(best) >= data["limit"]:
            break
        parent = parents[position]
        if parent not in best and allowed(parent):
            best[parent] = (score, chunk_ids[position])
    texts = dict(
        Chunk.select(Chunk.id, Chunk.text).where(Chunk.id.in_([c for _, c in best.values() if c is not None])).tuples()
    )
    titles = _titles(list(best))
    return [
        _hit(
            parent,
            titles.get(parent),
            round(score, 6),
            "similarity",
            (texts.get(chunk_id) or "")[:300] if chunk_id else None,
        )
        for parent, (score, chunk_id) in best.items()
    ]


def _most_similar(matrix, query, minimum_score):
    """(row, score) of every vector at least `minimum_score` similar to `query`, best first."""
    import numpy as np

    scores = matrix @ query
    order = np.argsort(-scores)
    return [(int(position), float(scores[position])) for position in order if scores[position] >= minimum_score]


@bp.post("/search")
def search():
    """Search the sources and notes, optionally of one notebook: full text (BM25) or by vector similarity."""
    data = body(SearchRequest())
    if not data["search_sources"] and not data["search_notes"]:
        raise Invalid("search_sources and search_notes are both false: nothing to search")
    notebook_key = get_notebook(data["notebook_id"]).id if data.get("notebook_id") else None
    if data["type"] == "text":
        results = text_search(data, notebook_key)
    else:
        reason = embeddings.unavailable_reason(settings())
        if reason:
            raise Invalid(f"vector search needs an embedding model: {reason}")
        try:
            results = _vector_search(data, notebook_key, settings())
        except embeddings.EmbeddingUnavailable as exc:
            if exc.status != 400:  # the model is there, its provider failed
                raise ApiError(exc.status, f"vector search: {exc}") from None
            raise Invalid(f"vector search needs an embedding model: {exc}") from None
    return {"results": results, "total_count": len(results), "search_type": data["type"]}

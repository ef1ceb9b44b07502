"""POST /ask: a question answered from the notebook's sources and notes, streamed
as SSE records:

    {"type": "strategy", "reasoning", "searches": [{term, instructions}]}   (at most five)
    {"type": "answer", "term", "instructions", "content", "sources", "cited"}  (one per search with results)
    {"type": "final_answer", "content", "sources"}
    {"type": "complete", "final_answer"}          (the final answer's content again)

or, when something fails on the way, an `error` record ({message, detail, status})
that ends the stream. `/search/ask` (Open Notebook's path) is the same stream, and
`/search/ask/simple` answers `{answer, question}` at once. The
models are resolved (override, else the default chat model) before the stream
starts, so a missing one is a plain 400/404. Searches are full-text (BM25) over
the notebook (or everything); answers cite what they use by id."""

import re

from flask import Blueprint

from app.common.failures import ApiError, Failure, NotFound
from app.notebook import llm
from app.notebook.core import model_choice
from app.notebook.core.ids import key_of
from app.notebook.core.models import Notebook, database
from app.notebook.routes import streams
from app.notebook.routes.http import body, settings
from app.notebook.routes.payloads import AskRequest
from app.notebook.routes.search import text_passages

bp = Blueprint("ask", __name__)

MAX_SEARCHES = 5
RESULTS_PER_SEARCH = 5
CHARS_PER_RESULT = 4000
STRATEGY_PROMPT = (
    "You plan how to answer a question from a research notebook's sources. Reply with one JSON object and "
    'nothing else: {"reasoning": "<why these searches>", "searches": [{"term": "<words to search for>", '
    '"instructions": "<what to find out from the results>"}]} with one to five searches.'
)
ANSWER_PROMPT = (
    "Answer the instructions from the search results only. Cite every result you use by its id in brackets, "
    "for example [source:<id>]. If the results do not answer, say so."
)
FINAL_PROMPT = (
    "Write the final answer to the question from the partial answers. Keep their citations ([source:…], "
    "[note:…]) and add no fact they do not hold."
)
NO_RESULTS = "None of the notebook's sources or notes matched the searches, so there is nothing to answer from."
_CITATION = re.compile(r"\b(?:source|note):[a-z0-9]{1,64}\b")
_REQUEST = AskRequest()  # made once: a schema keeps no state between loads


@bp.post("/ask")
@bp.post("/search/ask")  # Open Notebook's path for the same stream
def ask():
    """Answer a question from the notebook's sources and notes, streamed as SSE records (strategy, answers, final
    answer)."""
    return streams.sse(_records(*_prepared()))


@bp.post("/search/ask/simple")
def ask_simple():
    """The same work without a stream: the final answer once it is written (Open
    Notebook's `ask_simple`). A failure on the way is that failure's status."""
    question, notebook_key, models = _prepared()
    try:
        final = next(r["content"] for r in _records(question, notebook_key, models) if r["type"] == "final_answer")
    except llm.ProviderError as exc:
        raise ApiError(exc.status, exc.message) from None
    return {"answer": final, "question": question}


def _prepared():
    """(question, notebook key or None, {field: resolved model}) of the request; the
    models are resolved before any stream starts, so a missing one is a plain 400/404."""
    data = body(_REQUEST)
    notebook_key = _notebook_key(data["notebook_id"]) if data.get("notebook_id") else None
    config = settings()
    resolved = {}  # one resolution per distinct model (usually all three are the default)
    models = {}
    for field in ("strategy_model", "answer_model", "final_answer_model"):
        override = data.get(field)
        if override not in resolved:
            resolved[override] = model_choice.resolve(config, "chat", override, field)
        models[field] = resolved[override]
    return data["question"], notebook_key, models


def _notebook_key(public_id):
    """The notebook's key, as get_notebook checks it (404 when there is none), in a
    raw query: peewee's get_or_none costs half a millisecond of CPU to build and read
    what SQLite answers in a few microseconds, and /ask is made to be cheap."""
    key = key_of("notebook", public_id)
    found = database.execute_sql(
        f'SELECT 1 FROM "{Notebook._meta.table_name}" WHERE "id" = {database.param}', [key]
    ).fetchone()
    if found is None:
        raise NotFound(f"notebook {public_id[:80]!r} not found")
    return key


def _records(question, notebook_key, models):
    plan = parse_plan(_call(models["strategy_model"], STRATEGY_PROMPT, question))
    yield {"type": "strategy", **plan}
    answers = []
    for search in plan["searches"]:
        results = _search(search["term"], notebook_key)
        if not results:
            continue
        content = _call(
            models["answer_model"],
            ANSWER_PROMPT,
            f"Instructions: {search['instructions']}\n\nSearch results:\n\n" + _render(results),
        )
        ids = [r["id"] for r in results]
        answer = {
            "type": "answer",
            "term": search["term"],
            "instructions": search["instructions"],
            "content": content,
            "sources": ids,
            "cited": _cited(content, ids),
        }
        answers.append(answer)
        yield answer
    final = _final(question, answers, models["final_answer_model"])
    yield final
    yield {"type": "complete", "final_answer": final["content"]}


def _final(question, answers, model):
    """Nothing found is said as it is: no model is asked to answer from nothing."""
    if not answers:
        return {"type": "final_answer", "content": NO_RESULTS, "sources": []}
    partial = "\n\n".join(f"Search {a['term']!r}: {a['content']}" for a in answers)
    content = _call(model, FINAL_PROMPT, f"Question: {question}\n\nPartial answers:\n\n{partial}")
    found = list(dict.fromkeys(i for a in answers for i in a["sources"]))
    return {"type": "final_answer", "content": content, "sources": found, "cited": _cited(content, found)}


def _call(resolved, system, user):
    return llm.chat(
        resolved.target, resolved.name, [{"role": "system", "content": system}, {"role": "user", "content": user}]
    )


def parse_plan(text):
    """The strategy model's JSON plan (the first object in its reply, fences and
    prose around it tolerated); ProviderError when there is none."""
    plan = llm.first_json_object(text)
    searches = plan.get("searches") if isinstance(plan, dict) else None
    if not isinstance(searches, list):
        raise llm.ProviderError(502, "the strategy model's answer is not a search plan (a JSON object with `searches`)")
    cleaned = []
    for item in searches:
        term = item.get("term") if isinstance(item, dict) else item
        if isinstance(term, str) and term.strip():
            instructions = item.get("instructions") if isinstance(item, dict) else None
            cleaned.append(
                {
                    "term": term.strip()[:300],
                    "instructions": (instructions if isinstance(instructions, str) else term).strip()[:2000],
                }
            )
    if not cleaned:
        raise llm.ProviderError(502, "the strategy model planned no search")
    reasoning = plan.get("reasoning")
    return {"reasoning": reasoning if isinstance(reasoning, str) else "", "searches": cleaned[:MAX_SEARCHES]}


def _search(term, notebook_key):
    """The best hits of `term` with their text (cut), as {id, title, text}."""
    with database.connection_context():
        try:
            return text_passages(
                {"query": term, "search_sources": True, "search_notes": True, "limit": RESULTS_PER_SEARCH},
                notebook_key,
                CHARS_PER_RESULT,
            )
        except Failure:  # no word to search for in the term
            return []


def _render(results):
    return "\n\n".join(f"[{r['id']}] {r['title']}\n{r['text']}" for r in results)


def _cited(text, allowed):
    """The ids `text` cites that are among `allowed` (a made-up id is not a citation)."""
    return [i for i in dict.fromkeys(_CITATION.findall(text)) if i in allowed]

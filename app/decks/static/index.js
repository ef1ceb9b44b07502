// Home page: the decks, the sessions, and the form that starts a session.
// All text from the API goes in through textContent (via el), never as HTML.
import { el, requestJSON } from "./review.js";

const $ = (id) => document.getElementById(id);

function formatTime(iso) {
  const date = new Date(iso);
  return el("time", {
    dateTime: iso || "",
    textContent: iso && !Number.isNaN(date.getTime()) ? date.toLocaleString() : String(iso || "unknown"),
  });
}

function plural(count, word) {
  return `${count} ${word}${count === 1 ? "" : "s"}`;
}

function showList(status, list, items) {
  status.hidden = true;
  list.replaceChildren(...items);
  list.hidden = false;
}

function showStatus(status, isError, ...content) {
  status.replaceChildren(...content);
  status.className = isError ? "error" : "muted";
  status.hidden = false;
}

async function loadDecks() {
  const status = $("decks-status");
  const select = $("start-deck");
  let decks;
  try {
    decks = await requestJSON("/api/decks");
  } catch (error) {
    showStatus(status, true, `Could not load the decks: ${error.message}`);
    select.replaceChildren(el("option", { value: "", textContent: "Decks could not be loaded" }));
    return;
  }
  if (!decks.length) {
    const example = `curl -X POST ${location.origin}/api/decks/import -H 'Content-Type: application/json' \\\n`
      + `  -d '{"id": "my-deck", "md_path": "sources/my-deck/deck.md", "copy_from": "sources/my-deck"}'`;
    showStatus(status, false,
      "No decks yet: import one with ", el("code", { textContent: "POST /api/decks/import" }),
      " (paths are relative to the service's data directory), for example:",
      el("pre", {}, el("code", { textContent: example })));
    select.replaceChildren(el("option", { value: "", textContent: "No decks yet" }));
    return;
  }
  showList(status, $("decks-list"), decks.map((deck) => el("li", { className: "card" },
    el("strong", { textContent: deck.title || deck.id }),
    el("span", { className: "muted" },
      el("code", { textContent: deck.id }), ` · ${plural(deck.slide_count ?? 0, "slide")} · imported `,
      formatTime(deck.imported_at)))));
  select.replaceChildren(...decks.map((deck) => el("option", {
    value: deck.id, textContent: deck.title && deck.title !== deck.id ? `${deck.title} (${deck.id})` : deck.id,
  })));
  select.disabled = false;
  $("start-submit").disabled = false;
}

async function loadSessions() {
  const status = $("sessions-status");
  let sessions;
  try {
    sessions = await requestJSON("/api/sessions");
  } catch (error) {
    showStatus(status, true, `Could not load the sessions: ${error.message}`);
    return;
  }
  if (!sessions.length) {
    showStatus(status, false, "No sessions yet: start one with the form above.");
    return;
  }
  showList(status, $("sessions-list"), sessions.map((session) => el("li", { className: "card" },
    el("a", { href: session.link, textContent: session.title || session.id }),
    el("span", { className: "muted" },
      "deck ", el("code", { textContent: session.deck_id }),
      ` · ${plural(session.last_seq ?? 0, "event")} · started `, formatTime(session.created_at)))));
}

const form = $("start-form");
form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const error = $("start-error");
  const button = $("start-submit");
  const deckId = $("start-deck").value;
  error.hidden = true;
  if (!deckId) {
    error.textContent = "Choose a deck first.";
    error.hidden = false;
    return;
  }
  const body = { deck_id: deckId };
  const title = $("start-title").value.trim();
  if (title) body.title = title; // left out: the server uses the deck's title
  button.disabled = true;
  try {
    const session = await requestJSON("/api/sessions", { method: "POST", body });
    location.assign(session.link);
  } catch (failure) {
    error.textContent = `Could not start the session: ${failure.message}`;
    error.hidden = false;
    button.disabled = false;
  }
});

loadDecks();
loadSessions();

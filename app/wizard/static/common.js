// Shared by every page: DOM helpers, the JSON API client, client error reports,
// and the live collection store (an /api/events message for a collection
// invalidates it, and every view that shows it queries it again).
//
// All text from the API goes into the page through textContent (via el), never as HTML.

export const $ = (id) => document.getElementById(id);
const identified = () => Boolean(document.body && document.body.dataset.user);

/** document.createElement with properties and children (strings become text nodes). */
export function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children.filter((child) => child !== null && child !== undefined && child !== false));
  return node;
}

export function me() {
  return { id: document.body.dataset.user || "", isAdmin: document.body.dataset.admin === "true" };
}

export function when(iso) {
  const date = new Date(iso);
  return el("time", {
    dateTime: iso || "",
    textContent: iso && !Number.isNaN(date.getTime()) ? date.toLocaleString() : String(iso || ""),
  });
}

/** Show a message in a status/alert node; an empty message hides it. */
export function say(node, message, kind = "error") {
  node.textContent = message || "";
  node.className = kind === "error" ? "error" : kind === "ok" ? "ok" : "muted";
  node.hidden = !message;
}

export function randomToken(bytes = 16) {
  const values = crypto.getRandomValues(new Uint8Array(bytes));
  return Array.from(values, (v) => v.toString(16).padStart(2, "0")).join("");
}

// ---- Client error reports ---------------------------------------------------

const MAX_REPORTS = 20;   // per page load: a failure in a loop must not flood the log
let reports = 0;
const reported = new Set();

export function reportError(type, message, stack = "") {
  if (!identified() || reports >= MAX_REPORTS) return;
  const key = `${type}|${message}`;
  if (reported.has(key)) return;
  reported.add(key);
  reports += 1;
  const body = JSON.stringify({
    type: String(type).slice(0, 100),
    message: String(message || "unknown error").slice(0, 2000),
    stack: `${location.pathname}\n${stack || ""}`.slice(0, 8000),
  });
  // Never through api(): a failed report must not report itself.
  fetch("/api/errors", { method: "POST", headers: { "Content-Type": "application/json" }, body, keepalive: true })
    .catch(() => { /* nowhere left to report to */ });
}

window.addEventListener("error", (event) => {
  const error = event.error;
  reportError("error", error && error.message ? error.message : event.message,
    error && error.stack ? error.stack : `${event.filename || ""}:${event.lineno || 0}:${event.colno || 0}`);
});
window.addEventListener("unhandledrejection", (event) => {
  const reason = event.reason;
  reportError("unhandledrejection", reason && reason.message ? reason.message : String(reason),
    reason && reason.stack ? reason.stack : "");
});

// ---- The JSON API -------------------------------------------------------------

export class ApiFailure extends Error {
  constructor(status, message, field) {
    super(message);
    this.status = status;
    this.field = field;
  }
}

/** fetch() an API route. Resolves to the parsed body (null for 204); rejects with an
 *  ApiFailure carrying the API's {"error"} message, or the HTTP status when the
 *  answer is not the service's JSON. Network failures and server errors (5xx, but
 *  not 503 "not configured") are reported to /api/errors. */
export async function api(url, { method = "GET", body, form } = {}) {
  const init = { method, headers: { Accept: "application/json" } };
  if (form !== undefined) {
    init.body = form;
  } else if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (error) {
    reportError("fetch", `${method} ${url}: network error`, String(error));
    throw new ApiFailure(0, "could not reach the service (network error)");
  }
  let data = null;
  if (response.status !== 204) {
    try { data = await response.json(); } catch { /* not JSON: the status says it */ }
  }
  if (!response.ok) {
    const message = data && typeof data.error === "string" ? data.error
      : `HTTP ${response.status} ${response.statusText || ""}`.trim();
    if (response.status >= 500 && response.status !== 503) {
      reportError("fetch", `${method} ${url}: ${response.status} ${message}`);
    }
    throw new ApiFailure(response.status, message, data && data.field);
  }
  return data;
}

// ---- Live collections -----------------------------------------------------------

const cache = new Map();     // "name?filter" -> Promise of rows
const views = new Set();

function cacheKey(name, filter) {
  return filter ? `${name}?${JSON.stringify(filter)}` : name;
}

/** The rows of a collection, newest first; one query per collection and filter until
 *  an event invalidates it. */
export function query(name, filter) {
  const key = cacheKey(name, filter);
  if (!cache.has(key)) {
    const url = `/api/collections/${encodeURIComponent(name)}`
      + (filter ? `?filter=${encodeURIComponent(JSON.stringify(filter))}` : "");
    const promise = api(url);
    promise.catch(() => cache.delete(key));   // a failure is not kept
    cache.set(key, promise);
  }
  return cache.get(key);
}

/** Drop the cached rows of these collections and run again the views that show them. */
export function invalidate(...names) {
  for (const key of [...cache.keys()]) {
    if (names.includes(key.split("?")[0])) cache.delete(key);
  }
  for (const view of views) {
    if (view.names.some((name) => names.includes(name))) view.run();
  }
}

/** A part of the page drawn from some collections: `draw()` runs now and again after
 *  each change of one of them. Runs never overlap; a change during a run schedules one more. */
export function view(names, draw) {
  const entry = { names, running: false, again: false };
  entry.run = async () => {
    if (entry.running) { entry.again = true; return; }
    entry.running = true;
    try {
      do {
        entry.again = false;
        try {
          await draw();
        } catch (error) {
          reportError("view", `drawing ${names.join(", ")}: ${error.message}`, error.stack);
        }
      } while (entry.again);
    } finally {
      entry.running = false;
    }
  };
  views.add(entry);
  ensureEvents();
  entry.run();
  return entry;
}

function setLive(state, text) {
  const node = $("live");
  if (!node) return;
  node.hidden = false;
  node.dataset.state = state;
  node.querySelector(".live-text").textContent = text;
}

let lost = false;   // the stream broke since it last opened: events may have been missed

function connectEvents() {
  const source = new EventSource("/api/events");
  source.onopen = () => {
    setLive("live", "Live");
    if (lost) {
      // Events sent while we were away are gone: everything shown may be stale.
      lost = false;
      invalidate(...new Set([...views].flatMap((v) => v.names)));
    }
  };
  source.onmessage = (message) => {
    let data;
    try { data = JSON.parse(message.data); } catch { return; }
    if (data && typeof data.collection === "string") invalidate(data.collection);
  };
  source.onerror = () => {
    lost = true;
    if (source.readyState === EventSource.CLOSED) {
      source.close();
      // The browser gave up (the server refused): try again a little later.
      setLive("off", "Offline, retrying…");
      setTimeout(connectEvents, 5000);
    } else {
      setLive("off", "Reconnecting…");
    }
  };
}

let connected = false;

/** Pages that show collections listen to /api/events (others, such as the 403 page, do not). */
function ensureEvents() {
  if (connected || !identified()) return;
  connected = true;
  setLive("connecting", "Connecting…");
  connectEvents();
}

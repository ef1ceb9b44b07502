// Review page: the deck's slides, the session's live event feed, forms for notes,
// tasks and verdicts, and the scribble overlay.
//
// The helpers exported at the top are pure (no DOM) so they can be unit-tested
// outside a browser; index.js reuses requestJSON and el. The page itself only
// starts when the review page's markup is present, so importing this module
// elsewhere has no side effects.

// Reconnect backoff of the event stream (spec 000 B, "Events"): start at 1 s,
// double after each failed attempt, never wait longer than 30 s.
export const FIRST_DELAY_S = 1;
export const MAX_DELAY_S = 30;

/** Seconds to wait before the next reconnect attempt. `previous` is the last
 *  wait, or 0 once a stream opened successfully (which resets the backoff). */
export function nextDelay(previous) {
  if (!(previous > 0)) return FIRST_DELAY_S;
  return Math.min(previous * 2, MAX_DELAY_S);
}

/** The stream cursor: the highest seq among the events held, 0 when none.
 *  The server replays everything past it, so nothing held is lost or needed. */
export function cursorOf(events) {
  let cursor = 0;
  for (const event of events) {
    if (event && Number.isInteger(event.seq) && event.seq > cursor) cursor = event.seq;
  }
  return cursor;
}

export function streamUrl(sessionId, cursor) {
  return `/api/sessions/${encodeURIComponent(sessionId)}/stream?after=${cursor}`;
}

const VERDICTS = { approve: "Approve", changes_requested: "Changes requested", reject: "Reject" };

/** {label, text} shown for an event in the feed (plain strings, never HTML). */
export function eventSummary(event) {
  switch (event.type) {
    case "note": return { label: "Note", text: event.text || "" };
    case "task": return { label: "Task", text: event.text || "" };
    case "task_done": return { label: "Task done", text: `Task #${event.task_seq} marked done` };
    case "verdict": return { label: `Verdict: ${VERDICTS[event.value] || event.value}`, text: event.text || "" };
    case "transcript":
      return { label: event.speaker ? `Transcript · ${event.speaker}` : "Transcript", text: event.text || "" };
    case "scribble": return { label: "Scribble", text: "" };
    default: return { label: String(event.type || "Event"), text: "" };
  }
}

/** fetch() a JSON API route. Resolves to the parsed body; rejects with an Error
 *  whose message is the API's {"error": ...}, or a plain HTTP status when the
 *  answer is not the service's JSON (for example a proxy's 502 or 413 page). */
export async function requestJSON(url, { method = "GET", body } = {}) {
  const init = { method, headers: { Accept: "application/json" } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch {
    throw new Error("could not reach the service (network error)");
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    // Not JSON: leave data null and report the status below.
  }
  if (!response.ok) {
    const message = data && typeof data.error === "string" ? data.error
      : `HTTP ${response.status} ${response.statusText || ""}`.trim();
    throw new Error(message);
  }
  return data;
}

/** document.createElement with properties and children (strings become text nodes). */
export function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

// localStorage throws in some privacy modes: the remembered name is only a nicety.
function remembered(key) {
  try { return localStorage.getItem(key) || ""; } catch { return ""; }
}
function remember(key, value) {
  try { localStorage.setItem(key, value); } catch { /* not remembered, that is all */ }
}

function showError(node, message) {
  node.textContent = message || "";
  node.hidden = !message;
}

function timeOf(ts) {
  const date = new Date(ts);
  return el("time", {
    dateTime: ts,
    textContent: Number.isNaN(date.getTime()) ? String(ts) : date.toLocaleTimeString(),
  });
}

function startReviewPage(root) {
  const $ = (id) => document.getElementById(id);
  const sessionId = root.dataset.sessionId;
  const deckId = root.dataset.deckId;
  const sessionUrl = `/api/sessions/${encodeURIComponent(sessionId)}`;

  // Events keyed by seq. Only the stream fills it (not our own POST answers), so
  // its highest seq is a cursor with no gap below it.
  const held = new Map();
  const doneTasks = new Set(); // seqs of tasks that have a task_done event
  let slides = [];
  let current = 0;

  // ---- Author name, remembered on this device --------------------------------
  const author = $("author");
  author.value = remembered("decks.author");
  function withAuthor(body) {
    const name = author.value.trim();
    remember("decks.author", name);
    if (name) body.author = name;
    return body;
  }

  // ---- Slides -----------------------------------------------------------------
  const slideBox = $("slide");
  const notesBox = $("notes");

  function indexFromHash() {
    const match = /^#slide-(\d+)$/.exec(location.hash);
    return match ? Number(match[1]) - 1 : 0;
  }

  function show(index) {
    if (!slides.length) return;
    const target = Math.max(0, Math.min(index, slides.length - 1));
    if (target !== current) saveDraft();
    current = target;
    const slide = slides[current];
    // slide.html is rendered by the server from Markdown with raw HTML disabled
    // and image sources rewritten to the deck's assets: the one trusted HTML here.
    slideBox.innerHTML = slide.html;
    slideBox.scrollTop = 0;
    notesBox.textContent = slide.notes || "No speaker notes.";
    notesBox.classList.toggle("muted", !slide.notes);
    $("position").textContent =
      `Slide ${current + 1} of ${slides.length}${slide.title ? `: ${slide.title}` : ""}`;
    $("prev").disabled = current === 0;
    $("next").disabled = current === slides.length - 1;
    for (const span of document.querySelectorAll(".current-slide")) span.textContent = current + 1;
    $("verdict-scope-slide").textContent = `This slide (${current + 1})`;
    // replaceState: a link to the slide without one history entry per slide.
    history.replaceState(null, "", `#slide-${current + 1}`);
    for (const item of $("feed").children) {
      item.classList.toggle("here", item.dataset.slide === String(current));
    }
    renderOverlays();
    restoreDraft();
  }

  async function loadDeck() {
    try {
      const deck = await requestJSON(`/api/decks/${encodeURIComponent(deckId)}`);
      slides = Array.isArray(deck.slides) ? deck.slides : [];
    } catch (error) {
      slideBox.replaceChildren();
      showError($("slide-error"), `Could not load deck ${deckId}: ${error.message}`);
      return;
    }
    if (!slides.length) {
      slideBox.replaceChildren(el("p", { textContent: "This deck has no slides." }));
      return;
    }
    current = -1; // nothing shown yet: no draft to save
    show(indexFromHash());
  }

  $("prev").addEventListener("click", () => show(current - 1));
  $("next").addEventListener("click", () => show(current + 1));
  window.addEventListener("hashchange", () => show(indexFromHash()));
  document.addEventListener("keydown", (event) => {
    if (event.defaultPrevented || event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) return;
    // Arrow keys belong to the text field, select or radio group that has focus.
    const target = event.target;
    if (target instanceof Element && target.closest("input, textarea, select, [contenteditable]")) return;
    if (event.key === "ArrowLeft") show(current - 1);
    else if (event.key === "ArrowRight") show(current + 1);
    else return;
    event.preventDefault();
  });

  // ---- Feed ---------------------------------------------------------------------
  const feed = $("feed");
  const feedError = $("feed-error");

  function slideButton(index) {
    const button = el("button", { type: "button", className: "link", textContent: `slide ${index + 1}` });
    button.addEventListener("click", () => show(index));
    return button;
  }

  function scribbleUrl(file) {
    return `${sessionUrl}/scribbles/${encodeURIComponent(file)}`;
  }

  function taskControls(task) {
    const box = el("p", { className: "task-state" });
    if (doneTasks.has(task.seq)) {
      box.append("Done ✓");
      return box;
    }
    const button = el("button", { type: "button", className: "small", textContent: "Mark done" });
    button.addEventListener("click", async () => {
      button.disabled = true;
      showError(feedError, "");
      try {
        // The task_done event comes back through the stream and updates this item.
        await requestJSON(`${sessionUrl}/events`, {
          method: "POST", body: withAuthor({ type: "task_done", task_seq: task.seq }),
        });
      } catch (error) {
        showError(feedError, `Task #${task.seq}: ${error.message}`);
        button.disabled = false;
      }
    });
    box.append("Open ", button);
    return box;
  }

  function feedItem(event) {
    const { label, text } = eventSummary(event);
    const item = el("li", { className: `event event-${event.type}` });
    item.dataset.seq = event.seq;
    const meta = el("p", { className: "event-meta" }, el("strong", { textContent: label }));
    if (Number.isInteger(event.slide)) {
      item.dataset.slide = event.slide;
      item.classList.toggle("here", event.slide === current);
      meta.append(" · ", slideButton(event.slide));
    } else if (event.type === "verdict") {
      meta.append(" · whole deck");
    }
    if (event.author) meta.append(" · ", el("span", { className: "author", textContent: event.author }));
    if (event.ts) meta.append(" · ", timeOf(event.ts));
    meta.append(" ", el("span", { className: "seq", textContent: `#${event.seq}` }));
    item.append(meta);
    if (text) item.append(el("p", { className: "event-text", textContent: text }));
    if (event.type === "scribble" && event.file) {
      const width = 160;
      const height = event.width && event.height ? Math.round((width * event.height) / event.width) : 90;
      const thumb = el("img", {
        src: scribbleUrl(event.file), width, height, loading: "lazy",
        alt: `Scribble on slide ${event.slide + 1}`,
      });
      item.append(el("a", { className: "thumb", href: scribbleUrl(event.file), target: "_blank" }, thumb));
    }
    if (event.type === "task") {
      if (doneTasks.has(event.seq)) item.classList.add("done");
      item.append(taskControls(event));
    }
    return item;
  }

  function markTaskDone(taskSeq) {
    doneTasks.add(taskSeq);
    const item = feed.querySelector(`li[data-seq="${taskSeq}"]`);
    if (item && !item.classList.contains("done")) {
      item.classList.add("done");
      item.querySelector(".task-state")?.replaceChildren("Done ✓");
    }
  }

  function receive(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return; // not an event record
    }
    // A reconnect may replay what we already hold: seq identifies an event.
    if (!event || !Number.isInteger(event.seq) || held.has(event.seq)) return;
    held.set(event.seq, event);
    if (event.type === "task_done" && Number.isInteger(event.task_seq)) markTaskDone(event.task_seq);
    // Newest first: before the first item with a lower seq (the top one, in a replay).
    const before = [...feed.children].find((item) => Number(item.dataset.seq) < event.seq);
    feed.insertBefore(feedItem(event), before || null);
    $("feed-empty").hidden = true;
    if (event.type === "scribble" && event.slide === current) renderOverlays();
  }

  // ---- Live stream with our own reconnect ----------------------------------------
  const conn = $("conn");
  const STATES = { connecting: "Connecting…", live: "Live", reconnecting: "Disconnected, reconnecting" };

  function setState(state, wait) {
    conn.dataset.state = state;
    // Only the state word is a live region: the countdown would be read every second.
    if ($("conn-state").textContent !== STATES[state]) $("conn-state").textContent = STATES[state];
    $("conn-wait").textContent = state === "reconnecting" ? `in ${wait} s` : "";
    $("conn-retry").hidden = state !== "reconnecting";
  }

  function connect() {
    let source = null; // the open EventSource, null while waiting to reconnect
    let delay = 0;     // the last backoff wait in seconds; 0 after a good open
    let timer = 0;
    let ticker = 0;

    function open() {
      clearTimeout(timer);
      clearInterval(ticker);
      setState("connecting");
      const es = new EventSource(streamUrl(sessionId, cursorOf(held.values())));
      source = es;
      es.onopen = () => {
        delay = 0;
        setState("live");
      };
      // Event records carry no `event:` name, so every one arrives as "message".
      es.onmessage = (message) => {
        delay = 0;
        receive(message.data);
      };
      // Any failure, and the server ending the stream (after a ": closed: ..."
      // comment, which EventSource never shows us), arrive here. Close at once so
      // the browser's own retry (fixed delay, Last-Event-ID) never runs, and come
      // back with our backoff and cursor instead.
      es.onerror = () => {
        es.close();
        if (source !== es) return;
        source = null;
        wait();
      };
    }

    function wait() {
      delay = nextDelay(delay);
      // Up to half a step more, at random (never past the ceiling): after a server
      // restart, every open page would otherwise come back in the same instant.
      const pause = Math.min(MAX_DELAY_S, delay * (1 + Math.random() / 2));
      let left = Math.ceil(pause);
      setState("reconnecting", left);
      ticker = setInterval(() => setState("reconnecting", (left = Math.max(0, left - 1))), 1000);
      timer = setTimeout(open, pause * 1000);
    }

    const now = () => { if (!source) open(); };
    $("conn-retry").addEventListener("click", now);
    window.addEventListener("online", now); // the network is back: no need to sit out the wait
    open();
  }

  // ---- Notes, tasks and verdicts ---------------------------------------------------
  async function postEvent(form, body, done) {
    const error = form.querySelector(".error");
    const status = form.querySelector("[role=status]");
    const buttons = form.querySelectorAll("button");
    showError(error, "");
    status.textContent = "Saving…";
    buttons.forEach((button) => { button.disabled = true; });
    try {
      const event = await requestJSON(`${sessionUrl}/events`, { method: "POST", body });
      status.textContent = `Saved as #${event.seq}.`;
      done();
    } catch (failure) {
      status.textContent = "";
      showError(error, failure.message);
    } finally {
      buttons.forEach((button) => { button.disabled = false; });
    }
  }

  const commentForm = $("comment-form");
  commentForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const type = event.submitter && event.submitter.value === "task" ? "task" : "note";
    const textBox = $("comment-text");
    const text = textBox.value.trim();
    if (!slides.length) return showError($("comment-error"), "The deck is not loaded: there is no slide to comment on.");
    if (!text) return showError($("comment-error"), `Write the ${type} first.`);
    postEvent(commentForm, withAuthor({ type, slide: current, text }), () => { textBox.value = ""; });
  });

  const verdictForm = $("verdict-form");
  verdictForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const choice = verdictForm.querySelector('input[name="value"]:checked');
    if (!choice) return showError($("verdict-error"), "Choose approve, changes requested or reject.");
    const body = { type: "verdict", value: choice.value };
    if ($("verdict-scope").value === "slide") {
      if (!slides.length) return showError($("verdict-error"), "The deck is not loaded: choose the whole deck.");
      body.slide = current;
    }
    const text = $("verdict-text").value.trim();
    if (text) body.text = text;
    postEvent(verdictForm, withAuthor(body), () => { $("verdict-text").value = ""; });
  });

  // ---- Scribbles -------------------------------------------------------------------
  const stage = $("stage");
  const pad = $("pad");
  const pen = pad.getContext("2d");
  const drawButton = $("draw");
  const overlays = $("overlays");
  const showScribbles = $("show-scribbles");
  const scribbleStatus = $("scribble-status");
  const scribbleError = $("scribble-error");
  const drafts = new Map(); // slide index -> data URL of an unsent drawing
  let drawing = false;      // draw mode: the canvas takes pointer input
  let dirty = false;        // something drawn since the last clear or send
  let stroke = null;        // {id, x, y} of the pointer drawing now

  // The backing store follows the stage's size in device pixels. The stage keeps a
  // fixed aspect ratio, so a scribble lines up with the slide on every screen.
  function fitCanvas() {
    const ratio = window.devicePixelRatio || 1;
    const width = Math.round(stage.clientWidth * ratio);
    const height = Math.round(stage.clientHeight * ratio);
    if (!width || !height || (width === pad.width && height === pad.height)) return;
    let copy = null; // resizing a canvas wipes it: keep the drawing, scaled
    if (dirty) {
      copy = el("canvas", { width: pad.width, height: pad.height });
      copy.getContext("2d").drawImage(pad, 0, 0);
    }
    pad.width = width;
    pad.height = height;
    if (copy) pen.drawImage(copy, 0, 0, width, height);
  }
  new ResizeObserver(fitCanvas).observe(stage);

  function point(event) {
    const box = pad.getBoundingClientRect();
    return {
      x: ((event.clientX - box.left) * pad.width) / box.width,
      y: ((event.clientY - box.top) * pad.height) / box.height,
    };
  }

  function lineWidth(event) {
    const scale = pad.width / (pad.clientWidth || 1);
    // Pens report pressure; mouse and touch report a constant, so ignore it there.
    const pressure = event.pointerType === "pen" && event.pressure > 0 ? 0.5 + event.pressure : 1;
    return 3 * scale * pressure;
  }

  pad.addEventListener("pointerdown", (event) => {
    if (!drawing || stroke || (event.pointerType === "mouse" && event.button !== 0)) return;
    event.preventDefault();
    pad.setPointerCapture(event.pointerId); // keep the stroke when it leaves the canvas
    stroke = { id: event.pointerId, ...point(event) };
    pen.fillStyle = $("pen-color").value;
    pen.beginPath();
    pen.arc(stroke.x, stroke.y, lineWidth(event) / 2, 0, 2 * Math.PI); // a tap leaves a dot
    pen.fill();
    dirty = true;
  });

  pad.addEventListener("pointermove", (event) => {
    if (!stroke || event.pointerId !== stroke.id) return;
    // Browsers batch fast moves into one event: the coalesced ones keep curves smooth.
    const moves = event.getCoalescedEvents ? event.getCoalescedEvents() : [];
    pen.strokeStyle = $("pen-color").value;
    pen.lineCap = pen.lineJoin = "round";
    for (const move of moves.length ? moves : [event]) {
      const next = point(move);
      pen.lineWidth = lineWidth(move);
      pen.beginPath();
      pen.moveTo(stroke.x, stroke.y);
      pen.lineTo(next.x, next.y);
      pen.stroke();
      Object.assign(stroke, next);
    }
  });

  const endStroke = (event) => { if (stroke && event.pointerId === stroke.id) stroke = null; };
  pad.addEventListener("pointerup", endStroke);
  pad.addEventListener("pointercancel", endStroke);

  // Draw mode is a toggle so that, when off, the slide can be scrolled, its text
  // selected and its links followed (touch-action: none would block scrolling).
  drawButton.addEventListener("click", () => {
    drawing = !drawing;
    drawButton.setAttribute("aria-pressed", String(drawing));
    stage.classList.toggle("drawing", drawing);
  });

  function clearPad() {
    pen.clearRect(0, 0, pad.width, pad.height);
    dirty = false;
    stroke = null;
  }

  $("scribble-clear").addEventListener("click", () => {
    clearPad();
    drafts.delete(current);
    showError(scribbleError, "");
    scribbleStatus.textContent = "Cleared.";
  });

  // An unsent drawing stays with the slide it was drawn on while you look at others.
  function saveDraft() {
    if (dirty) drafts.set(current, pad.toDataURL("image/png"));
    else drafts.delete(current);
  }

  function restoreDraft() {
    clearPad();
    const url = drafts.get(current);
    if (!url) return;
    const slideIndex = current;
    const image = new Image();
    image.onload = () => {
      if (current !== slideIndex) return;
      pen.drawImage(image, 0, 0, pad.width, pad.height);
      dirty = true;
    };
    image.src = url;
  }

  function renderOverlays() {
    const images = [];
    if (showScribbles.checked) {
      for (const event of held.values()) {
        if (event.type === "scribble" && event.slide === current && event.file) {
          images.push(el("img", { src: scribbleUrl(event.file), alt: "", decoding: "async" }));
        }
      }
    }
    overlays.replaceChildren(...images);
  }
  showScribbles.addEventListener("change", renderOverlays);

  const sendButton = $("scribble-send");
  sendButton.addEventListener("click", async () => {
    showError(scribbleError, "");
    if (!slides.length) return showError(scribbleError, "The deck is not loaded: there is no slide to scribble on.");
    if (!dirty) return showError(scribbleError, "Nothing to send: turn on Draw and draw on the slide first.");
    const slideIndex = current;
    sendButton.disabled = true;
    scribbleStatus.textContent = "Sending…";
    try {
      const event = await requestJSON(`${sessionUrl}/scribble`, {
        method: "POST", body: withAuthor({ image: pad.toDataURL("image/png"), slide: slideIndex }),
      });
      if (current === slideIndex) clearPad();
      drafts.delete(slideIndex);
      scribbleStatus.textContent = `Scribble sent as #${event.seq}.`;
    } catch (error) {
      scribbleStatus.textContent = "";
      showError(scribbleError, error.message);
    } finally {
      sendButton.disabled = false;
    }
  });

  loadDeck();
  connect();
}

if (typeof document !== "undefined") {
  const root = document.getElementById("review");
  if (root) startReviewPage(root);
}

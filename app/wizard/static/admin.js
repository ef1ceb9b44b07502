// Admin: the database viewer (the seven collections, newest first, with a filter),
// LLM logs and timings, and admin prompts editing.
import { $, api, el, query, say, view, when } from "./common.js";

const COLLECTIONS = [...document.querySelectorAll("#collections [data-collection]")].map((b) => b.dataset.collection);
let selected = COLLECTIONS[0];
let filter = null;

function cell(value) {
  if (value === null || value === undefined) return el("td", { className: "muted", textContent: "—" });
  if (typeof value === "object") return el("td", {}, el("pre", { textContent: JSON.stringify(value, null, 2) }));
  return el("td", { textContent: String(value) });
}

function clipped(text, limit = 240) {
  const value = String(text ?? "");
  if (value.length <= limit) return el("span", { className: "pre", textContent: value });
  return el("details", {}, el("summary", { textContent: `${value.slice(0, limit)}…` }),
    el("span", { className: "pre", textContent: value }));
}

// ---- Database viewer ---------------------------------------------------------------

function select(name) {
  selected = name;
  for (const button of document.querySelectorAll("#collections [data-collection]")) {
    button.setAttribute("aria-pressed", String(button.dataset.collection === name));
  }
  rowsView.run();
}

for (const button of document.querySelectorAll("#collections [data-collection]")) {
  button.addEventListener("click", () => select(button.dataset.collection));
}

view(COLLECTIONS, async () => {
  await Promise.all(COLLECTIONS.map(async (name) => {
    const node = document.querySelector(`[data-count-of="${name}"]`);
    try {
      const rows = await query(name);
      node.textContent = String(rows.length);
      node.title = `${rows.length} rows`;
    } catch {
      node.textContent = "!";
      node.title = "could not be read";
    }
  }));
});

const SERVER_FIELDS = ["id", "created_at", "user_id"];

const rowsView = view(COLLECTIONS, async () => {
  const name = selected;
  const status = $("rows-status");
  const table = $("rows");
  let rows;
  try {
    rows = await query(name, filter);
  } catch (failure) {
    table.replaceChildren();
    say(status, `Could not read ${name}: ${failure.message}`);
    return;
  }
  if (name !== selected) return;   // another collection was chosen meanwhile
  const extra = [];
  for (const row of rows) {
    for (const key of Object.keys(row)) {
      if (!SERVER_FIELDS.includes(key) && !extra.includes(key)) extra.push(key);
    }
  }
  const columns = [...SERVER_FIELDS.filter((key) => rows.some((row) => key in row)), ...extra];
  const head = el("tr", {}, ...columns.map((key) => el("th", { scope: "col", textContent: key })),
    el("th", { scope: "col" }, el("span", { className: "visually-hidden", textContent: "Actions" })));
  const body = rows.map((row) => {
    const actions = el("td", {});
    if (name !== "likes") {
      const remove = el("button", { type: "button", className: "small danger", textContent: "Delete" });
      remove.setAttribute("aria-label", `Delete row ${row.id} of ${name}`);
      remove.addEventListener("click", async () => {
        if (!confirm(`Delete row ${row.id} of ${name}?`)) return;
        try {
          await api(`/api/collections/${name}/${encodeURIComponent(row.id)}`, { method: "DELETE" });
        } catch (failure) {
          say(status, `Could not delete: ${failure.message}`);
        }
      });
      actions.append(remove);
    }
    const tr = el("tr", {}, ...columns.map((key) => cell(row[key])), actions);
    tr.dataset.id = row.id;
    return tr;
  });
  table.replaceChildren(el("caption", { className: "visually-hidden", textContent: `Rows of ${name}, newest first` }),
    el("thead", {}, head), el("tbody", {}, ...body));
  say(status, `${name}: ${rows.length} ${rows.length === 1 ? "row" : "rows"}, newest first`
    + (filter ? `, filtered by ${JSON.stringify(filter)}` : ""), "muted");
});

$("filter-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("filter").value.trim();
  if (!text) { filter = null; rowsView.run(); return; }
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch {
    say($("rows-status"), 'The filter is not JSON: write it like {"user_id": "public"}.');
    return;
  }
  if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) {
    say($("rows-status"), "The filter must be a JSON object.");
    return;
  }
  filter = parsed;   // the API checks the keys and answers what is wrong
  rowsView.run();
});

$("filter-clear").addEventListener("click", () => {
  $("filter").value = "";
  filter = null;
  rowsView.run();
});

// ---- LLM logs -------------------------------------------------------------------------

function timingText(timing) {
  if (!timing) return "—";
  return `total ${timing.totalMs} ms (queue ${timing.queueMs}, attempts ${timing.attemptMs} ×${timing.attempts}, repair ${timing.repairMs})`;
}

view(["llm_logs"], async () => {
  const status = $("logs-status");
  let rows;
  try {
    rows = await query("llm_logs");
  } catch (failure) {
    say(status, `Could not load the logs: ${failure.message}`);
    return;
  }
  const shown = rows.slice(0, 50);
  const head = el("tr", {}, ...["When", "User", "Type", "Kind", "Model", "Timing", "Result"].map(
    (label) => el("th", { scope: "col", textContent: label })));
  $("logs").replaceChildren(el("thead", {}, head), el("tbody", {}, ...shown.map((row) => {
    const image = row.type === "image";
    const model = image ? `${row.provider || "?"} · ${row.model || "?"} · ${row.aspect_ratio || ""}`
      : `${row.requested_model || "?"} → ${row.resolved_model || "?"}`;
    const result = image && typeof row.url === "string" && row.url.startsWith("/uploads/")
      ? el("td", {}, el("a", { href: row.url }, el("img", { className: "thumb", src: row.url, alt: `Generated for: ${String(row.context || "").slice(0, 100)}`, loading: "lazy" })))
      : el("td", {}, clipped(row.content));
    return el("tr", {}, el("td", {}, when(row.created_at)), cell(row.user_id), cell(row.type), cell(row.kind || row.template_key),
      cell(model), cell(image ? "—" : timingText(row.timing)), result);
  })));
  say(status, rows.length ? (rows.length > shown.length ? `The latest ${shown.length} of ${rows.length}.` : "")
    : "No AI calls logged yet.", "muted");
});

// ---- LLM timings ------------------------------------------------------------------------

const timingsView = view(["llm_logs"], async () => {
  const status = $("timings-status");
  let rows;
  try {
    rows = await api("/api/admin/llm-timings");
  } catch (failure) {
    say(status, `Could not load the timings: ${failure.message}`);
    return;
  }
  const columns = [["created_at", "When"], ["user_id", "User"], ["kind", "Kind"], ["template_key", "Template"],
    ["requested_model", "Requested model"], ["resolved_model", "Resolved model"], ["queue_ms", "Queue ms"],
    ["attempt_ms", "Attempt ms"], ["repair_ms", "Repair ms"], ["total_ms", "Total ms"], ["attempts", "Attempts"],
    ["outcome", "Outcome"]];
  $("timings").replaceChildren(
    el("thead", {}, el("tr", {}, ...columns.map(([, label]) => el("th", { scope: "col", textContent: label })))),
    el("tbody", {}, ...rows.map((row) => {
      const tr = el("tr", {}, ...columns.map(([key]) => {
        if (key === "created_at") return el("td", {}, when(row.created_at));
        if (key === "outcome") {
          return el("td", { className: row.outcome === "ok" ? "ok" : "error", textContent: row.error ? `${row.outcome}: ${row.error}` : row.outcome });
        }
        const td = cell(row[key]);
        if (key.endsWith("_ms") || key === "attempts") td.className = "num";
        return td;
      }));
      return tr;
    })));
  say(status, rows.length ? "" : "No JSON text calls yet.", "muted");
});

$("timings-refresh").addEventListener("click", () => timingsView.run());

// ---- Admin prompts ---------------------------------------------------------------------

function promptEditor(row) {
  const keyId = `prompt-key-${row.id}`;
  const textId = `prompt-text-${row.id}`;
  const error = el("p", { className: "error", role: "alert", hidden: true });
  const keyInput = el("input", { id: keyId, type: "text", value: row.key || "", maxLength: 200, autocomplete: "off" });
  const textInput = el("textarea", { id: textId, rows: 3, value: typeof row.text === "string" ? row.text : "", maxLength: 50000 });
  const save = el("button", { type: "submit", className: "small", textContent: "Save" });
  const remove = el("button", { type: "button", className: "small danger", textContent: "Delete" });
  remove.setAttribute("aria-label", `Delete the admin prompt ${row.key || row.id}`);
  save.setAttribute("aria-label", `Save the admin prompt ${row.key || row.id}`);
  const form = el("form", { className: "stack", noValidate: true },
    el("div", { className: "field" }, el("label", { htmlFor: keyId, textContent: "Key" }), keyInput),
    el("div", { className: "field" }, el("label", { htmlFor: textId, textContent: "Text" }), textInput),
    el("div", { className: "card-actions" }, save, remove,
      el("span", { className: "hint" }, "created ", when(row.created_at))),
    error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = keyInput.value.trim();
    if (!key) { say(error, "The key must not be empty."); keyInput.focus(); return; }
    save.disabled = true;
    try {
      await api(`/api/collections/admin_prompts/${encodeURIComponent(row.id)}`, {
        method: "PATCH", body: { key, text: textInput.value },
      });
      say(error, "");
    } catch (failure) {
      say(error, `Could not save: ${failure.message}`);
    } finally {
      save.disabled = false;
    }
  });
  remove.addEventListener("click", async () => {
    if (!confirm(`Delete the admin prompt ${row.key || row.id}?`)) return;
    try {
      await api(`/api/collections/admin_prompts/${encodeURIComponent(row.id)}`, { method: "DELETE" });
    } catch (failure) {
      say(error, `Could not delete: ${failure.message}`);
    }
  });
  const item = el("li", { className: "entry" }, form);
  item.dataset.id = row.id;
  return item;
}

view(["admin_prompts"], async () => {
  const status = $("prompts-status");
  let rows;
  try {
    rows = await query("admin_prompts");
  } catch (failure) {
    say(status, `Could not load the admin prompts: ${failure.message}`);
    return;
  }
  // Keep an editor someone is typing in: redraw only when no field of the list has focus.
  const list = $("admin-prompts");
  if (list.contains(document.activeElement)) {
    const ids = rows.map((r) => r.id).join();
    if (ids === [...list.children].map((li) => li.dataset.id).join()) return;
  }
  list.replaceChildren(...rows.map(promptEditor));
  say(status, rows.length ? "" : "No admin prompts yet: the pages use their built-in texts.", "muted");
});

$("new-prompt-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const error = $("new-prompt-error");
  const key = $("new-prompt-key").value.trim();
  const text = $("new-prompt-text").value;
  if (!key) { say(error, "Give the prompt a key, for example ideas.system."); $("new-prompt-key").focus(); return; }
  if (!text.trim()) { say(error, "Write the prompt's text."); $("new-prompt-text").focus(); return; }
  try {
    await api("/api/collections/admin_prompts", { method: "POST", body: { key, text } });
    event.target.reset();
    say(error, "");
  } catch (failure) {
    say(error, `Could not add the prompt: ${failure.message}`);
  }
});

// Library: the caller's saved prompts and prompt history (the shared `public` ones
// when anonymous), with copy, save and delete.
import { $, api, el, me, query, say, view, when } from "./common.js";

const error = $("library-error");

function entry(name, row, extra = []) {
  const title = row.title || row.wizard_name || "Prompt";
  const copy = el("button", { type: "button", className: "small secondary", textContent: "Copy" });
  copy.setAttribute("aria-label", `Copy the prompt ${title}`);
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(row.prompt || "");
      copy.textContent = "Copied";
    } catch {
      say(error, "Could not copy automatically: select the text and press Ctrl+C.");
    }
  });
  const remove = el("button", { type: "button", className: "small danger", textContent: "Delete" });
  remove.setAttribute("aria-label", `Delete ${name === "saved_prompts" ? "the saved prompt" : "the history entry"} ${title}`);
  remove.addEventListener("click", async () => {
    remove.disabled = true;
    try {
      await api(`/api/collections/${name}/${encodeURIComponent(row.id)}`, { method: "DELETE" });
      say(error, "");
    } catch (failure) {
      remove.disabled = false;
      say(error, `Could not delete: ${failure.message}`);
    }
  });
  const item = el("li", { className: "entry" },
    el("div", { className: "entry-head" },
      el("strong", { textContent: title }),
      el("span", { className: "hint" }, when(row.created_at))),
    el("p", { className: "prompt", textContent: row.prompt || "" }),
    row.wizard_name && row.title ? el("p", { className: "hint", textContent: `from the wizard ${row.wizard_name}` }) : null,
    el("div", { className: "card-actions" }, copy, ...extra, remove));
  item.dataset.id = row.id;
  return item;
}

function listView(name, listId, statusId, countId, empty, extra) {
  view([name], async () => {
    let rows;
    try {
      // Own rows only: administrators could read everyone's (the admin page shows those).
      rows = await query(name, { user_id: me().id });
    } catch (failure) {
      say($(statusId), `Could not load: ${failure.message}`);
      return;
    }
    $(listId).replaceChildren(...rows.map((row) => entry(name, row, extra ? extra(row) : [])));
    $(countId).textContent = `(${rows.length})`;
    say($(statusId), rows.length ? "" : empty, "muted");
  });
}

listView("saved_prompts", "saved", "saved-status", "saved-count",
  "Nothing saved yet: build a prompt on the home page and save it.");
listView("prompt_history", "history", "history-status", "history-count",
  "No history yet: each prompt you build on the home page is kept here.", (row) => {
    const save = el("button", { type: "button", className: "small", textContent: "Save" });
    save.setAttribute("aria-label", `Save ${row.wizard_name || "this prompt"} to the library`);
    save.addEventListener("click", async () => {
      save.disabled = true;
      try {
        await api("/api/collections/saved_prompts", {
          method: "POST",
          body: {
            title: `${row.wizard_name || "Prompt"}: ${(row.prompt || "").slice(0, 60)}`,
            prompt: row.prompt || "", wizard_id: row.wizard_id || null, wizard_name: row.wizard_name || "",
          },
        });
        save.textContent = "Saved";
      } catch (failure) {
        save.disabled = false;
        say(error, `Could not save: ${failure.message}`);
      }
    });
    return [save];
  });

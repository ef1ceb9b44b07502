// Blueprints gallery: covers, likes (count and the caller's liked state), and a form
// that uploads a cover and creates a blueprint.
import { $, api, el, me, query, say, view } from "./common.js";

function likeButton(blueprint, liked) {
  const button = el("button", { type: "button", className: "like" });
  const draw = (isLiked, count) => {
    button.setAttribute("aria-pressed", String(isLiked));
    button.replaceChildren(el("span", { className: "heart", textContent: isLiked ? "♥" : "♡", ariaHidden: "true" }),
      el("span", { className: "like-label", textContent: isLiked ? "Liked" : "Like" }),
      el("span", { className: "like-count", textContent: String(count) }));
    button.setAttribute("aria-label",
      `${isLiked ? "Unlike" : "Like"} ${blueprint.title || "this blueprint"} (${count} ${count === 1 ? "like" : "likes"})`);
  };
  draw(liked, blueprint.likes_count || 0);
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const answer = await api("/api/likes/toggle", { method: "POST", body: { blueprint_id: blueprint.id } });
      draw(answer.liked, answer.likes_count);
    } catch (error) {
      say($("gallery-status"), `Could not change the like: ${error.message}`);
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

function card(blueprint, liked) {
  const title = blueprint.title || "(untitled blueprint)";
  const cover = typeof blueprint.cover_url === "string" && blueprint.cover_url.startsWith("/uploads/")
    ? el("img", { className: "cover", src: blueprint.cover_url, alt: `Cover of ${title}`, loading: "lazy" })
    : el("div", { className: "cover no-cover", textContent: "No cover" });
  const owner = blueprint.user_id === me().id ? "yours" : blueprint.user_id ? `by ${blueprint.user_id}` : "shared";
  const actions = el("div", { className: "card-actions" }, likeButton(blueprint, liked));
  if (blueprint.user_id === me().id || me().isAdmin) {
    const remove = el("button", { type: "button", className: "small danger", textContent: "Delete" });
    remove.setAttribute("aria-label", `Delete the blueprint ${title}`);
    remove.addEventListener("click", async () => {
      if (!confirm(`Delete the blueprint "${title}"?`)) return;
      try {
        await api(`/api/collections/blueprints/${encodeURIComponent(blueprint.id)}`, { method: "DELETE" });
      } catch (error) {
        say($("gallery-status"), `Could not delete the blueprint: ${error.message}`);
      }
    });
    actions.append(remove);
  }
  const item = el("li", { className: "blueprint" }, cover,
    el("div", { className: "blueprint-body" },
      el("h3", { textContent: title }),
      blueprint.description ? el("p", { textContent: blueprint.description }) : null,
      el("p", { className: "hint", textContent: `${owner}${blueprint.is_public ? " · public" : ""}` }),
      actions));
  item.dataset.id = blueprint.id;
  return item;
}

view(["blueprints", "likes"], async () => {
  const status = $("gallery-status");
  let blueprints;
  let likes;
  try {
    [blueprints, likes] = await Promise.all([query("blueprints"), query("likes", { user_id: me().id })]);
  } catch (error) {
    say(status, `Could not load the blueprints: ${error.message}`);
    return;
  }
  const liked = new Set(likes.map((like) => like.blueprint_id));
  // What every visitor sees: global, public and own (administrators could read private ones of others too).
  blueprints = blueprints.filter((b) => !b.user_id || b.is_public === true || b.user_id === me().id);
  $("gallery").replaceChildren(...blueprints.map((b) => card(b, liked.has(b.id))));
  say(status, blueprints.length ? "" : "No blueprints yet: create the first one above.", "muted");
});

const coverInput = $("blueprint-cover");
coverInput.addEventListener("change", () => {
  const preview = $("cover-preview");
  const file = coverInput.files[0];
  say($("blueprint-error"), "");
  if (preview.src) URL.revokeObjectURL(preview.src);
  if (file && file.type.startsWith("image/")) {
    preview.src = URL.createObjectURL(file);
    preview.hidden = false;
  } else {
    preview.removeAttribute("src");
    preview.hidden = true;
  }
});

$("blueprint-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const error = $("blueprint-error");
  const status = $("blueprint-status");
  const title = $("blueprint-title").value.trim();
  say(status, "");
  if (!title) { say(error, "Give the blueprint a title."); $("blueprint-title").focus(); return; }
  say(error, "");
  const button = $("blueprint-submit");
  button.disabled = true;
  try {
    const body = { title, description: $("blueprint-description").value.trim(), is_public: $("blueprint-public").checked };
    const file = coverInput.files[0];
    if (file) {
      say(status, "Uploading the cover…", "muted");
      const form = new FormData();
      form.append("file", file);
      try {
        body.cover_url = (await api("/api/uploads", { method: "POST", form })).url;
      } catch (failure) {
        say(status, "");
        say(error, `The cover image was not accepted: ${failure.message}`);
        coverInput.focus();
        return;
      }
    }
    await api("/api/collections/blueprints", { method: "POST", body });
    event.target.reset();
    coverInput.dispatchEvent(new Event("change"));
    say(status, `Blueprint "${title}" created.`, "ok");
  } catch (failure) {
    say(status, "");
    say(error, `Could not create the blueprint: ${failure.message}`);
  } finally {
    button.disabled = false;
  }
});

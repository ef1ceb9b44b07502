// Home: the wizards, the step-by-step form that builds a prompt, save to library,
// and AI generation (ideas with live thoughts, images).
import { $, api, el, me, query, randomToken, say, view } from "./common.js";

const IDEAS_SYSTEM = "You help people develop prompts. Answer with JSON only, exactly of this shape: "
  + '{"ideas": [{"title": "...", "description": "..."}]}, with 5 or 6 distinct ideas. '
  + "Each title is a few words; each description one or two sentences.";
// This page's thoughts channel: the server relays our generations' streamed text to it.
const THOUGHTS_TAB = randomToken(16);

let wizards = [];
let current = null;        // {wizard, index, answers}
let builtFrom = null;      // the wizard the prompt in the box was built from

// ---- Wizards ----------------------------------------------------------------------

function placeholders(template) {
  const names = [];
  for (const match of String(template || "").matchAll(/\{([A-Za-z][A-Za-z0-9_]{0,39})\}/g)) {
    if (!names.includes(match[1])) names.push(match[1]);
  }
  return names;
}

function stepsOf(wizard) {
  if (Array.isArray(wizard.steps) && wizard.steps.length) {
    return wizard.steps.filter((step) => step && typeof step.id === "string");
  }
  // A wizard with a template only: each placeholder is a free-text question.
  return placeholders(wizard.template).map((id) => ({ id, label: id, question: `${id}?`, kind: "text" }));
}

function wizardCard(wizard) {
  const mine = wizard.user_id === me().id;
  const label = mine ? "yours" : wizard.user_id ? `shared by ${wizard.user_id}` : "built in";
  const start = el("button", {
    type: "button", className: "small", textContent: current && current.wizard.id === wizard.id ? "Restart" : "Start",
  });
  start.setAttribute("aria-label", `Start the wizard ${wizard.name || "(unnamed)"}`);
  start.addEventListener("click", () => startWizard(wizard));
  const actions = el("div", { className: "card-actions" }, start);
  if (mine) {
    const remove = el("button", { type: "button", className: "small danger", textContent: "Delete" });
    remove.setAttribute("aria-label", `Delete the wizard ${wizard.name || "(unnamed)"}`);
    remove.addEventListener("click", async () => {
      if (!confirm(`Delete the wizard "${wizard.name}"?`)) return;
      try {
        await api(`/api/collections/wizards/${encodeURIComponent(wizard.id)}`, { method: "DELETE" });
      } catch (error) {
        say($("wizards-status"), `Could not delete the wizard: ${error.message}`);
      }
    });
    actions.append(remove);
  }
  return el("li", { className: "card" + (current && current.wizard.id === wizard.id ? " selected" : "") },
    el("div", { className: "card-head" },
      el("strong", { textContent: wizard.name || "(unnamed wizard)" }),
      el("span", { className: "tag", textContent: wizard.category || label })),
    wizard.description ? el("span", { className: "muted", textContent: wizard.description }) : null,
    el("span", { className: "hint", textContent: `${stepsOf(wizard).length} steps · ${label}` }),
    actions);
}

const wizardsView = view(["wizards"], async () => {
  const status = $("wizards-status");
  try {
    wizards = await query("wizards");
  } catch (error) {
    say(status, `Could not load the wizards: ${error.message}`);
    return;
  }
  const own = wizards.filter((w) => w.user_id === me().id);
  // Built-in and shared ones (administrators could read private ones of others too).
  const shared = wizards.filter((w) => w.user_id !== me().id && (!w.user_id || w.is_public === true));
  const lists = [];
  if (shared.length) {
    lists.push(el("h3", { textContent: "Shared wizards" }), el("ul", { className: "cards" }, ...shared.map(wizardCard)));
  }
  lists.push(el("h3", { textContent: "Your wizards" }), own.length
    ? el("ul", { className: "cards", id: "own-wizards" }, ...own.map(wizardCard))
    : el("p", { className: "muted", textContent: "None yet: make your own below." }));
  $("wizards-lists").replaceChildren(...lists);
  say(status, wizards.length ? "" : "No wizards yet.", "muted");
});

$("new-wizard-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const error = $("new-wizard-error");
  const name = $("new-wizard-name").value.trim();
  const template = $("new-wizard-template").value.trim();
  const ids = placeholders(template);
  if (!name) { say(error, "Give the wizard a name."); $("new-wizard-name").focus(); return; }
  if (!ids.length) {
    say(error, "The template needs at least one {placeholder}, for example {topic}.");
    $("new-wizard-template").focus();
    return;
  }
  say(error, "");
  const steps = ids.map((id) => {
    const label = id.replace(/_/g, " ").replace(/^./, (c) => c.toUpperCase());
    return { id, label, question: `${label}?`, kind: "text" };
  });
  try {
    const created = await api("/api/collections/wizards", {
      method: "POST",
      body: {
        name, description: $("new-wizard-description").value.trim(), category: "custom",
        steps, template, is_public: $("new-wizard-public").checked,
      },
    });
    event.target.reset();
    startWizard(created);
  } catch (failure) {
    say(error, `Could not create the wizard: ${failure.message}`);
  }
});

// ---- Steps --------------------------------------------------------------------------

function startWizard(wizard) {
  current = { wizard, index: 0, answers: {} };
  $("steps-empty").hidden = true;
  $("steps-form").hidden = false;
  showStep();
  wizardsView.run();   // marks the chosen one
  const field = $("step-field").querySelector("input, textarea");
  if (field) field.focus();
}

function showStep() {
  const steps = stepsOf(current.wizard);
  const step = steps[current.index];
  const last = current.index === steps.length - 1;
  $("step-wizard").textContent = current.wizard.name || "Wizard";
  $("step-count").textContent = `· step ${current.index + 1} of ${steps.length}`;
  $("step-progress").replaceChildren(...steps.map((s, i) => {
    const item = el("li", { textContent: s.label || s.id, className: i < current.index ? "done" : i === current.index ? "now" : "" });
    if (i === current.index) item.setAttribute("aria-current", "step");
    return item;
  }));
  const inputId = `step-input-${current.index}`;
  const value = current.answers[step.id] || "";
  let field;
  if (step.kind === "choice" && Array.isArray(step.options) && step.options.length) {
    field = el("fieldset", { className: "choices" },
      el("legend", { textContent: step.question || step.label }),
      ...step.options.map((option, i) => {
        const radio = el("input", { type: "radio", name: "step-choice", value: option, id: `${inputId}-${i}` });
        radio.checked = value ? value === option : i === 0;
        return el("label", { className: "choice", htmlFor: radio.id }, radio, String(option));
      }));
  } else {
    const input = el("textarea", { id: inputId, rows: 3, maxLength: 8000, value });
    input.addEventListener("keydown", (event) => {
      // Enter alone adds a line; Ctrl+Enter (or Cmd+Enter) goes to the next step.
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        $("steps-form").requestSubmit();
      }
    });
    field = el("div", { className: "field" },
      el("label", { htmlFor: inputId, textContent: step.question || step.label }),
      input,
      el("p", { className: "hint", textContent: "Ctrl+Enter goes to the next step." }));
  }
  $("step-field").replaceChildren(field);
  $("step-back").disabled = current.index === 0;
  $("step-next").textContent = last ? "Build prompt" : "Next";
  say($("step-error"), "");
}

function readAnswer() {
  const step = stepsOf(current.wizard)[current.index];
  const checked = $("step-field").querySelector("input[type=radio]:checked");
  const input = $("step-field").querySelector("textarea");
  const value = (checked ? checked.value : input ? input.value : "").trim();
  current.answers[step.id] = value;
  return value;
}

$("step-back").addEventListener("click", () => {
  readAnswer();
  current.index = Math.max(0, current.index - 1);
  showStep();
  focusStep();
});

function focusStep() {
  const field = $("step-field").querySelector("textarea, input:checked, input");
  if (field) field.focus();
}

$("steps-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  if (!readAnswer()) {
    say($("step-error"), "Answer this step to go on.");
    focusStep();
    return;
  }
  const steps = stepsOf(current.wizard);
  if (current.index < steps.length - 1) {
    current.index += 1;
    showStep();
    focusStep();
    return;
  }
  await buildPrompt();
});

function fill(template, answers) {
  return String(template || "").replace(/\{([A-Za-z][A-Za-z0-9_]{0,39})\}/g,
    (whole, id) => (id in answers ? answers[id] : whole));
}

async function buildPrompt() {
  const { wizard, answers } = current;
  const steps = stepsOf(wizard);
  const prompt = wizard.template ? fill(wizard.template, answers)
    : steps.map((s) => `${s.label || s.id}: ${answers[s.id]}`).join("\n");
  builtFrom = wizard;
  $("prompt-text").value = prompt;
  const first = answers[steps[0].id] || "";
  $("prompt-title").value = `${wizard.name || "Prompt"}: ${first}`.slice(0, 120);
  $("prompt-text").focus();
  const status = $("save-status");
  try {
    await api("/api/collections/prompt_history", {
      method: "POST",
      body: { prompt, wizard_id: wizard.id, wizard_name: wizard.name || "", answers },
    });
    say(status, "Prompt built and added to your history.", "ok");
  } catch (error) {
    say(status, `Prompt built, but it could not be added to your history: ${error.message}`);
  }
}

// ---- Save and copy --------------------------------------------------------------------

$("save-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const status = $("save-status");
  const prompt = $("prompt-text").value.trim();
  if (!prompt) { say(status, "There is no prompt to save yet."); $("prompt-text").focus(); return; }
  const title = $("prompt-title").value.trim() || prompt.slice(0, 80);
  const button = $("save-prompt");
  button.disabled = true;
  try {
    await api("/api/collections/saved_prompts", {
      method: "POST",
      body: { title, prompt, wizard_id: builtFrom ? builtFrom.id : null, wizard_name: builtFrom ? builtFrom.name || "" : "" },
    });
    say(status, `Saved to your library as "${title}".`, "ok");
  } catch (error) {
    say(status, `Could not save the prompt: ${error.message}`);
  } finally {
    button.disabled = false;
  }
});

$("copy-prompt").addEventListener("click", async () => {
  const status = $("save-status");
  try {
    await navigator.clipboard.writeText($("prompt-text").value);
    say(status, "Copied.", "ok");
  } catch {
    $("prompt-text").select();
    say(status, "Could not copy automatically: the prompt is selected, press Ctrl+C.", "muted");
  }
});

// ---- Generation ---------------------------------------------------------------------------

async function adminPrompt(key) {
  try {
    const rows = await query("admin_prompts");
    const row = rows.find((r) => r.key === key && typeof r.text === "string" && r.text.trim());
    return row ? row.text : null;
  } catch {
    return null;   // the built-in text then
  }
}

function unavailable(error, what) {
  if (error.status === 503) {
    $("generate-ideas").disabled = what === "ideas" || $("generate-ideas").disabled;
    $("generate-image").disabled = what === "image" || $("generate-image").disabled;
    return `${what === "ideas" ? "Idea" : "Image"} generation is unavailable on this server: ${error.message}`;
  }
  return null;
}

function promptOrComplain() {
  const prompt = $("prompt-text").value.trim();
  if (!prompt) {
    say($("generate-status"), "Build or write a prompt first.");
    $("prompt-text").focus();
  }
  return prompt;
}

// This page's thoughts stream, opened at the first generation and kept open: the
// relayed text may arrive after the generation's own answer, so it is never cut short.
let thoughtsSource = null;
let thoughtsOpen = null;
let thoughtsFor = null;   // the requestId whose text is shown

function onThought(message) {
  let data;
  try { data = JSON.parse(message.data); } catch { return; }
  if (!data || data.requestId !== thoughtsFor) return;
  const piece = typeof data.text === "string" ? data.text : typeof data.reasoning === "string" ? data.reasoning : "";
  const box = $("thoughts");
  box.append(piece);
  box.scrollTop = box.scrollHeight;
}

/** Show the thoughts of `requestId`; resolves once the stream listens (so that no early
 *  chunk is missed), or after 3 s without it: the generation goes ahead either way. */
function listenToThoughts(requestId) {
  thoughtsFor = requestId;
  $("thoughts").textContent = "";
  $("thoughts-box").hidden = false;
  if (!thoughtsSource || thoughtsSource.readyState === EventSource.CLOSED) {
    thoughtsSource = new EventSource(`/api/ai/thoughts/${THOUGHTS_TAB}`);
    thoughtsSource.onmessage = onThought;
    thoughtsOpen = new Promise((resolve) => thoughtsSource.addEventListener("open", resolve, { once: true }));
  }
  return Promise.race([thoughtsOpen, new Promise((resolve) => { setTimeout(resolve, 3000); })]);
}

$("generate-ideas").addEventListener("click", async () => {
  const prompt = promptOrComplain();
  if (!prompt) return;
  const button = $("generate-ideas");
  const status = $("generate-status");
  const requestId = randomToken(8);
  button.disabled = true;
  say(status, "Generating ideas…", "muted");
  $("ideas-box").hidden = true;
  try {
    await listenToThoughts(requestId);
    const system = (await adminPrompt("ideas.system")) || IDEAS_SYSTEM;
    const answer = await api("/api/ai/text", {
      method: "POST",
      body: {
        system, json: true, kind: "ideas", templateKey: "wizard.ideas", requestId, thoughtsTab: THOUGHTS_TAB,
        messages: [{ role: "user", content: `Suggest 5 or 6 distinct ideas that develop or vary this prompt:\n\n${prompt}` }],
      },
    });
    const ideas = JSON.parse(answer.content).ideas;
    showIdeas(ideas);
    const seconds = answer.timing ? ` in ${(answer.timing.totalMs / 1000).toFixed(1)} s` : "";
    say(status, `${ideas.length} ideas${seconds}.`, "ok");
    button.disabled = false;
  } catch (error) {
    const message = unavailable(error, "ideas");
    say(status, message || `Could not generate ideas: ${error.message}`);
    if (!message) button.disabled = false;
    if (message) $("thoughts-box").hidden = true;
  }
});

function showIdeas(ideas) {
  $("ideas").replaceChildren(...ideas.map((idea, i) => {
    const use = el("button", { type: "button", className: "small secondary", textContent: "Use" });
    use.setAttribute("aria-label", `Use idea ${i + 1} in the prompt`);
    use.addEventListener("click", () => {
      const box = $("prompt-text");
      box.value = `${box.value.trim()}\n\nIdea: ${idea.title}. ${idea.description}`.trim();
      box.focus();
    });
    return el("li", { className: "idea" },
      el("strong", { textContent: String(idea.title ?? "") }),
      el("p", { textContent: String(idea.description ?? "") }),
      use);
  }));
  $("ideas-box").hidden = false;
}

$("generate-image").addEventListener("click", async () => {
  const prompt = promptOrComplain();
  if (!prompt) return;
  const button = $("generate-image");
  const status = $("generate-status");
  const aspectRatio = $("aspect-ratio").value;
  button.disabled = true;
  say(status, "Generating the image…", "muted");
  try {
    const body = { subject: prompt.slice(0, 2000), aspectRatio, kind: "wizard-image", requestId: randomToken(8) };
    const system = await adminPrompt("image.system");
    if (system) body.system = system;
    const answer = await api("/api/ai/image", { method: "POST", body });
    const image = $("image");
    image.alt = `Generated image for: ${prompt.slice(0, 200)}`;
    image.src = answer.url;
    $("image-caption").replaceChildren(`${aspectRatio} · ${answer.provider} · ${answer.model} · `,
      el("a", { href: answer.url, textContent: "open the WebP" }));
    $("image-box").hidden = false;
    say(status, "Image generated.", "ok");
    button.disabled = false;
  } catch (error) {
    const message = unavailable(error, "image");
    say(status, message || `Could not generate the image: ${error.message}`);
    if (!message) button.disabled = false;
  }
});

// The fxworker chat page: plain JS, no build step.
//
// One NDJSON stream per session (GET /v1/sessions/{id}/stream?cursor=N) stays open and
// renders every line. Each rendered line is kept in sessionStorage with its cursor, so a
// dropped connection reconnects from the last cursor, and a reload redraws what it had and
// continues from there: no line is shown twice.
"use strict";

const $ = (id) => document.getElementById(id);
// Where the app is mounted ("" at the root, "/fx" under app.mount("/fx", create_app(...))).
const ROOT = location.pathname.replace(/\/[^/]*$/, "");
const params = new URLSearchParams(location.search);
let sessionId = params.get("session");
// The agent of a new session (`?agent=<name>`): a server that runs several agents and none
// called `default` refuses a new session that names none (FX_UNKNOWN_AGENT).
const agentName = params.get("agent");
let cursor = 0;
let lines = [];
let controller = null;
let retryMs = 250;
let openTurn = null; // the messageId of the turn that runs now (between its start and its end)
const turns = new Map(); // messageId -> {root, body, texts: Map(step -> element), tools: Map(id -> element), paused}

function token() { return localStorage.getItem("fx.token") || ""; }
function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token()) h["Authorization"] = "Bearer " + token();
  return h;
}
function setStatus(state, text) { const s = $("status"); s.dataset.state = state; s.textContent = text || state; }

// How a turn ended, in words (the stop reason stays in data-stop).
const STOP_LABELS = {
  end_turn: "done", cancelled: "stopped", error: "failed", refused: "refused",
  max_output_tokens: "cut at the output limit", max_model_turns: "stopped at the model-turn limit", unknown: "ended",
};

// While a turn runs, the form steers it and Stop cancels it. A parked turn (it waits for a
// decision on a tool call, or `parked` "handed": only for the agents its calls went to) is
// still open: Stop ends it, and what is typed waits behind it.
function setOpenTurn(messageId, parked) {
  openTurn = messageId;
  $("stop").hidden = !messageId;
  $("send").textContent = messageId ? "Steer" : "Send";
  $("prompt").placeholder = !messageId
    ? "Ask the agent… (try: look up the weather in Lisbon, slowly — or: send a note to Ana)"
    : parked === "handed"
      ? "The answer waits for the agents it handed the work to… (what you send now waits for it)"
      : parked
        ? "The answer waits for a decision above… (what you send now waits for it)"
        : "Steer the running answer… (it joins at the next step)";
}
function newMessageId() { return "web_" + Date.now().toString(36) + Math.random().toString(36).slice(2, 8); }
function sessionPath() { return ROOT + "/v1/sessions/" + encodeURIComponent(sessionId); }
function storageKey(kind) { return "fx." + kind + "." + sessionId; }

function save() {
  try {
    sessionStorage.setItem(storageKey("lines"), JSON.stringify(lines));
    sessionStorage.setItem(storageKey("cursor"), String(cursor));
  } catch (e) {
    // Storage full: forget the copy; a reload then redraws from the start of the stream.
    sessionStorage.removeItem(storageKey("lines"));
    sessionStorage.removeItem(storageKey("cursor"));
  }
}

function restore() {
  const stored = sessionStorage.getItem(storageKey("lines"));
  const storedCursor = Number(sessionStorage.getItem(storageKey("cursor")) || "0");
  if (!stored) return;
  lines = JSON.parse(stored);
  for (const line of lines) render(line);
  cursor = storedCursor;
  $("cursor").textContent = String(cursor);
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function turnFor(messageId) {
  let t = turns.get(messageId);
  if (!t) {
    const root = el("section", "turn");
    root.dataset.messageId = messageId;
    const body = el("div", "assistant");
    root.appendChild(body);
    $("transcript").appendChild(root);
    t = { root, body, texts: new Map(), tools: new Map(), lastText: null, paused: null };
    turns.set(messageId, t);
  }
  return t;
}

function promptText(input) {
  if (typeof input === "string") return input;
  if (Array.isArray(input)) return input.map((b) => (b.type === "text" ? b.text : "[" + b.type + "]")).join(" ");
  return "";
}

function appendText(t, line, cls) {
  // One element per model step, so a retracted step can be removed whole.
  const key = cls + ":" + (line.step === undefined ? "" : line.step);
  let span = t.texts.get(key);
  if (!span || t.lastText !== span) {
    span = el("div", cls);
    span.dataset.step = line.step === undefined ? "" : String(line.step);
    t.body.appendChild(span);
    t.texts.set(key, span);
  }
  span.textContent += line.delta;
  t.lastText = span;
}

// A call the turn waits on: its box (from its approval_request line) carries the buttons that
// decide it (POST /v1/sessions/{id}/calls/{callId}). The buttons go once a later line answers
// the call (its approval_decision or tool_end, or the turn's end), so a reload that replays the
// stream shows them only for calls that still wait.
function decisionButton(cls, label, onClick) {
  const b = el("button", cls, label);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

function decisionControls(box, line) {
  const row = el("div", "decide");
  if (line.kind === "external") {
    const field = el("input", "decide-result");
    field.type = "text";
    field.placeholder = "the result";
    field.setAttribute("aria-label", "the result of " + line.name);
    field.addEventListener("keydown", (event) => {
      if (event.key === "Enter") { event.preventDefault(); decide(box, line.id, { type: "result", result: field.value }); }
    });
    row.appendChild(field);
    row.appendChild(decisionButton("submit", "Submit", () => decide(box, line.id, { type: "result", result: field.value })));
  } else {
    row.appendChild(decisionButton("approve", "Approve", () => decide(box, line.id, { type: "approve" })));
  }
  row.appendChild(decisionButton("deny", "Deny", () => decide(box, line.id, { type: "deny" })));
  return row;
}

function setControls(box, enabled) {
  for (const c of box.querySelectorAll(".decide button, .decide input")) c.disabled = !enabled;
}

function decisionStatus(box, text, state) {
  let status = box.querySelector(".decision-status");
  if (!status) {
    status = el("div", "decision-status");
    status.setAttribute("role", "status");
    box.appendChild(status);
  }
  status.textContent = text;
  status.dataset.state = state;
}

const DENIAL = "The user denied this tool call"; // fxengine.conversation.denied()
const DECISION_SENT = { approve: "approved", deny: "denied", result: "result sent" };

async function decide(box, callId, decision) {
  if (box.dataset.settled) return;
  setControls(box, false);
  decisionStatus(box, "sending…", "sending");
  let response, body;
  try {
    response = await fetch(sessionPath() + "/calls/" + encodeURIComponent(callId), {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(Object.assign({}, decision, { messageId: newMessageId() })),
    });
    body = await response.json().catch(() => ({}));
  } catch (e) {
    // Not sent (or its answer was lost): the buttons come back; a second try that finds the
    // first one stored is told so (FX_DECISION_REPEATED).
    if (box.dataset.settled) return;
    decisionStatus(box, "not sent: " + e.message, "error");
    setControls(box, true);
    return;
  }
  if (box.dataset.settled) return; // a stream line answered the call meanwhile: it says how
  if (response.status === 401) {
    askToken();
    decisionStatus(box, "not sent: the page needs an API token", "error");
    setControls(box, true);
    return;
  }
  if (response.ok) {
    box.dataset.decision = decision.type;
    decisionStatus(box, DECISION_SENT[decision.type] + ": the turn goes on", "sent");
    return;
  }
  const error = body.error || {};
  box.dataset.decision = "refused";
  if (error.code === "FX_DECISION_REPEATED") {
    decisionStatus(box, "already decided: someone else answered this call first", "repeated");
  } else {
    decisionStatus(box, (error.code || "HTTP " + response.status) + (error.message ? ": " + error.message : ""), "error");
  }
}

// The call no longer waits: its buttons go, and `text` (how it was decided) replaces the
// note and any status of the page's own click.
function settleCall(t, box, text) {
  if (!box.dataset.settled) {
    box.dataset.settled = "1";
    box.classList.remove("waiting");
    const controls = box.querySelector(".decide");
    if (controls) controls.remove();
  }
  if (text) {
    const note = box.querySelector(".note");
    if (note) note.textContent = text;
    const status = box.querySelector(".decision-status");
    if (status) status.remove();
  }
  if (t.paused && !t.body.querySelector(".tool.waiting")) { t.paused.remove(); t.paused = null; }
}

function decisionText(line) {
  const by = line.by ? " by " + line.by : "";
  if (line.decision === "approve") return "approved" + by;
  if (line.decision === "deny") return "denied" + by + (line.reason ? ": " + line.reason : "");
  if (line.decision === "result" && typeof line.by === "string" && line.by.startsWith("agent:")) {
    return "answered by agent " + line.by.slice("agent:".length); // a delegated call's child turn
  }
  if (line.decision === "result") return "result given" + by;
  return String(line.decision) + by;
}

// Every line type of fxengine/lines.py (LINE_TYPES) has its case here: tests/web/test_line_types.py.
function render(line) {
  const t = line.messageId ? turnFor(line.messageId) : null;
  switch (line.type) {
    case "turn_start": {
      const user = el("div", "user", line.input === undefined ? "(prompt)" : promptText(line.input));
      t.root.insertBefore(user, t.body);
      setOpenTurn(line.messageId);
      break;
    }
    case "turn_resume":
      for (const step of line.retract || []) {
        for (const span of t.body.querySelectorAll('[data-step="' + step + '"]')) span.remove();
      }
      if (line.interrupted) {
        t.body.appendChild(el("div", "resumed", "↻ resumed on another worker after an interruption"));
      }
      t.lastText = null;
      setOpenTurn(line.messageId);
      break;
    case "user_message":
      t.body.appendChild(el("div", "user", line.text));
      t.lastText = null;
      break;
    case "text_delta": appendText(t, line, "text"); break;
    case "reasoning_delta": appendText(t, line, "reasoning"); break;
    case "tool_start": {
      const waited = t.tools.get(line.id);
      if (waited && waited.dataset.kind) { // an approved call runs: in the box that asked for it
        settleCall(t, waited, waited.dataset.settled ? null : "approved");
        t.lastText = null;
        break;
      }
      const box = el("div", "tool");
      box.dataset.toolId = line.id;
      box.appendChild(el("div", "", "→ " + line.name));
      box.appendChild(el("pre", "", line.inputTruncated ? line.inputPreview + "…" : JSON.stringify(line.input)));
      t.body.appendChild(box);
      t.tools.set(line.id, box);
      t.lastText = null;
      break;
    }
    case "approval_request": {
      // A call the turn parks on until a person approves it (or a client submits its result).
      const box = el("div", "tool waiting");
      box.dataset.toolId = line.id;
      box.dataset.kind = line.kind;
      box.appendChild(el("div", "", "→ " + line.name));
      box.appendChild(el("pre", "", line.inputTruncated ? line.inputPreview + "…" : JSON.stringify(line.input)));
      if (line.delegate) {
        // Another agent's turn answers it (its delegate_start names the session): nothing to decide here.
        box.dataset.delegate = line.delegate;
        box.appendChild(el("div", "note", "waiting for agent " + line.delegate));
      } else {
        box.appendChild(el("div", "note", line.kind === "external" ? "waiting for the client's result" : "waiting for approval"));
        box.appendChild(decisionControls(box, line));
      }
      t.body.appendChild(box);
      t.tools.set(line.id, box);
      t.lastText = null;
      break;
    }
    case "approval_decision": {
      const box = t.tools.get(line.id);
      if (box && box.dataset.kind) settleCall(t, box, decisionText(line));
      else t.body.appendChild(el("div", "note decision", line.name + ": " + decisionText(line)));
      t.lastText = null;
      break;
    }
    case "tool_end": {
      const box = t.tools.get(line.id) || t.body.appendChild(el("div", "tool"));
      const content = typeof line.content === "string" ? line.content : JSON.stringify(line.content ?? "");
      if (box.dataset.kind && !box.dataset.settled) {
        // No approval_decision line before it (a stream written before there were any): the
        // engine's words for a denial say what happened.
        settleCall(t, box, content.startsWith(DENIAL) ? "denied: " + content.slice(DENIAL.length).replace(/^:\s*/, "") : "answered");
      }
      if (line.isError) box.classList.add("error");
      box.appendChild(el("pre", "result", "← " + content));
      t.lastText = null;
      break;
    }
    case "turn_pause": {
      // The turn parks until its calls are decided; it is not over (no turn_end yet).
      if (t.paused) t.paused.remove();
      const n = (line.pendingCalls || []).length;
      const waiting = [...t.body.querySelectorAll(".tool.waiting")];
      const handed = waiting.length > 0 && waiting.every((box) => box.dataset.delegate);
      t.paused = el("div", "paused", (handed ? "waiting for the agents it handed the work to" : "waiting for a decision")
        + (n > 1 ? " on " + n + " calls" : ""));
      t.body.appendChild(t.paused);
      if (!t.body.querySelector(".tool.waiting")) { t.paused.remove(); t.paused = null; } // decided already
      t.lastText = null;
      setOpenTurn(line.messageId, handed ? "handed" : true);
      break;
    }
    case "turn_end": {
      for (const box of t.tools.values()) {
        if (box.dataset.kind && !box.dataset.settled) settleCall(t, box, "not decided: the turn ended");
      }
      if (t.paused) { t.paused.remove(); t.paused = null; }
      const err = line.error ? " · " + (line.error.code || "") + " " + (line.error.message || "") : "";
      // A typed turn's answer: the validated object, as JSON.
      if ("output" in line) t.body.appendChild(el("pre", "output", JSON.stringify(line.output, null, 2)));
      const end = el("div", "end", (STOP_LABELS[line.stopReason] || line.stopReason) + err);
      end.dataset.stop = line.stopReason;
      t.body.appendChild(end);
      t.lastText = null;
      if (openTurn === line.messageId) setOpenTurn(null);
      break;
    }
    case "delegate_start": {
      // The call went to a turn of another agent, in a session of its own: a link opens it here.
      const box = t.tools.get(line.callId) || t.body.appendChild(el("div", "tool"));
      t.tools.set(line.callId, box);
      box.dataset.delegate = line.sessionId;
      const controls = box.querySelector(".decide"); // that agent's turn answers the call, not the page
      if (controls) controls.remove();
      const note = box.querySelector(".note");
      if (note && !box.dataset.settled) note.textContent = "waiting for agent " + line.agent;
      const row = el("div", "delegate", "→ " + line.agent + " (session ");
      const link = el("a", null, line.sessionId);
      link.href = "?session=" + encodeURIComponent(line.sessionId);
      row.append(link, ")");
      box.appendChild(row);
      t.lastText = null;
      break;
    }
    case "delegate_end": {
      const box = t.tools.get(line.callId) || t.body;
      const err = line.error ? " · " + (line.error.code || "") + " " + (line.error.message || "") : "";
      const end = el("div", "delegate-end", "← " + line.agent + ": " + (STOP_LABELS[line.stopReason] || line.stopReason) + err);
      end.dataset.stop = line.stopReason;
      box.appendChild(end);
      t.lastText = null;
      break;
    }
    case "session_error":
      $("transcript").appendChild(el("div", "error", line.code + ": " + line.message));
      break;
    case "session_waiting":
      $("transcript").appendChild(el("div", "waiting",
        "waiting: no worker runs agent " + ((line.noWorker || {}).agent || "?") + "; start one with that agent"));
      break;
    case "turn_yield": // the turn goes on in the next delivery
    case "idle": // a resume found nothing to run
      break;
    default:
      break; // a line type this page does not know (a newer server): nothing to show
  }
}

function take(line) {
  if (typeof line.cursor === "number") {
    if (line.cursor <= cursor) return; // already shown
    cursor = line.cursor;
    $("cursor").textContent = String(cursor);
  }
  lines.push(line);
  render(line);
  save();
  if (line.type === "turn_end" && timelineShown()) loadTimeline(timelineLast);
}

async function follow() {
  if (controller) controller.abort();
  const mine = new AbortController();
  controller = mine;
  while (controller === mine) {
    try {
      const url = ROOT + "/v1/sessions/" + encodeURIComponent(sessionId) + "/stream?cursor=" + cursor;
      const response = await fetch(url, { headers: headers(), signal: mine.signal });
      if (response.status === 401) { askToken(); return; }
      if (!response.ok) {
        const body = await response.json().catch(() => ({}));
        setStatus("offline", (body.error && body.error.code) || "HTTP " + response.status);
        if (response.status === 404) return;
        throw new Error("stream answered " + response.status);
      }
      setStatus("live");
      retryMs = 250;
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffered = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffered += decoder.decode(value, { stream: true });
        let newline;
        while ((newline = buffered.indexOf("\n")) >= 0) {
          const text = buffered.slice(0, newline).trim();
          buffered = buffered.slice(newline + 1);
          if (text) take(JSON.parse(text));
        }
      }
    } catch (e) {
      if (mine.signal.aborted) return;
    }
    if (controller !== mine) return;
    setStatus("reconnecting", "reconnecting from " + cursor);
    await new Promise((resolve) => setTimeout(resolve, retryMs));
    retryMs = Math.min(retryMs * 2, 5000);
  }
}

function askToken() {
  setStatus("offline", "needs a token");
  $("token-row").classList.add("shown");
}

// The timeline (GET /v1/sessions/{id}/timeline?cursor=N): each turn, the workers (epochs)
// that ran it and how each one's part ended, its tool calls. The API answers a page of turns
// at a time with the cursor of the next page (`next`, null at the end of what is stored):
// the panel shows the first page and a button for the turns after it. Shown on demand,
// fetched fresh when opened; when a turn ends while it is open, the last page shown is
// fetched again (the ended turn is in it, or starts the page after it).
const TIMELINE_PAGE_TURNS = 20;
let timelineLoads = 0; // bumped by each load: an answer to an older one is dropped
let timelineLast = 0; // the cursor the last page shown was read after

function timelineShown() { return !$("timeline").hidden; }

function toggleTimeline() {
  const shown = !timelineShown();
  $("timeline").hidden = !shown;
  $("show-timeline").setAttribute("aria-expanded", String(shown));
  if (shown) loadTimeline();
}

// The page of turns after `after`, or null once the error is shown in the panel.
async function fetchTimelinePage(after, load) {
  const panel = $("timeline");
  const url = ROOT + "/v1/sessions/" + encodeURIComponent(sessionId) + "/timeline?cursor=" + after + "&limit=" + TIMELINE_PAGE_TURNS;
  let response, body;
  try {
    response = await fetch(url, { headers: headers() });
    body = await response.json().catch(() => ({}));
  } catch (e) {
    if (load === timelineLoads) panel.replaceChildren(el("h2", null, "Timeline"), el("div", "error", "the timeline could not be fetched: " + e.message));
    return null;
  }
  if (load !== timelineLoads) return null;
  if (response.status === 401) askToken();
  if (!response.ok) {
    const error = body.error || {};
    panel.replaceChildren(el("h2", null, "Timeline"), el("div", "error", (error.code || "HTTP " + response.status) + (error.message ? ": " + error.message : "")));
    return null;
  }
  return body;
}

// Shows the turns after `after` (0: from the first): the rows of that page and any after it
// are replaced by what the API answers now.
async function loadTimeline(after) {
  after = after || 0;
  const load = ++timelineLoads;
  const body = await fetchTimelinePage(after, load);
  if (!body) return;
  const panel = $("timeline");
  if (after === 0 || !panel.querySelector("h2")) {
    panel.replaceChildren(el("h2", null, "Timeline"));
  } else {
    for (const row of panel.querySelectorAll(".tl-turn, .tl-more, .tl-none")) {
      if (!row.classList.contains("tl-turn") || Number(row.dataset.page) >= after) row.remove();
    }
  }
  timelineLast = after;
  const turnsShown = body.turns || [];
  if (!turnsShown.length && !panel.querySelector(".tl-turn")) panel.appendChild(el("div", "tl-none", "no turn has started yet"));
  for (const turn of turnsShown) panel.appendChild(timelineTurn(turn, after));
  if (body.next !== null && body.next !== undefined) {
    const more = el("button", "tl-more", "later turns");
    more.type = "button";
    more.addEventListener("click", () => loadTimeline(body.next));
    panel.appendChild(more);
  }
}

function timelineTurn(turn, page) {
  const row = el("div", "tl-turn");
  row.dataset.messageId = turn.messageId;
  row.dataset.page = String(page);
  const ending = turn.stopReason ? (STOP_LABELS[turn.stopReason] || turn.stopReason) : "open";
  const head = el("div", "tl-head", (turn.input === null ? "(" + turn.messageId + ")" : turn.input) + " — " + ending
    + (turn.error && turn.error.code ? " · " + turn.error.code : ""));
  head.dataset.stop = turn.stopReason || "";
  row.appendChild(head);
  for (const part of turn.deliveries) {
    const p = el("div", "tl-part", "worker epoch " + part.epoch + ": " + part.how + " (lines " + part.startCursor + "–" + part.endCursor + ")");
    p.dataset.how = part.how;
    p.dataset.epoch = String(part.epoch);
    row.appendChild(p);
  }
  for (const call of turn.tools) {
    const again = call.epochs.length > 1 ? " (epochs " + call.epochs.join(", ") + ")" : "";
    const t = el("div", "tl-tool", "tool " + call.name + ": " + call.outcome + (call.isError ? ", error" : "") + again);
    t.dataset.outcome = call.outcome;
    t.dataset.toolId = call.id;
    row.appendChild(t);
  }
  return row;
}

function openSession(id) {
  sessionId = id;
  $("show-timeline").hidden = false;
  $("empty").hidden = true;
  const url = new URL(location.href);
  url.searchParams.set("session", id);
  history.replaceState(null, "", url);
  $("session-label").textContent = id;
  follow();
}

async function send(text) {
  const base = sessionId ? ROOT + "/v1/sessions/" + encodeURIComponent(sessionId) : null;
  const path = !base ? ROOT + "/v1/sessions" : openTurn ? base + "/steer" : base + "/prompts";
  const response = await fetch(path, {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(Object.assign({ input: text, messageId: newMessageId() }, !base && agentName ? { agent: agentName } : {})),
  });
  if (response.status === 401) { askToken(); return false; }
  const body = await response.json();
  if (!response.ok) {
    $("transcript").appendChild(el("div", "error", body.error.code + ": " + body.error.message));
    return false;
  }
  if (!sessionId) {
    cursor = body.cursor || 0;
    openSession(body.sessionId);
  }
  return true;
}

$("prompt-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text) return;
  $("send").disabled = true;
  try {
    if (await send(text)) $("prompt").value = "";
  } finally {
    $("send").disabled = false;
  }
});
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("prompt-form").requestSubmit(); }
});
$("save-token").addEventListener("click", () => {
  localStorage.setItem("fx.token", $("token").value);
  $("token-row").classList.remove("shown");
  if (sessionId) follow();
});
$("new-session").addEventListener("click", () => {
  location.href = location.pathname + (agentName ? "?agent=" + encodeURIComponent(agentName) : "");
});
$("show-timeline").addEventListener("click", toggleTimeline);
$("stop").addEventListener("click", async () => {
  if (!sessionId) return;
  $("stop").disabled = true;
  try {
    const response = await fetch(ROOT + "/v1/sessions/" + encodeURIComponent(sessionId) + "/cancel", {
      method: "POST", headers: headers({ "Content-Type": "application/json" }), body: "{}",
    });
    if (response.status === 401) askToken();
  } finally {
    $("stop").disabled = false;
  }
});
setOpenTurn(null);

if (sessionId) {
  $("show-timeline").hidden = false;
  $("session-label").textContent = sessionId;
  $("empty").hidden = true;
  restore();
  follow();
}

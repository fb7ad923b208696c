// flowengine dashboard: renders the live state pushed by /api/stream (server-sent
// events) and the persisted flows read from /api/flows. Plain DOM code, no build step.
"use strict";

// How often the flow list is read again (ms): the backend is read on each request.
const FLOWS_REFRESH_MS = 3000;
// How often the dead letters are read again (ms): each read asks the broker.
const DEAD_LETTERS_REFRESH_MS = 10000;
// Pause before the live stream is opened again after it broke (ms).
const RECONNECT_MS = 2000;
// Where the page keeps the token it was given (this tab only).
const TOKEN_KEY = "flowengine-dashboard-token";

// Whether the server allows actions (it says so in every state it sends).
let actionsEnabled = false;

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

// fetch() with this page's credentials; a 401 asks for the token.
async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: { ...authHeaders(), ...(options.headers || {}) } });
  if (response.status === 401) askToken(sessionStorage.getItem(TOKEN_KEY) ? "wrong token" : "");
  return response;
}

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child ?? "")));
  }
  return node;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const m = Math.floor(seconds / 60), h = Math.floor(m / 60);
  return h ? `${h}h${String(m % 60).padStart(2, "0")}m` : `${m}m${String(Math.floor(seconds % 60)).padStart(2, "0")}s`;
}

function stateBadge(state) {
  return el("span", { class: `state state-${state}` }, state);
}

// A button doing `action` with `fields` after a confirmation (only when actions are allowed).
function actionButton(label, action, fields, question) {
  if (!actionsEnabled) return "";
  const button = el("button", { class: `action action-${action}`, type: "button" }, label);
  button.addEventListener("click", () => {
    if (window.confirm(question)) runAction(action, fields);
  });
  return button;
}

async function runAction(action, fields) {
  const shown = $("#action-result");
  const response = await api(`/api/actions/${action}`, {
    method: "POST", body: JSON.stringify(fields),
    headers: { "Content-Type": "application/json", "X-Flowengine-Dashboard": "1" },
  });
  let body = {};
  try { body = await response.json(); } catch (e) { body = { error: response.statusText }; }
  shown.hidden = false;
  shown.className = response.ok ? "ok" : "error";
  shown.dataset.action = action;
  shown.dataset.status = String(response.status);
  shown.textContent = response.ok ? body.message : `${action} refused: ${body.error}`;
  if (response.ok && ["retry", "resume"].includes(action)) refreshFlows();
  if (response.ok && action === "requeue") refreshDeadLetters();
}

function renderWorkers(state) {
  const body = $("#workers tbody");
  body.replaceChildren();
  for (const w of state.workers) {
    const totals = (w.stats && w.stats.totals) || {};
    body.append(el("tr", { "data-worker-id": w.worker_id },
      el("td", {}, w.worker_id), el("td", {}, `${w.hostname}:${w.pid}`),
      el("td", {}, (w.topics || []).join(", ")), el("td", {}, w.threads),
      el("td", {}, w.held), el("td", {}, w.running),
      el("td", {}, totals.succeeded ?? 0), el("td", {}, totals.failed ?? 0),
      el("td", {}, totals.cancelled ?? 0), el("td", {}, age(w.stats && w.stats.uptime_s)),
      el("td", { class: "action-col" }, actionButton("shut down", "shutdown", { worker: w.worker_id },
        `Warm shutdown of worker ${w.worker_id}? It takes no new request, finishes the ${w.held} it holds, then exits.`))));
  }
  $("#worker-count").textContent = `${state.workers.length} live`;
  $("#no-workers").hidden = state.workers.length > 0;
  const requests = $("#requests tbody");
  requests.replaceChildren();
  let count = 0;
  for (const w of state.workers) {
    for (const r of w.requests || []) {
      count += 1;
      requests.append(el("tr", { "data-uuid": r.uuid },
        el("td", {}, w.worker_id), el("td", {}, r.task), el("td", { class: "uuid" }, r.uuid),
        el("td", {}, r.action), el("td", {}, r.attempt), el("td", {}, stateBadge(r.state)),
        el("td", {}, age(r.running_for_s ?? r.held_for_s)),
        el("td", { class: "action-col" }, actionButton("cancel", "cancel", { request: r.uuid },
          `Cancel request ${r.uuid} (${r.task}) on ${w.worker_id}? Its flow gets a RequestCancelled failure.`))));
    }
  }
  $("#no-requests").hidden = count > 0;
}

// Seconds of history the chart spans (its x axis is time, not rounds).
const CHART_SPAN_S = 240;

function renderChart(state) {
  const svg = $("#chart");
  // Rates are per second of the time that really passed between two rounds
  // (computed by the server); a point without a previous round has none.
  const end = state.history.length ? state.history[state.history.length - 1].t : 0;
  const points = state.history.filter((p) => p.dt && p.t >= end - CHART_SPAN_S);
  const rates = points.map((p) => [p.succeeded_per_s, p.failed_per_s]);
  const top = Math.max(1, ...rates.map(([ok, bad]) => Math.max(ok, bad)));
  const x = (p) => 600 - ((end - p.t) / CHART_SPAN_S) * 600;
  const line = (index) => rates.map((r, i) =>
    `${x(points[i]).toFixed(1)},${150 - (r[index] / top) * 140}`).join(" ");
  svg.innerHTML = `<polyline class="ok" points="${line(0)}"></polyline>` +
                  `<polyline class="bad" points="${line(1)}"></polyline>` +
                  `<text x="4" y="12" font-size="10" fill="#777">${top.toFixed(1)}/s</text>`;
  const recent = points.slice(-15);
  const ok = recent.reduce((s, p) => s + p.succeeded, 0);
  const bad = recent.reduce((s, p) => s + p.failed, 0);
  $("#failure-rate").textContent = ok + bad ? `${((100 * bad) / (ok + bad)).toFixed(1)} %` : "-";
  const last = rates.length ? rates[rates.length - 1] : [0, 0];
  const now = $("#rate-now");
  now.textContent = `${last[0].toFixed(1)} succeeded/s, ${last[1].toFixed(1)} failed/s`;
  now.dataset.succeededPerS = String(last[0]);
}

function renderEvents(state) {
  // Without events, say why the panel is empty rather than leave it blank.
  $("#no-events").hidden = state.events.length > 0;
  $("#no-events").textContent = state.events_enabled
    ? "No events yet: workers send them when started with --events."
    : "Events are off (the dashboard was started with --no-events).";
  const list = $("#events");
  list.replaceChildren(...state.events.map((e) => el("li", {},
    `${new Date((e.timestamp || 0) * 1000).toLocaleTimeString()} ${e.type} ` +
    `${e.name || e.flow_name || ""} ${e.uuid || ""} ${e.hostname || ""}`)));
}

let flowsEnabled = null;

function render(state) {
  $("#source").textContent = `${state.broker} / ${state.exchange}`;
  actionsEnabled = Boolean(state.actions_enabled);
  document.body.classList.toggle("actions", actionsEnabled);
  $("#mode").textContent = actionsEnabled ? "actions allowed" : "read-only";
  renderWorkers(state);
  renderChart(state);
  renderEvents(state);
  if (flowsEnabled === null) {
    flowsEnabled = state.flows_enabled;
    $("#no-backend").hidden = flowsEnabled;
    $("#flows").hidden = !flowsEnabled;
    $("#history-filter").hidden = !flowsEnabled && !state.jobs_enabled;
    $("#jobs-box").hidden = !state.jobs_enabled;
    if (state.jobs_enabled) { refreshJobs(); setInterval(refreshJobs, FLOWS_REFRESH_MS); }
    if (flowsEnabled) { refreshFlows(); setInterval(refreshFlows, FLOWS_REFRESH_MS); }
    refreshDeadLetters();
    setInterval(refreshDeadLetters, DEAD_LETTERS_REFRESH_MS);
  }
}

// The history filter as a query string (times entered in UTC); `stateInput`
// is the flows' or the jobs' state choice.
function flowQuery(stateInput = "#filter-state") {
  const query = new URLSearchParams();
  const pairs = [["state", stateInput], ["name", "#filter-name"], ["worker", "#filter-worker"],
                 ["since", "#filter-since"], ["until", "#filter-until"]];
  for (const [key, sel] of pairs) {
    const value = $(sel).value.trim();
    if (value) query.set(key, key === "since" || key === "until" ? `${value}Z` : value);
  }
  const text = query.toString();
  return text ? `?${text}` : "";
}

let jobsAsked = 0;

async function refreshJobs() {
  const asked = ++jobsAsked;
  const query = flowQuery("#jobs-state");
  const response = await api(`/api/jobs${query}`);
  if (!response.ok || asked !== jobsAsked) return;
  const jobs = await response.json();
  if (asked !== jobsAsked) return;
  $("#jobs tbody").replaceChildren(...jobs.map((j) => el("tr", { "data-job": j.uuid },
    el("td", { class: "uuid" }, j.uuid.slice(0, 8)), el("td", {}, j.name),
    el("td", {}, stateBadge(j.state)),
    el("td", {}, j.created_at ? new Date(j.created_at).toLocaleString() : "-"),
    el("td", {}, j.owner || "-"), el("td", {}, j.attempts),
    el("td", {}, j.outcome ? `${j.outcome.outcome}${j.outcome.reason ? `: ${j.outcome.reason}` : ""}` : "-"))));
  $("#jobs-count").textContent = `${jobs.length} job(s)`;
  $("#jobs-count").dataset.query = query.replace(/^\?/, "");
}

async function refreshDeadLetters() {
  const response = await api("/api/deadletters");
  if (!response.ok) return;
  const queues = await response.json();
  const body = $("#dead-letters tbody");
  body.replaceChildren();
  let count = 0;
  for (const q of queues) {
    for (const d of q.letters) {
      count += 1;
      body.append(el("tr", { "data-queue": q.queue, "data-index": d.index },
        el("td", {}, q.queue), el("td", {}, d.index), el("td", {}, d.refused_at_utc),
        el("td", {}, d.type ?? "-"), el("td", {}, d.reason ?? "-"),
        el("td", { class: "action-col" }, actionButton("requeue", "requeue", { queue: q.queue, index: d.index },
          `Requeue dead letter ${d.index} of ${q.queue} where it was first published?`))));
    }
  }
  $("#dead-count").textContent = count ? `${count} waiting` : "";
  $("#no-dead-letters").hidden = count > 0;
}

let selectedFlow = null;

let flowsAsked = 0;

async function refreshFlows() {
  const asked = ++flowsAsked;
  const query = flowQuery();
  const response = await api(`/api/flows${query}`);
  if (!response.ok || asked !== flowsAsked) return;  // a newer filter was asked since
  const flows = await response.json();
  if (asked !== flowsAsked) return;
  const body = $("#flows tbody");
  body.replaceChildren();
  for (const f of flows) {
    const counts = Object.entries(f.atoms || {}).map(([s, n]) => `${n} ${s}`).join(", ");
    const failed = ["FAILURE", "REVERTED", "REVERT_FAILURE"].includes(f.state);
    const classes = [f.uuid === selectedFlow ? "selected" : "", failed ? "failed" : ""];
    const row = el("tr", { "data-flow": f.uuid, class: classes.join(" ").trim() },
      el("td", { class: "uuid" }, f.uuid.slice(0, 8)), el("td", {}, f.name),
      el("td", {}, f.book), el("td", {}, stateBadge(f.state)),
      el("td", {}, f.updated_at ? new Date(f.updated_at).toLocaleString() : "-"),
      el("td", {}, counts), el("td", {}, (f.workers || []).join(", ")));
    row.addEventListener("click", () => showFlow(f.uuid));
    body.append(row);
  }
  $("#flows-count").textContent = `${flows.length} flow(s)`;
  $("#flows-count").dataset.query = query.replace(/^\?/, "");
  if (selectedFlow) showFlow(selectedFlow, false);
}

async function showFlow(uuid, scroll = true) {
  const response = await api(`/api/flows/${uuid}`);
  if (!response.ok) return;
  const flow = await response.json();
  const changed = selectedFlow !== uuid;
  selectedFlow = uuid;
  for (const row of document.querySelectorAll("#flows tbody tr")) {
    row.classList.toggle("selected", row.dataset.flow === uuid);
  }
  $("#flow-detail").hidden = false;
  $("#flow-detail").dataset.flow = uuid;
  $("#flow-title").replaceChildren(`${flow.name} `, stateBadge(flow.state),
                                   ` ${flow.uuid}`);
  const rerun = ["FAILURE", "REVERTED"].includes(flow.state) ? "retry"
    : ["RUNNING", "SUSPENDED", "PENDING"].includes(flow.state) ? "resume" : null;
  $("#flow-actions").replaceChildren(rerun ? actionButton(rerun, rerun, { flow: uuid },
    `${rerun} flow ${flow.name} (${uuid})? It runs in a process the dashboard starts.`) : "");
  showGraph(uuid);
  renderTimeline(flow);
  const body = $("#atoms tbody");
  const open = new Set([...body.querySelectorAll("pre.traceback:not([hidden])")]
                        .map((p) => p.dataset.atom));
  body.replaceChildren();
  flow.atoms.forEach((a, i) => {
    const cell = el("td", {});
    const failure = a.failure || a.revert_failure;
    const run = a.run || {};
    if (failure) {
      cell.append(`${failure.exc_type_names[0]}: ${failure.message}`);
      // A remote traceback's frames are the worker's: say which worker.
      const where = run.worker ? `Raised on worker ${run.worker}\n\n` : "";
      const pre = el("pre", { class: "traceback", "data-atom": a.name },
                     where + (failure.traceback || "(no traceback)"));
      pre.hidden = !open.has(a.name);
      const button = el("button", { class: "traceback-toggle", "data-atom": a.name },
                        "traceback");
      button.addEventListener("click", () => { pre.hidden = !pre.hidden; });
      cell.append(button, pre);
    } else {
      cell.append(a.result === null || a.result === undefined ? "" : JSON.stringify(a.result));
    }
    // The atom whose execution failed stands out from the atoms merely reverted.
    const badge = a.failure ? el("span", {}, stateBadge(a.state), " ",
                                 el("span", { class: "state state-FAILED" }, "failed here"))
                            : stateBadge(a.state);
    const took = run.duration_s === null || run.duration_s === undefined
      ? "-" : `${run.duration_s.toFixed(3)} s`;
    body.append(el("tr", { "data-atom": a.name, class: a.failure ? "failed" : "" },
      el("td", {}, i + 1), el("td", {}, a.name),
      el("td", {}, badge), el("td", {}, a.intention || ""), el("td", {}, took),
      el("td", {}, run.worker || "-"), cell));
  });
  if (scroll && changed) $("#flow-detail").scrollIntoView({ behavior: "smooth" });
}

// The graph is an image: fetched with the credentials, shown from a blob URL
// (a new one each time: the browser must not keep an old colouring).
async function showGraph(uuid) {
  const response = await api(`/api/flows/${uuid}/graph.svg?v=${Date.now()}`);
  if (!response.ok) return;
  const old = $("#graph").src;
  $("#graph").src = URL.createObjectURL(await response.blob());
  if (old.startsWith("blob:")) URL.revokeObjectURL(old);
}

// Per atom: when it was queued (remote atoms), started and ended, where, which
// attempt; as bars on one time axis and as an event history, oldest first.
function renderTimeline(flow) {
  const events = [];
  const runs = flow.atoms.filter((a) => a.run && a.run.started_at && a.run.ended_at);
  for (const a of runs) {
    const r = a.run;
    if (r.queued_at) events.push([r.queued_at, a.name, "queued", r]);
    events.push([r.started_at, a.name, "started", r]);
    events.push([r.ended_at, a.name, r.state || "ended", r]);
  }
  $("#no-timeline").hidden = runs.length > 0;
  const at = (text) => new Date(text).getTime();
  const start = Math.min(...events.map((e) => at(e[0])));
  const end = Math.max(...events.map((e) => at(e[0])));
  const span = Math.max(end - start, 1);
  const pct = (text) => `${((100 * (at(text) - start)) / span).toFixed(2)}%`;
  const width = (from, to) => `${Math.max((100 * (at(to) - at(from))) / span, 0.4).toFixed(2)}%`;
  $("#timeline").replaceChildren(...runs.map((a) => {
    const r = a.run;
    const track = el("div", { class: "track" });
    if (r.queued_at) {
      const queued = el("div", { class: "bar queued", title: `queued ${(r.queued_s ?? 0).toFixed(3)} s` });
      queued.style.left = pct(r.queued_at); queued.style.width = width(r.queued_at, r.started_at);
      track.append(queued);
    }
    const ran = el("div", { class: `bar ran state-${r.state}`,
                            title: `${r.state} after ${(r.duration_s ?? 0).toFixed(3)} s on ${r.worker || "the engine"}` });
    ran.style.left = pct(r.started_at); ran.style.width = width(r.started_at, r.ended_at);
    track.append(ran);
    return el("div", { class: "lane", "data-atom": a.name },
      el("span", { class: "lane-name" }, a.name), track);
  }));
  events.sort((x, y) => at(x[0]) - at(y[0]));
  $("#history tbody").replaceChildren(...events.map(([when, atom, what, r]) =>
    el("tr", { "data-atom": atom, "data-event": what },
      el("td", {}, when.replace("+00:00", "Z")), el("td", {}, ((at(when) - start) / 1000).toFixed(3)),
      el("td", {}, atom), el("td", {}, stateBadge(what)), el("td", {}, r.worker || "-"),
      el("td", {}, r.attempt ?? "-"))));
}

function setConnection(text, kind) {
  $("#connection").textContent = text;
  $("#connection").className = `badge ${kind}`;
}

function askToken(problem) {
  $("#login").hidden = false;
  $("#login-error").textContent = problem || "";
  setConnection("signed out", "down");
}

// The live state, pushed as server-sent events; read with fetch() so that the
// request carries the token (an EventSource cannot send headers).
async function follow() {
  for (;;) {
    let response;
    try {
      response = await api("/api/stream");
    } catch (e) {
      response = null;
    }
    if (response && response.status === 401) return;  // askToken() shows the form
    if (response && response.ok) {
      $("#login").hidden = true;
      setConnection("live", "live");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const chunk = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            for (const line of chunk.split("\n")) {
              if (line.startsWith("data: ")) render(JSON.parse(line.slice(6)));
            }
          }
        }
      } catch (e) { /* the connection broke: open it again */ }
    }
    setConnection("reconnecting…", "down");
    await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
  }
}

$("#login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
  $("#login").hidden = true;
  follow();
});
function refreshHistory() {
  if (flowsEnabled) refreshFlows();
  if (!$("#jobs-box").hidden) refreshJobs();
}
for (const sel of ["#filter-state", "#filter-name", "#filter-worker", "#filter-since", "#filter-until"]) {
  $(sel).addEventListener("change", refreshHistory);
}
$("#jobs-state").addEventListener("change", refreshJobs);
$("#filter-clear").addEventListener("click", () => {
  for (const input of document.querySelectorAll("#history-filter input, #history-filter select")) input.value = "";
  refreshHistory();
});

follow();

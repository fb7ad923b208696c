// flowengine dashboard: renders the live state pushed by /api/stream (server-sent
// events) and the persisted flows read from /api/flows. Plain DOM code, no build step.
"use strict";

// How often the flow list is read again (ms): the backend is read on each request.
const FLOWS_REFRESH_MS = 3000;

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
      el("td", {}, totals.cancelled ?? 0), el("td", {}, age(w.stats && w.stats.uptime_s))));
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
        el("td", {}, age(r.running_for_s ?? r.held_for_s))));
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
  renderWorkers(state);
  renderChart(state);
  renderEvents(state);
  if (flowsEnabled === null) {
    flowsEnabled = state.flows_enabled;
    $("#no-backend").hidden = flowsEnabled;
    $("#flows").hidden = !flowsEnabled;
    if (flowsEnabled) { refreshFlows(); setInterval(refreshFlows, FLOWS_REFRESH_MS); }
  }
}

let selectedFlow = null;

async function refreshFlows() {
  const response = await fetch("/api/flows");
  if (!response.ok) return;
  const flows = await response.json();
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
      el("td", {}, counts));
    row.addEventListener("click", () => showFlow(f.uuid));
    body.append(row);
  }
  if (selectedFlow) showFlow(selectedFlow, false);
}

async function showFlow(uuid, scroll = true) {
  const response = await fetch(`/api/flows/${uuid}`);
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
  // A new URL each time: the browser must not keep an old colouring.
  $("#graph").src = `/api/flows/${uuid}/graph.svg?v=${Date.now()}`;
  const body = $("#atoms tbody");
  const open = new Set([...body.querySelectorAll("pre.traceback:not([hidden])")]
                        .map((p) => p.dataset.atom));
  body.replaceChildren();
  flow.atoms.forEach((a, i) => {
    const cell = el("td", {});
    const failure = a.failure || a.revert_failure;
    if (failure) {
      cell.append(`${failure.exc_type_names[0]}: ${failure.message}`);
      const pre = el("pre", { class: "traceback", "data-atom": a.name },
                     failure.traceback || "(no traceback)");
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
    const run = a.run || {};
    const took = run.duration_s === null || run.duration_s === undefined
      ? "-" : `${run.duration_s.toFixed(3)} s`;
    body.append(el("tr", { "data-atom": a.name, class: a.failure ? "failed" : "" },
      el("td", {}, i + 1), el("td", {}, a.name),
      el("td", {}, badge), el("td", {}, a.intention || ""), el("td", {}, took),
      el("td", {}, run.worker || "-"), cell));
  });
  if (scroll && changed) $("#flow-detail").scrollIntoView({ behavior: "smooth" });
}

function connect() {
  const source = new EventSource("/api/stream");
  source.onopen = () => { $("#connection").textContent = "live"; $("#connection").className = "badge live"; };
  source.onerror = () => { $("#connection").textContent = "reconnecting…"; $("#connection").className = "badge down"; };
  source.onmessage = (message) => render(JSON.parse(message.data));
}

connect();

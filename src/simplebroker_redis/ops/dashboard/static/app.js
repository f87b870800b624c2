// simplebroker-redis dashboard: one EventSource, no polling, no build step.
// Every "state" event is one reading of the namespace; rates and charts are
// computed here from the readings the page already has. Every URL is
// relative, so the page works under a reverse proxy's prefix. tasks.js adds
// the task views (find by id, running now, task names, dead letters).
"use strict";

const HISTORY_SECONDS = 600;  // the charts show the last ten minutes
const history = [];           // {t, enq, ack, pending, reserved, delayed}
let last = null;              // the previous state event
let actions = false;          // this page may act (actions allowed, logged in)
let csrf = "";                // the token every action carries (GET api/session)
let openQueue = null;         // the queue shown in the detail panel
let detailBusy = false;

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.max(0, seconds);
  if (s < 1) return "<1s";
  if (s < 90) return `${Math.round(s)}s`;
  if (s < 5400) return `${Math.round(s / 60)}m`;
  if (s < 172800) return `${(s / 3600).toFixed(1)}h`;
  return `${(s / 86400).toFixed(1)}d`;
}

function fmtIn(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  return seconds < 0 ? `${fmtAge(-seconds)} ago` : `in ${fmtAge(seconds)}`;
}

function fmtRate(value) {
  if (value === null || value === undefined || !isFinite(value)) return "–";
  return value >= 10 ? value.toFixed(0) : value.toFixed(1);
}

function toast(text, bad = false) {
  const box = $("toast");
  box.textContent = text;
  box.className = bad ? "toast bad" : "toast";
  box.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { box.hidden = true; }, 4000);
}

// A confirmation inside the page (each action asks once, then runs one script).
function confirmAction(text) {
  return new Promise((resolve) => {
    $("modal-text").textContent = text;
    $("modal").hidden = false;
    const done = (answer) => {
      $("modal").hidden = true;
      $("modal-ok").onclick = $("modal-cancel").onclick = null;
      resolve(answer);
    };
    $("modal-ok").onclick = () => done(true);
    $("modal-cancel").onclick = () => done(false);
  });
}

async function post(path, body) {
  const reply = await fetch(path, {
    method: "POST",
    headers: { "content-type": "application/json", "x-csrf-token": csrf },
    body: JSON.stringify(body || {}),
  });
  const data = await reply.json().catch(() => ({}));
  if (!reply.ok) throw new Error(data.error || `HTTP ${reply.status}`);
  return data;
}

function counter(queue, name) {
  return (queue.counters && queue.counters[name]) || 0;
}

function rates(state) {
  const out = {};
  if (!last) return out;
  const dt = state.now - last.now;
  if (dt <= 0) return out;
  const before = new Map(last.queues.map((q) => [q.name, q]));
  for (const q of state.queues) {
    const p = before.get(q.name);
    if (!p) continue;
    out[q.name] = {
      in: (counter(q, "enqueued") - counter(p, "enqueued")) / dt,
      done: (counter(q, "acknowledged") - counter(p, "acknowledged")) / dt,
    };
  }
  return out;
}

function renderCards(state) {
  const sum = (key) => state.queues.filter((q) => !q.dead_letter).reduce((n, q) => n + q[key], 0);
  const dead = state.queues.filter((q) => q.dead_letter).reduce((n, q) => n + q.pending + q.delayed, 0);
  $("c-queues").textContent = state.queues.length;
  $("c-pending").textContent = sum("pending");
  $("c-reserved").textContent = sum("reserved");
  $("c-delayed").textContent = sum("delayed");
  $("c-dead").textContent = dead;
  $("c-workers").textContent = state.workers.filter((w) => w.live).length;
}

function renderQueues(state, rate) {
  const body = $("queues").tBodies[0];
  body.replaceChildren();
  for (const q of state.queues) {
    const r = rate[q.name] || {};
    const row = el("tr", { class: "clickable" + (q.dead_letter ? " dead" : ""), dataset: { queue: q.name },
                           onclick: () => openDetail(q.name) },
      el("td", { class: "name", title: q.name }, q.shown || q.name),
      el("td", { class: "n pending" }, q.pending),
      el("td", { class: "n reserved" }, q.reserved),
      el("td", { class: "n delayed" }, q.delayed),
      el("td", { class: "n claimed" }, q.claimed),
      el("td", { class: "n age" }, fmtAge(q.oldest_age)),
      el("td", { class: "n rate-in" }, fmtRate(r.in)),
      el("td", { class: "n rate-done" }, fmtRate(r.done)));
    body.append(row);
  }
  $("no-queues").hidden = state.queues.length > 0;
}

function renderDead(state) {
  const body = $("dead").tBodies[0];
  body.replaceChildren();
  const dead = state.queues.filter((q) => q.dead_letter);
  for (const q of dead) {
    const target = el("input", { type: "text", value: q.source || "",
                                  "aria-label": `requeue ${q.name} to`, class: "target" });
    const buttons = el("td", {},
      el("button", { class: "link", onclick: () => openDetail(q.name) }, "messages"));
    if (actions) {
      buttons.append(
        el("button", { class: "primary requeue-all", onclick: () => requeue(q.name, target.value, null) }, "Retry all"),
        " ",
        el("button", { class: "danger purge", onclick: () => purge(q.name) }, "Purge"));
    }
    body.append(el("tr", { dataset: { queue: q.name } },
      el("td", { title: q.name }, q.shown || q.name), el("td", { class: "n count" }, q.pending + q.delayed),
      el("td", {}, actions ? target : el("span", { class: "muted" }, target.value || "–")), buttons));
  }
  $("no-dead").hidden = dead.length > 0;
}

function renderWorkers(state) {
  const body = $("workers").tBodies[0];
  body.replaceChildren();
  for (const w of state.workers) {
    body.append(el("tr", { class: w.live ? "" : "stale", dataset: { worker: w.id, kind: w.kind || "" } },
      el("td", {}, w.id, " ", el("span", { class: "badge " + (w.live ? "live" : "gone") }, w.live ? "live" : "gone")),
      el("td", { class: "kind" }, w.kind || "–"),
      el("td", {}, (w.queues || []).join(", ") || "–"),
      el("td", { class: "n held" }, w.held ?? "–"),
      el("td", { class: "n" }, w.renewals ?? "–"),
      el("td", { class: "n" }, w.renew_failures ?? "–"),
      el("td", { class: "n" }, `${fmtAge(w.beat_age)} ago`)));
  }
  $("no-workers").hidden = state.workers.length > 0;
}

// Lines of [t, value] points over the last `span` seconds before `now`
// (null values leave a gap); `fmt` labels the y axis.
function drawChart(canvas, series, colors, options = {}) {
  const span = options.span || HISTORY_SECONDS;
  const now = options.now ?? (history.length ? history[history.length - 1].t : 0);
  const fmt = options.fmt || fmtRate;
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.width, height = canvas.clientHeight || canvas.height;
  canvas.width = width * ratio; canvas.height = height * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, width, height);
  const left = 36, bottom = height - 16, top = 6, right = width - 6;
  let max = options.min || 1;
  for (const s of series) for (const [, v] of s) if (v !== null) max = Math.max(max, v);
  ctx.strokeStyle = "#e3e6ea"; ctx.fillStyle = "#6b7280"; ctx.font = "10px system-ui"; ctx.lineWidth = 1;
  for (let i = 0; i <= 2; i++) {
    const y = bottom - (bottom - top) * i / 2;
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(right, y); ctx.stroke();
    ctx.fillText(fmt(max * i / 2), 2, y + 3);
  }
  ctx.fillText(`-${Math.round(span / 60)}m`, left, height - 3); ctx.fillText("now", right - 18, height - 3);
  const x = (t) => right - (now - t) / span * (right - left);
  series.forEach((points, i) => {
    ctx.strokeStyle = colors[i]; ctx.lineWidth = 1.8; ctx.beginPath();
    let drawing = false;
    points.forEach(([t, v], j) => {
      if (v === null) { drawing = false; return; }
      const px = x(t), py = bottom - (bottom - top) * v / max;
      if (drawing) ctx.lineTo(px, py); else ctx.moveTo(px, py);
      drawing = true;
      const next = points[j + 1];
      if ((j === 0 || points[j - 1][1] === null) && (!next || next[1] === null)) {
        ctx.fillStyle = colors[i];  // a point alone: a dot, no line to draw
        ctx.fillRect(px - 2, py - 2, 4, 4);
      }
    });
    ctx.stroke();
  });
  // What the chart shows, for tests: its points with a value, and their sum.
  canvas.dataset.drawn = String(series.reduce((n, s) => n + s.filter(([, v]) => v).length, 0));
  canvas.dataset.total = String(series.reduce((n, s) => n + s.reduce((m, [, v]) => m + (v || 0), 0), 0));
}

function renderCharts() {
  const css = getComputedStyle(document.documentElement);
  const color = (name) => css.getPropertyValue(name).trim();
  const rate = (key) => {
    const out = [];
    for (let i = 1; i < history.length; i++) {
      const dt = history[i].t - history[i - 1].t;
      if (dt > 0) out.push([history[i].t, Math.max(0, (history[i][key] - history[i - 1][key]) / dt)]);
    }
    return out;
  };
  const depth = (key) => history.map((h) => [h.t, h[key]]);
  drawChart($("chart-rate"), [rate("enq"), rate("ack")], [color("--s1"), color("--s2")]);
  drawChart($("chart-depth"), [depth("pending"), depth("reserved"), depth("delayed")],
            [color("--s3"), color("--s4"), color("--s5")]);
}

function record(state) {
  const work = state.queues.filter((q) => !q.dead_letter);
  const sum = (key) => work.reduce((n, q) => n + q[key], 0);
  history.push({ t: state.now, enq: state.totals.enqueued || 0, ack: state.totals.acknowledged || 0,
                 pending: sum("pending"), reserved: sum("reserved"), delayed: sum("delayed") });
  while (history.length && history[0].t < state.now - HISTORY_SECONDS) history.shift();
}

function render(state) {
  if (state.error) { $("live").textContent = state.error; $("live").className = "pill off"; return; }
  $("namespace").textContent = state.namespace;
  const rate = rates(state);
  record(state);
  renderCards(state);
  renderQueues(state, rate);
  renderDead(state);
  renderWorkers(state);
  renderCharts();
  last = state;
  $("updated").textContent = `updated ${new Date(state.now * 1000).toLocaleTimeString()}`;
  document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  if (openQueue) refreshDetail();
  if (window.tasksOnState) window.tasksOnState(state);
}

function messageTable(state, part, dead) {
  const head = ["ID", "Body", "Deliveries"];
  if (state === "delayed") head.push("Due");
  if (state === "reserved") head.push("Holder", "Lease expires");
  if (dead) head.push("Reason", "");
  const table = el("table", { class: `messages ${state}` },
    el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {}, h)))));
  const body = el("tbody");
  for (const m of part.messages) {
    const cells = [el("td", { class: "id" }, m.id), el("td", { class: "body", title: m.body }, m.body),
                   el("td", { class: "n deliveries" }, m.deliveries)];
    if (state === "delayed") cells.push(el("td", {}, fmtIn(m.due_in)));
    if (state === "reserved") cells.push(el("td", { class: "holder" }, m.holder || m.token.slice(0, 8)),
                                         el("td", {}, fmtIn(m.lease_expires_in)));
    if (dead) {
      cells.push(el("td", { class: "reason" }, m.reason || ""));
      cells.push(el("td", {}, actions ? el("button", { class: "primary requeue-one",
        onclick: () => requeue(openQueue, requeueTarget(), [m.id], m.id) }, "Retry") : ""));
    }
    body.append(el("tr", { dataset: { id: m.id } }, ...cells));
  }
  table.append(body);
  return table;
}

function requeueTarget() {
  const input = document.querySelector("#detail-actions input.target");
  return input ? input.value : "";
}

async function refreshDetail() {
  if (!openQueue || detailBusy) return;
  detailBusy = true;
  try {
    const reply = await fetch(`api/queues/${encodeURIComponent(openQueue)}`);
    const view = await reply.json();
    if (!reply.ok) throw new Error(view.error || `HTTP ${reply.status}`);
    $("detail-name").textContent = view.shown || view.queue;
    const actionsBox = $("detail-actions");
    if (view.dead_letter && actions && !actionsBox.querySelector("input")) {
      actionsBox.replaceChildren("Retry to ",
        el("input", { type: "text", class: "target", value: view.requeue_to, "aria-label": "requeue to" }));
    } else if (!view.dead_letter) {
      actionsBox.replaceChildren();
    }
    const parts = [];
    for (const state of ["pending", "delayed", "reserved"]) {
      const part = view.states[state];
      const title = el("div", { class: "state-title" }, `${state} (${part.count})`);
      parts.push(title);
      if (part.messages.length) parts.push(messageTable(state, part, view.dead_letter));
    }
    $("detail-body").replaceChildren(...parts);
  } catch (error) {
    $("detail-body").replaceChildren(el("p", { class: "muted" }, String(error.message || error)));
  } finally {
    detailBusy = false;
  }
}

function openDetail(name) {
  openQueue = name;
  $("detail").hidden = false;
  $("detail-actions").replaceChildren();
  $("detail-body").replaceChildren(el("p", { class: "muted" }, "loading…"));
  refreshDetail();
  $("detail").scrollIntoView({ behavior: "smooth", block: "start" });
}

async function requeue(queue, target, ids, label) {
  if (!target) { toast("name the queue to retry in", true); return; }
  const what = ids ? `message ${label}` : `every message of ${queue}`;
  if (!(await confirmAction(`Retry ${what} in ${target}? Its delivery count starts over.`))) return;
  try {
    const done = await post(`api/dead-letters/${encodeURIComponent(queue)}/requeue`, { target, ids });
    toast(`requeued ${done.moved} message(s) to ${done.target}`);
    if (window.tasksChanged) window.tasksChanged();
  } catch (error) { toast(`retry failed: ${error.message}`, true); }
}

async function purge(queue) {
  if (!(await confirmAction(`Delete every message of ${queue}? This cannot be undone.`))) return;
  try {
    const done = await post(`api/dead-letters/${encodeURIComponent(queue)}/purge`);
    toast(`deleted ${done.deleted} message(s) of ${queue}`);
    if (window.tasksChanged) window.tasksChanged();
  } catch (error) { toast(`purge failed: ${error.message}`, true); }
}

function showMode() {
  $("mode").textContent = actions ? "actions allowed" : "read-only";
  $("mode").className = "pill " + (actions ? "rw" : "ro");
}

async function loadSession() {
  try {
    const reply = await fetch("api/session");
    const session = await reply.json();
    csrf = session.csrf || "";
    actions = Boolean(session.actions && csrf);
    showMode();
  } catch (error) { /* the event stream reports the outage */ }
}

function connect() {
  const source = new EventSource("api/events");
  source.addEventListener("hello", () => {
    $("live").textContent = "live"; $("live").className = "pill on";
  });
  source.addEventListener("state", (event) => render(JSON.parse(event.data)));
  source.addEventListener("tasks", (event) => {
    if (window.tasksOnTasks) window.tasksOnTasks(JSON.parse(event.data));
  });
  source.onerror = () => { $("live").textContent = "reconnecting"; $("live").className = "pill off"; };
}

$("detail-close").addEventListener("click", () => { openQueue = null; $("detail").hidden = true; });
window.addEventListener("resize", () => { renderCharts(); if (window.tasksRedraw) window.tasksRedraw(); });
loadSession().then(connect);

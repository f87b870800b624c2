// Task views over app.js: find a task by id, running now, task names and
// their charts, dead letters with task names and errors. The "tasks" event
// (tasks in flight, the last hour's statistics) and the "state" event drive
// them; a found task and the dead letters are read again when either says
// something changed, so the page follows a task without a reload.
"use strict";

let taskStats = null;      // the last "tasks" event's statistics (every task name)
let statsName = "";        // the task name the task charts show ("" for all)
let nameStats = null;      // statistics of statsName, fetched
let foundQuery = null;     // the id searched for
let deadSignature = null;  // dead-letter queues and counts of the last state event
const busy = {};           // one request per view at a time, one more queued

function fmtSeconds(value) {
  if (value === null || value === undefined) return "–";
  if (value === 0) return "0";
  if (value < 0.001) return `${Math.round(value * 1e6)} µs`;
  if (value < 1) return `${(value * 1000).toFixed(value < 0.01 ? 1 : 0)} ms`;
  if (value < 120) return `${value.toFixed(2)} s`;
  return fmtAge(value);
}

// Run `job` now, or once more after the one in flight (never two at once).
async function once(name, job) {
  if (busy[name]) { busy[name] = "again"; return; }
  busy[name] = true;
  try {
    do {
      busy[name] = true;
      await job();
    } while (busy[name] === "again");
  } catch (error) {
    console.warn(name, error);
  } finally {
    busy[name] = false;
  }
}

async function getJson(path) {
  const reply = await fetch(path);
  const data = await reply.json().catch(() => ({}));
  if (!reply.ok) throw new Error(data.error || `HTTP ${reply.status}`);
  return data;
}

// -- running now ----------------------------------------------------------------------
function renderRunning(running) {
  const body = $("running").tBodies[0];
  body.replaceChildren();
  for (const t of running.tasks) {
    body.append(el("tr", { dataset: { message: t.message_id, task: t.task_id, framework: t.framework } },
      el("td", { class: "name" }, t.name || "–"),
      el("td", { class: "framework" }, t.framework || "–"),
      el("td", { class: "task-id" }, t.task_id),
      el("td", { class: "queue", title: t.queue }, t.shown || t.queue),
      el("td", { class: "worker" }, t.worker || "–"),
      el("td", { class: "n" }, fmtAge(running.now - t.since)),
      el("td", { class: "n" }, fmtIn(t.lease_expires_in)),
      el("td", { class: "n deliveries" }, t.deliveries)));
  }
  const more = running.total - running.tasks.length;
  $("running-count").textContent = running.total ? `(${running.total}${more > 0 ? `, first ${running.tasks.length} shown` : ""})` : "";
  $("no-running").hidden = running.tasks.length > 0;
}

// -- task names and their charts --------------------------------------------------------
function renderNames(names) {
  const body = $("names").tBodies[0];
  body.replaceChildren();
  for (const n of names) {
    body.append(el("tr", { class: "clickable" + (n.name === statsName ? " selected" : ""),
                           dataset: { name: n.name }, onclick: () => selectName(n.name) },
      el("td", { class: "name" }, n.name),
      el("td", { class: "n enqueued" }, n.enqueued),
      el("td", { class: "n done" }, n.done),
      el("td", { class: "n failed" }, n.failed),
      el("td", { class: "n retried" }, n.retried),
      el("td", { class: "n p50" }, fmtSeconds(n.p50)),
      el("td", { class: "n p95" }, fmtSeconds(n.p95)),
      el("td", { class: "n p99" }, fmtSeconds(n.p99))));
  }
  $("no-names").hidden = names.length > 0;
}

function selectName(name) {
  statsName = statsName === name ? "" : name;
  nameStats = null;
  $("tasks-of").textContent = statsName ? `of ${statsName}` : "";
  for (const row of $("names").tBodies[0].rows) row.classList.toggle("selected", row.dataset.name === statsName);
  drawTaskCharts();
  if (statsName) loadNameStats();
}

function loadNameStats() {
  return once("name-stats", async () => {
    const name = statsName;  // read when it runs: a queued rerun asks for the newest
    if (!name) return;
    const data = await getJson(`api/tasks/stats?minutes=60&name=${encodeURIComponent(name)}`);
    if (name === statsName) { nameStats = data; drawTaskCharts(); }
  });
}

function drawTaskCharts() {
  const stats = statsName ? nameStats : taskStats;
  if (!stats) return;
  const css = getComputedStyle(document.documentElement);
  const color = (name) => css.getPropertyValue(name).trim();
  // A minute's point sits at its end: the current minute is still counting.
  const points = (key) => stats.minutes.map((m, i) => [m + 60, stats[key][i]]);
  const now = stats.minutes.length ? stats.minutes[stats.minutes.length - 1] + 60 : 0;
  const options = { span: 3600, now };
  drawChart($("chart-tasks"), ["enqueued", "done", "failed", "retried"].map(points),
            [color("--s1"), color("--s2"), color("--s6"), color("--s3")], options);
  drawChart($("chart-times"), ["p50", "p95", "p99"].map(points),
            [color("--s2"), color("--s3"), color("--s6")], { ...options, fmt: fmtSeconds, min: 0.001 });
}

// -- a task by id -------------------------------------------------------------------------
function field(label, value, cls) {
  if (value === null || value === undefined || value === "") return null;
  return [el("dt", {}, label), el("dd", { class: cls || "" }, value)];
}

function taskCard(t) {
  const result = t.result || {};
  const rows = [
    field("Task id", t.task_id, "task-id"),
    field("Message id", t.message_id),
    field("Queue", (t.shown || t.queue) + (t.written_to && t.written_to !== t.queue ? ` (sent to ${t.written_to})` : ""), "queue"),
    field("Deliveries", t.deliveries, "deliveries"),
    field("Due", t.due_in === null ? null : fmtIn(t.due_in)),
    field("Worker", t.worker, "worker"),
    field("Running since", t.since ? new Date(t.since * 1000).toLocaleTimeString() : null, "since"),
    field("Lease expires", t.lease_expires_in === null ? null : fmtIn(t.lease_expires_in)),
    field("Arguments", t.preview),
    field("Result", result.state ? `${result.state}${result.result ? `: ${result.result}` : ""}` : null, "result"),
    field("Error", result.error, "error"),
  ].filter(Boolean).flat();
  const card = el("div", { class: `task state-${t.state}`, dataset: { state: t.state, framework: t.framework, message: t.message_id || "" } },
    el("div", { class: "task-head" },
      el("strong", { class: "name" }, t.name || "(unnamed)"), " ",
      el("span", { class: `badge ${t.state}` }, t.state), " ",
      el("span", { class: "muted" }, t.framework)),
    el("dl", {}, ...rows));
  if (result.traceback) card.append(el("pre", { class: "traceback" }, result.traceback));
  return card;
}

function renderFound(data) {
  if (data.query !== foundQuery) return;
  const cards = data.tasks.map(taskCard);
  $("found-body").replaceChildren(...(cards.length ? cards
    : [el("p", { class: "muted none" }, "No task with this id: in no queue the index knows, and no stored result.")]));
  document.body.dataset.finds = String(Number(document.body.dataset.finds || 0) + 1);
}

function refreshFound() {
  if (!foundQuery) return;
  once("find", async () => {
    const query = foundQuery;  // read when it runs: a queued rerun asks for the newest
    if (query) renderFound(await getJson(`api/tasks/find?id=${encodeURIComponent(query)}`));
  });
}

$("find-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const query = $("find-input").value.trim();
  if (!query) return;
  foundQuery = query;
  $("found").hidden = false;
  $("found-query").textContent = query;
  $("found-body").replaceChildren(el("p", { class: "muted" }, "looking…"));
  refreshFound();
});
$("found-close").addEventListener("click", () => { foundQuery = null; $("found").hidden = true; });

// -- dead letters ---------------------------------------------------------------------------
function renderDeadTasks(data) {
  const body = $("dead-tasks").tBodies[0];
  body.replaceChildren();
  for (const q of data.queues) {
    for (const t of q.tasks) {
      const buttons = el("td", {});
      const target = t.source || q.source;
      if (actions) {
        buttons.append(
          el("button", { class: "primary retry-one", title: target ? `retry in ${target}` : "",
                         onclick: () => requeue(q.queue, target, [t.message_id], t.task_id) }, "Retry"), " ",
          el("button", { class: "danger delete-one", onclick: () => deleteDead(q.queue, t) }, "Delete"));
      }
      body.append(el("tr", { dataset: { message: t.message_id, task: t.task_id, queue: q.queue } },
        el("td", { class: "name" }, t.name || "–"),
        el("td", { class: "framework" }, t.framework || "–"),
        el("td", { class: "task-id" }, t.task_id),
        el("td", { title: q.queue }, q.shown || q.queue),
        el("td", { class: "error", title: t.traceback || "" }, t.error),
        el("td", { class: "n deliveries" }, t.deliveries),
        buttons));
    }
  }
  $("dead-tasks").hidden = body.rows.length === 0;
}

function loadDead() {
  once("dead", async () => renderDeadTasks(await getJson("api/tasks/dead")));
}

async function deleteDead(queue, task) {
  if (!(await confirmAction(`Delete dead letter ${task.task_id} of ${queue}? This cannot be undone.`))) return;
  try {
    const done = await post(`api/dead-letters/${encodeURIComponent(queue)}/delete`, { ids: [task.message_id] });
    toast(`deleted ${done.deleted} message(s) of ${queue}`);
    window.tasksChanged();
  } catch (error) { toast(`delete failed: ${error.message}`, true); }
}

// -- the events ---------------------------------------------------------------------------------
window.tasksOnTasks = (data) => {
  renderRunning(data.running);
  taskStats = data.stats;
  renderNames(data.stats.names);
  if (statsName) loadNameStats(); else drawTaskCharts();
  refreshFound();
};

window.tasksOnState = (state) => {
  const dead = state.queues.filter((q) => q.dead_letter).map((q) => [q.name, q.pending, q.delayed]);
  // A message dead-lettered and retried between two readings leaves the
  // dead-letter queues as they were; the counters say it died.
  const deaths = state.queues.reduce((n, q) => n + ((q.counters || {}).dead_lettered || 0), 0);
  const signature = JSON.stringify([dead, deaths]);
  if (signature !== deadSignature) { deadSignature = signature; loadDead(); }
  refreshFound();
};

// After an action of this page: the next reading may look the same as the
// last (the dead letter came and went between two), so read again now.
window.tasksChanged = () => { loadDead(); refreshFound(); };

window.tasksRedraw = drawTaskCharts;

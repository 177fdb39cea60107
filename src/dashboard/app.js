// rollcall dashboard: renders what the server pushes on api/events (server-sent
// events). Nothing here polls the server but the run history of the reminder an
// operator picked (api/runs, again when the reminder panel changes); one timer
// re-renders the ages each second. Every number goes through the formatters
// below: human units (B/KiB/MiB, ms/s/min, per second), never an exponent.
"use strict";

const $ = (sel) => document.querySelector(sel);
const COLORS = ["#2b6cb0", "#c05621", "#2f855a", "#9b2c2c", "#6b46c1", "#b7791f", "#2c7a7b", "#97266d"];
let membership = null;   // the latest membership frame
let skew = 0;            // server now - browser now, ms
let statistics = null;
let shards = null;
let reminders = null;
let picked = null;       // {actor, name} whose runs are shown
let level = "1m";
const RUNS_SHOWN = 10;   // the newest runs shown of the picked reminder

// ---- units -------------------------------------------------------------------

const NUMBER = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
const INTEGER = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });

/** A count or plain figure: grouped digits, at most one decimal. */
function num(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return "-";
  return Math.abs(n) >= 100 ? INTEGER.format(n) : NUMBER.format(n);
}

/** Bytes as B, KiB, MiB, GiB or TiB. */
function bytes(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i === 0 ? INTEGER.format(n) : NUMBER.format(n)} ${units[i]}`;
}

/** A duration in ms as ms, s, min, h or days. */
function duration(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "-";
  const a = Math.abs(ms), sign = ms < 0 ? "-" : "";
  if (a < 1000) return `${sign}${INTEGER.format(a)} ms`;
  if (a < 60000) return `${sign}${NUMBER.format(a / 1000)} s`;
  if (a < 3600000) return `${sign}${NUMBER.format(a / 60000)} min`;
  if (a < 86400000) return `${sign}${NUMBER.format(a / 3600000)} h`;
  return `${sign}${NUMBER.format(a / 86400000)} days`;
}

/** Per second. */
function rate(perSecond) {
  return `${num(perSecond)}/s`;
}

/** How each charted statistic is drawn: its title, unit and whether it is a
 * running total charted as its rate. */
const STATS = {
  cpu_percent: { title: "CPU", fmt: (v) => `${num(v)} %` },
  memory_bytes: { title: "Memory (resident)", fmt: bytes },
  probe_rtt_p99_ms: { title: "Probe round trip, p99", fmt: duration },
  table_writes: { title: "Membership table writes", fmt: rate, total: true },
  tick_lateness_p50_ms: { title: "Reminder tick lateness, p50", fmt: duration },
  tick_lateness_p99_ms: { title: "Reminder tick lateness, p99", fmt: duration },
};

function now() { return Date.now() + skew; }

function age(ms) {
  return `${duration(Math.max(0, now() - ms))} ago`;
}

/** When something is due: "in 1.2 s" or "3 s ago" (overdue). */
function due(ms) {
  if (ms === null || ms === undefined) return "-";
  const d = ms - now();
  return d >= 0 ? `in ${duration(d)}` : `${duration(-d)} overdue`;
}

/** A periodic reminder's next occurrence from one the server computed at its
 * last read (every 15 s), moved on by whole periods; others as they were. */
function nextDue(dueMs, periodMs) {
  if (dueMs === null || dueMs === undefined || !periodMs) return dueMs;
  const behind = now() - dueMs;
  return behind > 0 ? dueMs + Math.ceil(behind / periodMs) * periodMs : dueMs;
}

function clock(ms) {
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19);
}

function hhmmss(ms) {
  return new Date(ms).toISOString().slice(11, 19);
}

function hhmm(ms) {
  return new Date(ms).toISOString().slice(11, 16);
}

function text(tag, value, cls) {
  const el = document.createElement(tag);
  el.textContent = value;
  if (cls) el.className = cls;
  return el;
}

function row(cells, cls) {
  const tr = document.createElement("tr");
  if (cls) tr.className = cls;
  for (const c of cells) tr.append(c instanceof Node ? c : text("td", c));
  return tr;
}

function cell(value, cls) { return text("td", value, cls); }

function schedule(r) {
  if (r.trigger_of) return `trigger of ${r.trigger_of}`;
  if (r.cron) return `cron ${r.cron}`;
  if (r.period_ms) return `every ${duration(r.period_ms)}`;
  return "once";
}

// ---- membership and history ---------------------------------------------------

function renderMembership() {
  if (!membership) return;
  const m = membership;
  $("#cluster").textContent = m.cluster;
  $("#version").textContent = m.version;
  const active = m.silos.filter((s) => s.status === "Active").length;
  $("#summary").textContent = `table version ${m.version} · ${num(m.silos.length)} silos · ${num(active)} active`;
  $("#silos tbody").replaceChildren(...m.silos.map((s) => {
    const tr = row([cell(s.endpoint), cell(s.generation), cell(s.status, "status"), cell(s.host || "-")]);
    tr.dataset.status = s.status;
    tr.dataset.silo = s.address;
    const alive = cell(age(s.i_am_alive_ms), "alive");
    if (s.status === "Active" && now() - s.i_am_alive_ms > 30000) alive.classList.add("stale");
    tr.append(alive);
    tr.append(cell(s.votes.length ? s.votes.map((v) => `${v.silo} (${age(v.time_ms)})`).join(", ") : "-", "votes"));
    return tr;
  }));
  $("#corrupt").replaceChildren(...m.corrupt.map((c) => text("p", `corrupt row ${c.key}: ${c.reason}`, "stale")));
}

function renderHistory(h) {
  $("#history").replaceChildren(...h.events.map((e) => {
    const li = document.createElement("li");
    li.append(text("span", `v${e.version}`, "v"), text("span", `${clock(e.time_ms)} `));
    li.append(text("b", e.silo), text("span", ` ${e.kind} → `), text("span", e.status, e.status));
    if (e.votes.length) li.append(text("span", ` · votes: ${e.votes.join(", ")}`, "note"));
    if (e.writer && e.writer !== e.silo) li.append(text("span", ` · by ${e.writer}`, "note"));
    return li;
  }));
  if (!h.events.length) $("#history").append(text("li", "no events (basic protocol mode keeps no history)", "note"));
}

// ---- shard map -----------------------------------------------------------------

function renderShards() {
  if (!shards) return;
  const s = shards;
  if (s.shards === null) {
    $("#shards-note").textContent = `service ${s.service}: no shard lease yet (no silo runs it)`;
    $("#shard-map").replaceChildren();
    $("#shard-holders").replaceChildren();
    return;
  }
  const count = (st) => s.rows.filter((r) => r.state === st).length;
  $("#shards-note").textContent = `service ${s.service} · ${num(s.shards)} shards · ${num(count("owned"))} owned · ${num(count("taken_over"))} taken over · ${num(count("fenced"))} fenced · ${num(count("released"))} released`;
  const holders = [...new Set(s.rows.map((r) => r.holder).filter(Boolean))].sort();
  const color = (h) => COLORS[holders.indexOf(h) % COLORS.length];
  $("#shard-holders").replaceChildren(...holders.map((h) => {
    const held = s.rows.filter((r) => r.holder === h && r.state !== "released").length;
    const key = text("span", `■ ${h}: ${num(held)} held  `);
    key.style.color = color(h);
    return key;
  }));
  $("#shard-map").replaceChildren(...s.rows.map((r) => {
    const div = document.createElement("div");
    div.className = "shard";
    div.dataset.state = r.state;
    div.dataset.shard = r.shard;
    if (r.holder && (r.state === "owned" || r.state === "taken_over")) div.style.borderLeftColor = color(r.holder);
    div.append(text("b", `#${r.shard} `), text("span", r.state.replace("_", " "), "state"), document.createElement("br"));
    if (r.holder) {
      div.append(text("span", r.holder.split("@")[0]), document.createElement("br"));
      // The watermark's age as the server read it, moved on by the time since.
      const lag = r.lag_ms === null ? null : r.lag_ms + (now() - s.now_ms);
      div.append(text("span", `epoch ${num(r.epoch)} · watermark ${lag === null ? "none" : `${duration(lag)} ago`}`, "note"));
      if (r.moved_from && r.moved_ms && now() - r.moved_ms < 60000) {
        div.append(document.createElement("br"),
          text("span", `from ${r.moved_from.split("@")[0]}, ${age(r.moved_ms)}`, "note"));
      }
    } else if (r.error) {
      div.append(text("span", r.error, "note"));
    }
    return div;
  }));
}

// ---- reminders -----------------------------------------------------------------

/** The due (or paused since) cell of a listed reminder. */
function when(e) {
  return e.paused_ms ? age(e.paused_ms) : due(nextDue(e.due_ms, e.period_ms));
}

/** Moves the listed reminders' due cells on in place: the rows are replaced
 * only when the server sends the panel again, so a click on one is not lost
 * to a redraw. */
function tickReminders() {
  document.querySelectorAll("#reminder-next tbody tr.pick, #reminder-paused tbody tr.pick").forEach((tr) => {
    if (tr.entry) tr.cells[3].textContent = when(tr.entry);
  });
}

function renderReminders() {
  const r = reminders;
  if (!r) return;
  $("#reminder-service").textContent = `service ${r.service} · ${num(r.total)} reminders`;
  $("#reminder-kinds tbody").replaceChildren(...r.kinds.map((k) =>
    row([cell(k.kind), cell(num(k.count), "num"), cell(num(k.paused), "num"),
      cell(k.next_due_ms === null ? "-" : `${hhmmss(k.next_due_ms)} UTC`)])));
  // (A kind's next due time is as of the server's read, every 15 s.)
  $("#reminders tbody").replaceChildren(...r.owners.map((o) => row([cell(o.silo), cell(num(o.count), "num")])));
  const pick = (e) => {
    const tr = row([cell(e.actor), cell(e.name), cell(schedule(e)), cell(when(e))], "pick");
    tr.entry = e;
    tr.dataset.actor = e.actor;
    tr.dataset.name = e.name;
    tr.addEventListener("click", () => { picked = { actor: e.actor, name: e.name }; loadRuns(); });
    return tr;
  };
  $("#reminder-next tbody").replaceChildren(...r.next.map(pick));
  $("#reminder-paused tbody").replaceChildren(...r.paused.map(pick));
  $("#paused-total").textContent = `${num(r.paused_total)} in all`;
  const parked = r.parked;
  if (!parked) {
    $("#parked-total").textContent = "-";
    $("#reminder-parked tbody").replaceChildren();
  } else if (parked.error) {
    $("#parked-total").textContent = parked.error;
  } else {
    $("#parked-total").textContent = `${num(parked.total)} in all (paused: resume one to replay it)`;
    $("#reminder-parked tbody").replaceChildren(...parked.rows.map((p) =>
      row([cell(p.actor), cell(p.name), cell(clock(p.scheduled_ms))])));
  }
}

async function loadRuns() {
  if (!picked) return;
  const box = $("#runs-box");
  box.hidden = false;
  $("#runs-of").textContent = `${picked.actor} ${picked.name}`;
  try {
    const q = new URLSearchParams(picked);
    const res = await fetch(`api/runs?${q}`);
    const body = await res.json();
    if (!res.ok) throw new Error(body.error || res.statusText);
    $("#runs tbody").replaceChildren(...body.runs.slice(0, RUNS_SHOWN).map((run) => {
      // Times come as RFC 3339 text.
      const [scheduled, at] = [Date.parse(run.scheduled), Date.parse(run.at)];
      const late = run.outcome === "skipped" ? "-" : duration(at - scheduled);
      const outcome = run.triggered ? `${run.outcome} (triggered)` : run.outcome;
      return row([cell(clock(scheduled)), cell(clock(at)), cell(late, "num"),
        cell(num(run.attempts), "num"), cell(outcome, run.outcome), cell(run.silo)]);
    }));
    if (!body.runs.length) $("#runs tbody").append(row([cell("no runs recorded yet")]));
  } catch (e) {
    $("#runs tbody").replaceChildren(row([cell(`could not read the runs: ${e.message}`)]));
  }
}

// ---- statistics ------------------------------------------------------------------

/** The points of one statistic as drawn: a running total becomes its rate per
 * second between consecutive buckets of the same silo. */
function series(name, points) {
  const bySilo = new Map();
  for (const p of points) {
    if (!bySilo.has(p.silo)) bySilo.set(p.silo, []);
    bySilo.get(p.silo).push({ t: p.t, v: p.mean });
  }
  if (STATS[name] && STATS[name].total) {
    for (const [silo, pts] of bySilo) {
      pts.sort((a, b) => a.t - b.t);
      const rates = [];
      for (let i = 1; i < pts.length; i++) {
        const dt = (pts[i].t - pts[i - 1].t) / 1000;
        if (dt > 0 && pts[i].v >= pts[i - 1].v) rates.push({ t: pts[i].t, v: (pts[i].v - pts[i - 1].v) / dt });
      }
      bySilo.set(silo, rates);
    }
  }
  return bySilo;
}

function chart(name, points) {
  const spec = STATS[name] || { title: name, fmt: num };
  const box = document.createElement("div");
  box.className = "chart";
  box.dataset.statistic = name;
  box.append(text("h3", spec.title));
  const bySilo = series(name, points);
  const all = [...bySilo.values()].flat();
  if (!all.length) {
    box.append(text("div", "no data yet", "legend"));
    return box;
  }
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 300 100");
  svg.setAttribute("preserveAspectRatio", "none");
  const ts = all.map((p) => p.t), vs = all.map((p) => p.v);
  const [t0, t1] = [Math.min(...ts), Math.max(...ts)];
  const [v0, v1] = [Math.min(0, ...vs), Math.max(...vs)];
  const x = (t) => (t1 > t0 ? ((t - t0) / (t1 - t0)) * 290 + 5 : 150);
  const y = (v) => (v1 > v0 ? 95 - ((v - v0) / (v1 - v0)) * 90 : 50);
  const legend = document.createElement("div");
  legend.className = "legend";
  [...bySilo.keys()].forEach((silo, i) => {
    const pts = bySilo.get(silo);
    if (!pts.length) return;
    const color = COLORS[i % COLORS.length];
    // One point is drawn as a round-capped zero-length segment: a dot that the
    // non-uniform scaling of the chart does not stretch.
    const drawn = pts.length > 1 ? pts : [pts[0], pts[0]];
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", drawn.map((p) => `${x(p.t)},${y(p.v)}`).join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke-width", pts.length > 1 ? "1.5" : "5");
    line.setAttribute("stroke-linecap", "round");
    line.setAttribute("vector-effect", "non-scaling-stroke");
    line.setAttribute("stroke", color);
    svg.append(line);
    const key = text("span", `■ ${silo}  `);
    key.style.color = color;
    legend.append(key);
  });
  // The value axis (its top and bottom, in the statistic's unit) and the time
  // axis (UTC, start to end) as text beside the drawing.
  const scale = document.createElement("div");
  scale.className = "scale";
  scale.append(text("span", spec.fmt(v1), "top"), text("span", spec.fmt(v0), "bottom"));
  const axis = document.createElement("div");
  axis.className = "time-axis";
  axis.append(text("span", `${hhmm(t0)} UTC`), text("span", t1 > t0 ? hhmm((t0 + t1) / 2) : ""), text("span", hhmm(t1)));
  const plot = document.createElement("div");
  plot.className = "plot";
  plot.append(scale, svg);
  box.append(plot, axis, legend);
  return box;
}

function renderStatistics() {
  const charts = $("#charts");
  if (!statistics) return;
  if (statistics.unsupported) {
    charts.replaceChildren(text("p", `no statistics: ${statistics.unsupported}`, "note"));
    return;
  }
  const points = statistics.levels[level] || [];
  charts.replaceChildren(...statistics.names.map((n) => chart(n, points.filter((p) => p.name === n))));
}

// ---- actor state -----------------------------------------------------------------

function renderState(s) {
  $("#state-service").textContent = `service ${s.service}`;
  $("#state-kinds tbody").replaceChildren(...s.kinds.map((k) => {
    const largest = k.largest.map((l) => `${l.actor}#${l.name} ${bytes(l.bytes)}`).join(", ") || "-";
    const expiring = k.expiring.length
      ? k.expiring.map((e) => `${e.actor}#${e.name} ${due(e.expires_ms)}`).join(", ")
      : "none";
    const tr = row([cell(k.kind), cell(num(k.states), "num"), cell(bytes(k.bytes), "num"), cell(largest, "wrap"),
      cell(k.expiring_total ? `${num(k.expiring_total)}: ${expiring}` : expiring, "wrap")]);
    tr.dataset.kind = k.kind;
    return tr;
  }));
  if (!s.kinds.length) $("#state-kinds tbody").append(row([cell("no actor kinds to show (see --state-kinds)")]));
}

function renderProblems(p) {
  const box = $("#problems");
  box.hidden = !p.problems.length;
  box.replaceChildren(...p.problems.map((m) => text("div", m)));
}

document.querySelectorAll(".levels button").forEach((b) => b.addEventListener("click", () => {
  level = b.dataset.level;
  document.querySelectorAll(".levels button").forEach((o) => o.classList.toggle("on", o === b));
  renderStatistics();
}));

const source = new EventSource("api/events");
source.onopen = () => { $("#connection").dataset.state = "live"; $("#connection").textContent = "live"; };
source.onerror = () => { $("#connection").dataset.state = "lost"; $("#connection").textContent = "reconnecting"; };
source.addEventListener("membership", (e) => {
  membership = JSON.parse(e.data);
  skew = membership.now_ms - Date.now();
  renderMembership();
});
source.addEventListener("history", (e) => renderHistory(JSON.parse(e.data)));
source.addEventListener("statistics", (e) => { statistics = JSON.parse(e.data); renderStatistics(); });
source.addEventListener("shards", (e) => { shards = JSON.parse(e.data); renderShards(); });
source.addEventListener("reminders", (e) => { reminders = JSON.parse(e.data); renderReminders(); loadRuns(); });
source.addEventListener("state", (e) => renderState(JSON.parse(e.data)));
source.addEventListener("problem", (e) => renderProblems(JSON.parse(e.data)));
setInterval(() => { renderMembership(); renderShards(); tickReminders(); }, 1000);

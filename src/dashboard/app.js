// rollcall dashboard: renders what the server pushes on api/events (server-sent
// events). Nothing here polls the server; one timer re-renders the ages each second.
"use strict";

const $ = (sel) => document.querySelector(sel);
const COLORS = ["#2b6cb0", "#c05621", "#2f855a", "#9b2c2c", "#6b46c1", "#b7791f", "#2c7a7b", "#97266d"];
let membership = null;   // the latest membership frame
let skew = 0;            // server now - browser now, ms
let statistics = null;
let level = "1m";

function text(tag, value, cls) {
  const el = document.createElement(tag);
  el.textContent = value;
  if (cls) el.className = cls;
  return el;
}

function age(ms) {
  const s = Math.max(0, (Date.now() + skew - ms) / 1000);
  return s >= 120 ? `${Math.floor(s / 60)}m ago` : `${s.toFixed(1)}s ago`;
}

function clock(ms) {
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19);
}

function renderMembership() {
  if (!membership) return;
  const m = membership;
  $("#cluster").textContent = m.cluster;
  $("#version").textContent = m.version;
  const active = m.silos.filter((s) => s.status === "Active").length;
  $("#summary").textContent = `table version ${m.version} · ${m.silos.length} silos · ${active} active`;
  const body = $("#silos tbody");
  body.replaceChildren(...m.silos.map((s) => {
    const tr = document.createElement("tr");
    tr.dataset.status = s.status;
    tr.dataset.silo = s.address;
    tr.append(text("td", s.endpoint), text("td", s.generation), text("td", s.status, "status"),
      text("td", s.host || "-"));
    const alive = text("td", age(s.i_am_alive_ms), "alive");
    if (s.status === "Active" && Date.now() + skew - s.i_am_alive_ms > 30000) alive.classList.add("stale");
    tr.append(alive);
    tr.append(text("td", s.votes.length ? s.votes.map((v) => `${v.silo} (${age(v.time_ms)})`).join(", ") : "-", "votes"));
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

function chart(name, points) {
  const box = document.createElement("div");
  box.className = "chart";
  box.append(text("h3", name));
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 300 100");
  svg.setAttribute("preserveAspectRatio", "none");
  const bySilo = new Map();
  for (const p of points) {
    if (!bySilo.has(p.silo)) bySilo.set(p.silo, []);
    bySilo.get(p.silo).push(p);
  }
  const ts = points.map((p) => p.t), vs = points.map((p) => p.mean);
  const [t0, t1] = [Math.min(...ts), Math.max(...ts)];
  const [v0, v1] = [Math.min(0, ...vs), Math.max(...vs)];
  const x = (t) => (t1 > t0 ? ((t - t0) / (t1 - t0)) * 290 + 5 : 150);
  const y = (v) => (v1 > v0 ? 95 - ((v - v0) / (v1 - v0)) * 90 : 50);
  const legend = document.createElement("div");
  legend.className = "legend";
  [...bySilo.keys()].forEach((silo, i) => {
    const color = COLORS[i % COLORS.length];
    const series = bySilo.get(silo);
    // One point is drawn as a round-capped zero-length segment: a dot that the
    // non-uniform scaling of the chart does not stretch.
    const pts = series.length > 1 ? series : [series[0], series[0]];
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.map((p) => `${x(p.t)},${y(p.mean)}`).join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke-width", series.length > 1 ? "1.5" : "5");
    line.setAttribute("stroke-linecap", "round");
    line.setAttribute("vector-effect", "non-scaling-stroke");
    line.setAttribute("stroke", color);
    svg.append(line);
    const key = text("span", `■ ${silo}  `);
    key.style.color = color;
    legend.append(key);
  });
  box.append(svg, legend, text("div", points.length ? `max ${v1.toPrecision(4)} · ${points.length} buckets` : "no data", "legend"));
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

function renderReminders(r) {
  $("#reminder-service").textContent = `service ${r.service} · ${r.total} reminders`;
  $("#reminders tbody").replaceChildren(...r.owners.map((o) => {
    const tr = document.createElement("tr");
    tr.append(text("td", o.silo), text("td", o.count));
    return tr;
  }));
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
source.addEventListener("reminders", (e) => renderReminders(JSON.parse(e.data)));
source.addEventListener("problem", (e) => renderProblems(JSON.parse(e.data)));
setInterval(renderMembership, 1000);

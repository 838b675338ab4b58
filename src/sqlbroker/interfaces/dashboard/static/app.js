// sqlbroker dashboard: a hash-routed page that polls the JSON API.
// Every value from the server is rendered as text (textContent / SVG nodes), never as HTML.
"use strict";

const CSRF = document.querySelector('meta[name="csrf-token"]').content;
const REFRESH_MS = Math.max(0.2, Number(document.querySelector('meta[name="refresh-seconds"]').content) || 2) * 1000;
const SVG = "http://www.w3.org/2000/svg";
const main = document.getElementById("main");
const selected = new Set();
let timer = null;
let paused = false;
let notice = null;
let extensions = [];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "className") node.className = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function num(value, digits) {
  if (value === null || value === undefined) return "-";
  return digits === undefined ? String(value) : Number(value).toFixed(digits);
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 60) return seconds.toFixed(1) + "s";
  if (seconds < 3600) return Math.floor(seconds / 60) + "m";
  if (seconds < 86400) return (seconds / 3600).toFixed(1) + "h";
  return (seconds / 86400).toFixed(1) + "d";
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 0.001) return Math.round(seconds * 1e6) + "µs";
  if (seconds < 1) return Math.round(seconds * 1000) + "ms";
  return seconds.toFixed(1) + "s";
}

function when(iso) {
  if (!iso) return "-";
  return iso.replace("T", " ").replace(/\.\d+/, "").replace("+00:00", "Z");
}

async function api(path, options) {
  const response = await fetch(path, Object.assign({ credentials: "same-origin" }, options || {}));
  const data = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

function post(path, body) {
  return api(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": CSRF },
    body: JSON.stringify(body),
  });
}

function card(label, value, testid) {
  return el("div", { className: "card" }, el("div", { className: "label" }, label),
    el("div", { className: "value", "data-testid": testid }, value));
}

function table(columns, rows, attrs) {
  const head = el("tr", {}, columns.map((c) => el("th", { className: c.num ? "num" : "" }, c.title)));
  const body = rows.length
    ? rows.map((row) => el("tr", row.attrs || {}, row.cells))
    : [el("tr", {}, el("td", { colspan: columns.length, className: "muted" }, (attrs && attrs.empty) || "nothing here"))];
  return el("table", attrs && attrs.testid ? { "data-testid": attrs.testid } : {}, el("thead", {}, head), el("tbody", {}, body));
}

function td(value, className, attrs) {
  return el("td", Object.assign({ className: className || "" }, attrs || {}), value);
}

function sparkline(values, width, height) {
  width = width || 120; height = height || 24;
  const max = Math.max(1, ...values);
  const step = values.length > 1 ? width / (values.length - 1) : width;
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(height - 2 - (v / max) * (height - 4)).toFixed(1)}`).join(" ");
  return svg("svg", { class: "spark", width, height, viewBox: `0 0 ${width} ${height}`, role: "img" },
    svg("title", {}, `last ${values.length} minutes, max ${max}/min`), svg("polyline", { points }));
}

function chart(series, options) {
  const width = 640, height = 160, left = 44, bottom = 18;
  const all = series.flatMap((s) => s.values.filter((v) => v !== null));
  const max = Math.max(options.min || 0, ...all, 0) || 1;
  const n = Math.max(1, ...series.map((s) => s.values.length));
  const x = (i) => left + (n > 1 ? (i * (width - left - 6)) / (n - 1) : 0);
  const y = (v) => height - bottom - (v / max) * (height - bottom - 8);
  const root = svg("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, "data-testid": options.testid });
  root.append(svg("line", { class: "axis", x1: left, y1: height - bottom, x2: width, y2: height - bottom }));
  root.append(svg("text", { x: 4, y: 12 }, options.format(max)));
  root.append(svg("text", { x: 4, y: height - bottom }, options.format(0)));
  root.append(svg("text", { x: left, y: height - 4 }, `${n} min ago`));
  root.append(svg("text", { x: width - 40, y: height - 4 }, "now"));
  for (const s of series) {
    const points = s.values.map((v, i) => (v === null ? null : `${x(i).toFixed(1)},${y(v).toFixed(1)}`)).filter(Boolean).join(" ");
    root.append(svg("polyline", { points, class: s.className || "", fill: "none", stroke: s.color || "#2f6fdf", "stroke-width": 1.5 }));
    // A value with no value beside it draws no line: mark it, so one minute of data shows.
    s.values.forEach((v, i) => {
      const alone = v !== null && (i === 0 || s.values[i - 1] === null) && (i === s.values.length - 1 || s.values[i + 1] === null);
      if (alone) root.append(svg("circle", { class: `point ${s.className || ""}`, cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 3, fill: s.color || "#2f6fdf" }));
    });
  }
  return root;
}

function link(href, text, testid) {
  return el("a", { href, "data-testid": testid }, text);
}

function showNotice(parent) {
  if (notice) parent.append(el("div", { className: notice.error ? "notice error" : "notice", "data-testid": "notice" }, notice.text));
}

// --- pages ----------------------------------------------------------------------------------

async function overview() {
  const data = await api("/api/overview");
  const subs = data.subscriptions;
  const totals = subs.reduce((acc, s) => ({ ready: acc.ready + s.ready, dead: acc.dead + s.dead }), { ready: 0, dead: 0 });
  const rows = subs.map((s) => ({
    attrs: { "data-subscription": s.subscription },
    cells: [
      td([
        link(`#/subscription/${encodeURIComponent(s.subscription)}`, s.subscription, "subscription-link"),
        s.paused ? el("span", { className: "badge", "data-testid": "paused", title: "claims paused: sqlbroker resume" }, "paused") : null,
        s.throttled ? el("span", { className: "badge", "data-testid": "throttled", title: "flow limits hold claims back: sqlbroker subscriptions flow" }, "throttled") : null,
      ]),
      td(num(s.ready), "num", { "data-testid": "ready" }),
      td(num(s.scheduled), "num"),
      td(num(s.running), "num", { "data-testid": "running" }),
      td(num(s.dead), s.dead ? "num bad" : "num", { "data-testid": "dead" }),
      td(age(s.oldest_ready_age), "num", { "data-testid": "lag" }),
      td(num(s.completed_per_minute, 1), "num", { "data-testid": "completed-rate" }),
      td(num(s.retried_per_minute, 1), "num"),
      td(num(s.dead_per_minute, 1), "num"),
      td(duration(s.handler_p50), "num"),
      td(duration(s.handler_p95), "num"),
      td(num(s.expired), "num"),
      td(num(s.replaced), "num", { "data-testid": "replaced" }),
      td(sparkline(data.series[s.subscription] || [])),
    ],
  }));
  const workers = data.workers.map((w) => ({
    cells: [td(w.name), td(w.subscriptions.join(", ")), td(when(w.started_at)),
      td(age(w.seen_age) + " ago", "num"),
      td(w.stopped_at ? "stopped" : data.alive.includes(w.name) ? "alive" : "silent", w.stopped_at || data.alive.includes(w.name) ? "" : "bad")],
  }));
  return [
    el("h1", {}, "Overview"),
    el("div", { className: "cards" },
      card("subscriptions", subs.length, "subscription-count"),
      card("ready", totals.ready, "total-ready"),
      card("dead letters", totals.dead, "total-dead"),
      card("workers alive", data.workers_alive, "workers-alive"),
      card("unrouted", data.unrouted.total, "unrouted"),
      card("database", data.backend, "backend")),
    table([
      { title: "subscription" }, { title: "ready", num: 1 }, { title: "scheduled", num: 1 },
      { title: "running", num: 1 }, { title: "dead", num: 1 }, { title: "lag", num: 1 },
      { title: "done/min", num: 1 }, { title: "retry/min", num: 1 }, { title: "dead/min", num: 1 },
      { title: "p50", num: 1 }, { title: "p95", num: 1 }, { title: "expired", num: 1 },
      { title: "replaced", num: 1 }, { title: "completed, last 30 min" },
    ], rows, { testid: "subscriptions", empty: "no subscriptions yet" }),
    el("h2", {}, "Workers"),
    table([{ title: "worker" }, { title: "subscriptions" }, { title: "started" }, { title: "last heartbeat", num: 1 }, { title: "state" }],
      workers, { testid: "workers", empty: "no worker has reported yet" }),
  ];
}

function pendingTable(rows, state) {
  return table([{ title: "id", num: 1 }, { title: "message id" }, { title: "topic" }, { title: "priority", num: 1 },
    { title: "key" }, { title: "attempts", num: 1 }, { title: state === "running" ? "lease until" : "available at" }, { title: "last error" }],
  rows.map((m) => ({ cells: [td(m.id, "num"), td(m.message_id), td(m.topic), td(m.priority, "num"), td(m.key || "-"),
    td(`${m.attempts}/${m.max_attempts}`, "num"), td(when(state === "running" ? m.lease_expires_at : m.available_at)),
    td(m.last_error ? m.last_error.slice(0, 80) : "-")] })),
  { testid: `pending-${state}`, empty: `no ${state} messages` });
}

async function subscriptionPage(name) {
  const data = await api(`/api/subscriptions/${encodeURIComponent(name)}`);
  const s = data.stats;
  const completed = data.series.map((p) => p.completed);
  const retried = data.series.map((p) => p.retried);
  const dead = data.series.map((p) => p.dead);
  const p50 = data.series.map((p) => p.handler_p50);
  const p95 = data.series.map((p) => p.handler_p95);
  return [
    el("h1", {}, `Subscription ${name}`),
    el("p", { className: "muted" }, `patterns: ${data.patterns.join(", ") || "-"}`),
    el("div", { className: "cards" },
      card("ready", s.ready, "ready"), card("scheduled", s.scheduled, "scheduled"), card("running", s.running, "running"),
      card("blocked", s.blocked, "blocked"), card("dead", s.dead, "dead"), card("lag", age(s.oldest_ready_age), "lag"),
      card("done/min", num(s.completed_per_minute, 1), "completed-rate"), card("p95", duration(s.handler_p95), "p95")),
    el("h2", {}, "Throughput per minute (completed, retried, dead)"),
    chart([{ values: completed }, { values: retried, color: "#d08a1e" }, { values: dead, color: "#c53b3b" }],
      { testid: "throughput-chart", format: (v) => String(Math.round(v)) }),
    el("h2", {}, "Handler time"),
    el("div", { className: "legend" }, el("span", { className: "p50" }, "— p50"), el("span", { className: "p95" }, "— p95")),
    chart([{ values: p50 }, { values: p95, className: "p95", color: "#d08a1e" }], { testid: "latency-chart", format: duration }),
    ...["available", "scheduled", "running", "blocked"].flatMap((state) => [
      el("h2", {}, state === "available" ? "Ready" : state[0].toUpperCase() + state.slice(1)),
      pendingTable(data.pending[state], state)]),
  ];
}

function deadFilters() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  return { subscription: params.get("subscription") || "", topic: params.get("topic") || "",
    error_type: params.get("error_type") || "", reason_contains: params.get("reason_contains") || "" };
}

function confirmAction(title, text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  const actor = document.getElementById("confirm-actor");
  actor.value = localStorage.getItem("sqlbroker-actor") || "";
  document.getElementById("confirm-note").value = "";
  paused = true;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      paused = false;
      const ok = dialog.returnValue === "ok";
      if (ok) localStorage.setItem("sqlbroker-actor", actor.value);
      resolve(ok ? { actor: actor.value, note: document.getElementById("confirm-note").value } : null);
    }, { once: true });
    dialog.showModal();
  });
}

async function act(action, ids) {
  const verb = action === "replay" ? "Replay" : "Purge";
  const answer = await confirmAction(`${verb} ${ids.length} dead letter(s)?`,
    action === "replay" ? `They go back to their subscriptions with attempts reset: ids ${ids.join(", ")}.`
      : `They are deleted for good: ids ${ids.join(", ")}.`);
  if (!answer) return;
  try {
    const result = await post(`/api/dead/${action}`, { ids, actor: answer.actor, note: answer.note });
    notice = { text: action === "replay" ? `Replayed ${result.replayed} dead letter(s).` : `Purged ${result.purged} dead letter(s).` };
    ids.forEach((id) => selected.delete(id));
  } catch (error) {
    notice = { text: `${verb} failed: ${error.message}`, error: true };
  }
  if (location.hash.startsWith("#/dead/")) location.hash = "#/dead";
  else refresh();
}

function auditTable(entries) {
  return table([{ title: "when" }, { title: "who" }, { title: "action" }, { title: "dead letters" }, { title: "why" }],
    entries.map((a) => ({ cells: [td(when(a.at)), td(a.actor), td(a.action), td((a.detail.dead_ids || []).join(", ")), td(a.detail.note || "-")] })),
    { testid: "audit", empty: "no replays or purges yet" });
}

async function deadPage() {
  const filters = deadFilters();
  const query = new URLSearchParams(Object.entries(filters).filter(([, v]) => v)).toString();
  const data = await api(`/api/dead${query ? "?" + query : ""}`);
  const ids = data.dead_letters.map((d) => d.id);
  for (const id of [...selected]) if (!ids.includes(id)) selected.delete(id);
  const form = el("form", { className: "filters", "data-testid": "dead-filters", onsubmit: (event) => {
    event.preventDefault();
    const params = new URLSearchParams();
    for (const [key, value] of new FormData(event.target)) if (value) params.set(key, value);
    location.hash = "#/dead" + (params.toString() ? "?" + params : "");
  } },
  el("label", {}, "subscription", el("select", { name: "subscription" }, el("option", { value: "" }, "any"),
    data.subscriptions.map((name) => el("option", { value: name, selected: name === filters.subscription }, name)))),
  el("label", {}, "topic", el("input", { name: "topic", value: filters.topic })),
  el("label", {}, "error type", el("input", { name: "error_type", value: filters.error_type })),
  el("label", {}, "reason contains", el("input", { name: "reason_contains", value: filters.reason_contains })),
  el("button", { type: "submit" }, "Filter"));
  const selectAll = el("input", { type: "checkbox", "aria-label": "select all", "data-testid": "select-all",
    checked: ids.length > 0 && ids.every((id) => selected.has(id)),
    onchange: (event) => { ids.forEach((id) => (event.target.checked ? selected.add(id) : selected.delete(id))); refresh(); } });
  const rows = data.dead_letters.map((d) => ({
    attrs: { "data-dead-id": d.id },
    cells: [
      td(el("input", { type: "checkbox", "aria-label": `select ${d.id}`, "data-testid": "select-dead", checked: selected.has(d.id),
        onchange: (event) => { event.target.checked ? selected.add(d.id) : selected.delete(d.id); refresh(); } })),
      td(link(`#/dead/${d.id}`, d.id, "dead-link"), "num"), td(d.subscription), td(d.topic),
      td((d.error_type ? `${d.error_type}: ${d.error_message || ""}` : d.reason) + (d.damaged ? ` (damaged row: ${d.damaged})` : "")), td(d.attempts, "num"),
      td(d.replay_count, "num"), td(when(d.dead_at))],
  }));
  const chosen = [...selected];
  const out = [el("h1", {}, "Dead letters"), form, el("div", { id: "notice-slot" })];
  out.push(el("div", { className: "actions" },
    el("button", { className: "primary", disabled: !chosen.length, "data-testid": "replay-selected", onclick: () => act("replay", chosen) }, `Replay selected (${chosen.length})`),
    el("button", { className: "danger", disabled: !chosen.length, "data-testid": "purge-selected", onclick: () => act("purge", chosen) }, `Purge selected (${chosen.length})`),
    el("span", { className: "muted" }, `${data.dead_letters.length} shown`)));
  out.push(table([{ title: selectAll }, { title: "id", num: 1 }, { title: "subscription" }, { title: "topic" }, { title: "error" },
    { title: "attempts", num: 1 }, { title: "replays", num: 1 }, { title: "dead at" }], rows, { testid: "dead-letters", empty: "no dead letters" }));
  out.push(el("h2", {}, "Recent replays and purges"), auditTable(data.audit));
  return out;
}

async function deadDetail(id) {
  const { dead_letter: d } = await api(`/api/dead/${encodeURIComponent(id)}`);
  const facts = [["subscription", d.subscription], ["topic", d.topic], ["message id", d.message_id], ["reason", d.reason],
    ["error", d.error_type ? `${d.error_type}: ${d.error_message || ""}` : "-"], ["attempts", `${d.attempts}/${d.max_attempts}`],
    ["replays", d.replay_count], ["priority", d.priority], ["key", d.key || "-"], ["enqueued", when(d.enqueued_at)],
    ["first failed", when(d.first_failed_at)], ["last failed", when(d.last_failed_at)], ["dead at", when(d.dead_at)],
    ["headers", JSON.stringify(d.headers)]];
  if (d.damaged) facts.push(["damaged row", d.damaged]);
  return [
    el("h1", {}, `Dead letter ${d.id}`),
    el("div", { className: "actions" },
      el("button", { className: "primary", "data-testid": "replay-one", onclick: () => act("replay", [d.id]) }, "Replay"),
      el("button", { className: "danger", "data-testid": "purge-one", onclick: () => act("purge", [d.id]) }, "Purge"),
      link("#/dead", "← all dead letters")),
    table([{ title: "field" }, { title: "value" }], facts.map(([k, v]) => ({ cells: [td(k), td(v)] })), { testid: "dead-facts" }),
    el("h2", {}, `Payload (${d.content_type})`), el("pre", { "data-testid": "payload" }, d.payload_text),
    el("h2", {}, "Traceback"), el("pre", { "data-testid": "traceback" }, d.traceback || "(none recorded)"),
  ];
}

async function auditPage() {
  const data = await api("/api/audit");
  return [el("h1", {}, "Audit: replays and purges"), auditTable(data.audit)];
}

async function extensionPage(name) {
  const data = await api(`/api/extensions/${encodeURIComponent(name)}`);
  const title = (extensions.find((p) => p.name === name) || { title: name }).title;
  if (!data.available) {
    return [el("h1", {}, title), el("p", { className: "muted", "data-testid": "not-available" },
      `${title} are not available in this build of the dashboard yet.`)];
  }
  return [el("h1", {}, data.title), data.note ? el("p", { className: "muted" }, data.note) : null,
    table(data.columns.map((c) => ({ title: c })), data.rows.map((row) => ({ cells: row.map((v) => td(typeof v === "object" && v !== null ? JSON.stringify(v) : v)) })),
      { testid: `extension-${name}` })];
}

// --- routing and refresh ------------------------------------------------------------------

function route() {
  const path = location.hash.replace(/^#/, "").split("?")[0] || "/";
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "subscription" && parts[1]) return ["overview", () => subscriptionPage(parts[1])];
  if (parts[0] === "dead" && parts[1]) return ["dead", () => deadDetail(parts[1])];
  if (parts[0] === "dead") return ["dead", deadPage];
  if (parts[0] === "audit") return ["audit", auditPage];
  if (parts[0] === "x" && parts[1]) return [parts[1], () => extensionPage(parts[1])];
  return ["overview", overview];
}

async function refresh() {
  clearTimeout(timer);
  const typing = document.activeElement && main.contains(document.activeElement) && ["INPUT", "SELECT"].includes(document.activeElement.tagName)
    && document.activeElement.type !== "checkbox";
  if (!paused && !document.hidden && !typing) {
    const [page, load] = route();
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === page);
    try {
      const nodes = await load();
      main.replaceChildren(...nodes.filter(Boolean));
      showNotice(document.getElementById("notice-slot") || main);
      document.getElementById("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      main.replaceChildren(el("div", { className: "notice error", "data-testid": "error" }, error.message));
    }
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

async function loadExtensions() {
  try {
    extensions = (await api("/api/extensions")).pages;
  } catch (error) {
    extensions = [];
  }
  const nav = document.getElementById("nav");
  for (const page of extensions) {
    nav.append(el("a", { href: `#/x/${encodeURIComponent(page.name)}`, "data-page": page.name, className: page.available ? "" : "planned" }, page.title));
  }
}

window.addEventListener("hashchange", () => { notice = null; refresh(); });
document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
loadExtensions().then(refresh);

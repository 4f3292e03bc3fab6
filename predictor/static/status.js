// Foreshock status page: reads this service's read-only API (no token) and, when the service was
// started with --mitigator-url, the mitigator's /status; redraws every `?refresh=` seconds (10).
// Everything from the API is written with textContent, never as HTML.
"use strict";

const params = new URLSearchParams(location.search);
const PERIOD_S = Math.max(2, Number(params.get("refresh")) || 10);
const LIST_LIMIT = 200;       // nodes listed
const HISTORY_FOR = 20;       // the top nodes whose history draws their trend
const MITIGATOR = (document.querySelector('meta[name="foreshock-mitigator"]').content || "").replace(/\/+$/, "");
const SVG = "http://www.w3.org/2000/svg";

let selected = decodeURIComponent((location.hash.match(/node=([^&]+)/) || [])[1] || "") || null;
let previous = new Map();     // node -> probability at the last refresh, for nodes without history

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

async function getJSON(path) {
  const r = await fetch(path, { headers: { Accept: "application/json" } });
  if (!r.ok) {
    let detail = r.statusText;
    try { detail = (await r.json()).detail || detail; } catch (_) { /* not JSON */ }
    const err = new Error(`${path}: ${r.status} ${detail}`);
    err.status = r.status;
    throw err;
  }
  return r.json();
}

function pct(p) {
  return (100 * p).toFixed(p < 0.01 ? 2 : 1) + "%";
}

function when(ms) {
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

function age(ms) {
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 2 * 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} days`;
}

function nodePath(node) {
  return "v1/nodes/" + encodeURIComponent(node);
}

// trend: the change over the last points of the history (or since the last refresh)
function trendOf(node, history) {
  if (history && history.length >= 2) {
    const last = history.slice(-10);
    return last[last.length - 1].probability - last[0].probability;
  }
  const p = previous.get(node.node);
  return p === undefined ? 0 : node.probability - p;
}

function sparkline(history, width, height) {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  if (!history || history.length < 2) return svg;
  const t0 = history[0].ts, t1 = history[history.length - 1].ts || t0 + 1;
  const x = (ts) => ((ts - t0) / Math.max(1, t1 - t0)) * (width - 2) + 1;
  const y = (p) => height - 1 - p * (height - 2);
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", history.map((h) => `${x(h.ts).toFixed(1)},${y(h.probability).toFixed(1)}`).join(" "));
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", history[history.length - 1].alert ? "#c0392b" : "#e08a3c");
  line.setAttribute("stroke-width", "1.5");
  line.setAttribute("vector-effect", "non-scaling-stroke");
  svg.append(line);
  return svg;
}

function trendCell(node, history) {
  const d = trendOf(node, history);
  const [cls, arrow] = d > 0.01 ? ["up", "▲"] : d < -0.01 ? ["down", "▼"] : ["flat", "▬"];
  const sign = d > 0 ? "+" : d < 0 ? "−" : "±";
  return el("div", { class: "trend" }, sparkline(history, 90, 22),
            el("span", { class: cls, title: "change over the last scores", text: `${arrow} ${sign}${pct(Math.abs(d))}` }));
}

function renderReady(ready) {
  const b = $("ready");
  b.textContent = ready.ready ? "ready" : `not ready: ${ready.reason}`;
  b.className = "badge " + (ready.ready ? "ok" : "bad");
}

function renderModel(model) {
  if (!model) {
    for (const id of ["model-version", "model-threshold", "model-horizon", "model-hash", "model-age"]) $(id).textContent = "—";
    $("model-version").textContent = "no model loaded";
    return;
  }
  $("model-version").textContent = model.version || "(unversioned: a model folder)";
  $("model-threshold").textContent = pct(model.threshold);
  $("model-horizon").textContent = `${model.horizon_minutes} min`;
  $("model-hash").textContent = model.feature_set_hash.slice(0, 12);
  $("model-hash").title = model.feature_set_hash;
  const trained = ((model.metrics || {}).training || {}).trained_at_ms;
  $("model-age").textContent = trained ? `${age(trained)} (trained ${when(trained)})` : "unknown (the model card does not say)";
}

function renderNodes(list, details) {
  const body = $("nodes").querySelector("tbody");
  body.replaceChildren();
  list.nodes.forEach((n, i) => {
    const d = details.get(n.node);
    const row = el("tr", { "data-node": n.node, class: (n.alert ? "alert " : "") + (n.node === selected ? "selected" : "") },
      el("td", { text: String(i + 1) }),
      el("td", { class: "node", text: n.node }),
      el("td", {}, el("div", { class: "prob" }, el("span", { class: "bar" }, el("i", { style: `width:${(100 * n.probability).toFixed(1)}%` })),
                        el("b", { text: pct(n.probability) }))),
      el("td", {}, trendCell(n, d && d.history)),
      el("td", {}, n.alert ? el("span", { class: "badge alert", text: "alert" }) : ""));
    row.addEventListener("click", () => select(n.node));
    body.append(row);
  });
  $("node-count").textContent = list.total > list.nodes.length ? `${list.nodes.length} of ${list.total}` : String(list.total);
  if (!list.total) body.append(el("tr", {}, el("td", { colspan: "5", class: "quiet", text: "no node scored yet" })));
}

function featureTable(features) {
  return el("table", {},
    el("thead", {}, el("tr", {}, el("th", { text: "feature" }), el("th", { text: "value" }), el("th", { text: "contribution" }))),
    el("tbody", {}, ...features.map((f) => el("tr", {},
      el("td", { class: "node", text: f.name }),
      el("td", { text: f.value === null ? "—" : Number(f.value).toPrecision(4) }),
      el("td", { class: f.contribution >= 0 ? "pos" : "neg", text: (f.contribution >= 0 ? "+" : "") + f.contribution.toFixed(3) })))));
}

function renderAlerts(alerting, details) {
  const box = $("alerts");
  box.replaceChildren();
  $("alert-count").textContent = String(alerting.total);
  if (!alerting.total) { box.append(el("p", { class: "quiet", text: "none" })); return; }
  for (const n of alerting.nodes) {
    const d = details.get(n.node);
    const title = el("h3", { class: "node", text: `${n.node}  ${pct(n.probability)}` });
    title.addEventListener("click", () => select(n.node));
    box.append(el("div", { class: "alert-node", "data-node": n.node }, title,
                  d ? featureTable(d.top_features) : el("p", { class: "quiet", text: "…" })));
  }
}

function renderDetail(d) {
  const box = $("detail");
  if (!selected) { box.hidden = true; return; }
  box.hidden = false;
  $("detail-node").textContent = selected;
  if (!d) { $("detail-summary").textContent = "not scored by this process"; return; }
  $("detail-summary").textContent =
    `${pct(d.probability)} probability of failing within ${d.horizon_minutes} min (threshold ${pct(d.threshold)}), ` +
    `${d.alert ? "IN ALERT" : "not in alert"}; scored at ${when(d.ts)} by model ${d.model_version || "(unversioned)"}.`;
  const chart = sparkline(d.history, 600, 160);
  const limit = document.createElementNS(SVG, "line");
  const yT = 159 - d.threshold * 158;
  for (const [k, v] of Object.entries({ x1: 0, x2: 600, y1: yT, y2: yT, stroke: "#c0392b", "stroke-dasharray": "4 4", "stroke-width": 1 })) limit.setAttribute(k, v);
  chart.prepend(limit);
  $("detail-history").replaceWith(chart);
  chart.id = "detail-history";
  const h = d.history;
  $("detail-range").textContent = h.length ? `${h.length} scores from ${when(h[0].ts)} to ${when(h[h.length - 1].ts)}; dashed: the threshold` : "";
  $("detail-features").replaceWith(Object.assign(featureTable(d.top_features), { id: "detail-features" }));
}

async function renderActions() {
  const box = $("actions");
  if (!MITIGATOR) {
    box.replaceChildren(el("p", { class: "quiet", text: "Not shown: start foreshock serve with --mitigator-url (the mitigator's address as your browser reaches it)." }));
    return;
  }
  let status;
  try {
    status = await getJSON(MITIGATOR + "/status");
  } catch (e) {
    box.replaceChildren(el("p", { class: "quiet", text: `The mitigator at ${MITIGATOR} does not answer: ${e.message}` }));
    $("breaker").replaceChildren();
    return;
  }
  const b = status.breaker || {};
  $("breaker").replaceChildren(el("span", { class: "badge " + (b.open ? "bad" : "ok"), text: b.open ? `breaker OPEN: ${b.reason}` : "breaker closed" }),
                               " ", status.dry_run ? el("span", { class: "badge", text: "dry run" }) : "");
  const rows = (status.recent_actions || []).slice().reverse();
  if (!rows.length) { box.replaceChildren(el("p", { class: "quiet", text: "no action recorded yet" })); return; }
  box.replaceChildren(el("table", { id: "actions-table" },
    el("thead", {}, el("tr", {}, ...["time", "node", "action", "status", "reason"].map((t) => el("th", { text: t })))),
    el("tbody", {}, ...rows.map((a) => el("tr", {},
      el("td", { text: when(a.ts) }), el("td", { class: "node", text: a.node }), el("td", { text: a.action }),
      el("td", {}, el("span", { class: "badge" + (a.status === "failed" ? " bad" : a.status === "succeeded" ? " ok" : ""), text: a.status + (a.dry_run ? " (dry run)" : "") })),
      el("td", { class: "quiet", text: a.reason }))))));
}

function select(node) {
  selected = node;
  history.replaceState(null, "", node ? `#node=${encodeURIComponent(node)}` : location.pathname + location.search);
  refresh(false);
}

let timer = null;

async function refresh(schedule = true) {
  if (schedule) { clearTimeout(timer); timer = setTimeout(refresh, PERIOD_S * 1000); }
  try {
    const [ready, list, alerting, model] = await Promise.all([
      fetch("readyz").then((r) => r.json()),
      getJSON(`v1/nodes?limit=${LIST_LIMIT}`),
      getJSON("v1/nodes?alert=true&limit=50"),
      getJSON("v1/model").catch((e) => { if (e.status === 503) return null; throw e; }),
    ]);
    const wanted = new Set([...list.nodes.slice(0, HISTORY_FOR).map((n) => n.node), ...alerting.nodes.map((n) => n.node)]);
    if (selected) wanted.add(selected);
    const details = new Map();
    await Promise.all([...wanted].map((node) => getJSON(nodePath(node)).then((d) => details.set(node, d)).catch(() => null)));
    renderReady(ready);
    renderModel(model);
    renderNodes(list, details);
    renderAlerts(alerting, details);
    renderDetail(selected ? details.get(selected) : null);
    previous = new Map(list.nodes.map((n) => [n.node, n.probability]));
    $("updated").textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC`;
    $("error").hidden = true;
  } catch (e) {
    $("error").textContent = `Cannot read the risk API: ${e.message}`;
    $("error").hidden = false;
  }
  await renderActions();
}

$("period").textContent = String(PERIOD_S);
$("detail-close").addEventListener("click", () => select(null));
refresh();

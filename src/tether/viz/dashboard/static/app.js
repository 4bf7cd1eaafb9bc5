"use strict";
// The dashboard's page: polls the JSON views every 5 s and redraws. Read-only, no outside resources.
const $ = (id) => document.getElementById(id);
const DASH = "-";
let namespace = new URLSearchParams(location.search).get("namespace") || "default";

async function get(path, params) {
  const response = await fetch(path + "?" + new URLSearchParams(params || {}));
  const doc = await response.json();
  if (!response.ok) throw new Error(doc.error || response.statusText);
  $("window").textContent = "rates over the last " + doc.window + ", from Prometheus";
  return doc.items;
}

const pct = (v) => v == null ? DASH : (v * 100).toFixed(2) + "%";
const rps = (v) => v == null ? DASH : v.toFixed(1) + "rps";
const ms = (v) => v == null ? DASH : (v >= 1 ? v.toFixed(0) : v.toFixed(1)) + "ms";
const grade = (v, good, fair) => v == null ? "dim" : v >= good ? "good" : v >= fair ? "fair" : "bad";

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text == null || text === "" ? DASH : String(text);
  if (cls) td.className = cls;
  return td;
}

function fill(id, rows, cells) {
  const body = $(id).querySelector("tbody");
  body.replaceChildren(...rows.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.name = r.name || r.src || "";
    tr.append(...cells(r));
    return tr;
  }));
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = cell("nothing yet", "dim");
    td.colSpan = $(id).querySelectorAll("th").length;
    tr.append(td);
    body.append(tr);
  }
}

function golden(s) {
  return s ? [cell(pct(s.success), grade(s.success, 0.95, 0.8)), cell(rps(s.rps)), cell(ms(s.latency_ms_p50)),
              cell(ms(s.latency_ms_p95)), cell(ms(s.latency_ms_p99))]
           : [cell(DASH, "dim"), cell(DASH, "dim"), cell(DASH, "dim"), cell(DASH, "dim"), cell(DASH, "dim")];
}

function meshed(r) {
  const [m, t] = (r.meshed || "0/0").split("/");
  return cell(r.meshed, m === t && t !== "0" ? "good" : "fair");
}

function drawGraph(edges) {
  const svg = $("graph");
  const names = [...new Set(edges.flatMap((e) => [e.src, e.dst]))].sort();
  const pos = {};
  names.forEach((n, i) => {
    const a = (2 * Math.PI * i) / Math.max(names.length, 1) - Math.PI / 2;
    pos[n] = [260 + 180 * Math.cos(a), 150 + 110 * Math.sin(a)];
  });
  const ns = "http://www.w3.org/2000/svg";
  const parts = [];
  for (const e of edges) {
    const [x1, y1] = pos[e.src], [x2, y2] = pos[e.dst];
    const line = document.createElementNS(ns, "line");
    line.setAttribute("x1", x1); line.setAttribute("y1", y1);
    line.setAttribute("x2", x1 + 0.88 * (x2 - x1)); line.setAttribute("y2", y1 + 0.88 * (y2 - y1));
    line.setAttribute("marker-end", "url(#arrow)");
    if (!e.secured) line.setAttribute("class", "plain");
    const title = document.createElementNS(ns, "title");
    title.textContent = e.src + " → " + e.dst + (e.secured ? " (mTLS)" : " (" + e.no_tls_reason + ")");
    line.append(title);
    parts.push(line);
  }
  for (const n of names) {
    const g = document.createElementNS(ns, "g");
    g.setAttribute("class", "node");
    const c = document.createElementNS(ns, "circle");
    c.setAttribute("cx", pos[n][0]); c.setAttribute("cy", pos[n][1]); c.setAttribute("r", 7);
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", pos[n][0] + 10); t.setAttribute("y", pos[n][1] + 4);
    t.textContent = n;
    g.append(c, t);
    parts.push(g);
  }
  const defs = document.createElementNS(ns, "defs");
  defs.innerHTML = '<marker id="arrow" viewBox="0 0 10 10" refX="5" refY="5" markerWidth="6" markerHeight="6" ' +
                   'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#5ad1a4"/></marker>';
  svg.replaceChildren(defs, ...parts);
}

const deploysOf = (rows) => rows.map((r) => r.name);

async function refresh() {
  try {
    const nss = await get("/api/namespaces");
    const select = $("namespace");
    const names = nss.map((r) => r.name);
    if (select.options.length !== names.length) {
      select.replaceChildren(...names.map((n) => new Option(n, n, false, n === namespace)));
    }
    fill("namespaces", nss, (r) => [cell(r.name), meshed(r), ...golden(r.stats)]);
    $("ns-title").textContent = "in " + namespace;
    const [workloads, edges, pods] = await Promise.all([
      get("/api/stat", {kind: "deployment", namespace}), get("/api/edges", {namespace}), get("/api/pods", {namespace})]);
    fill("workloads", workloads, (r) => [cell(r.name), meshed(r), ...golden(r.stats),
      cell(r.stats ? r.stats.tcp_open_connections : null),
      cell(r.stats ? pct(r.stats.mtls_share) : null, r.stats ? grade(r.stats.mtls_share, 1, 1) : "dim")]);
    fill("edges", edges, (e) => [cell(e.src), cell(e.dst), cell(e.secured ? "√ mTLS" : e.no_tls_reason,
      e.secured ? "good" : "bad"), cell(e.client_id.split(".serviceaccount.")[0]),
      cell(e.server_id.split(".serviceaccount.")[0])]);
    drawGraph(edges);
    fill("pods", pods, (p) => [cell(p.name), cell(p.phase), cell(p.meshed ? "yes" : "no", p.meshed ? "good" : "bad"),
      cell(p.identity.split(".serviceaccount.")[0], p.identity ? "good" : "dim"), cell(p.tap ? "enabled" : "off")]);
    if (!$("tap-resource").value && deploysOf(workloads).length) $("tap-resource").value = "deploy/" + deploysOf(workloads)[0];
    const target = $("route-target");
    const deploys = workloads.map((r) => r.name);
    if ([...target.options].map((o) => o.value).join() !== deploys.join()) {
      const keep = target.value;
      target.replaceChildren(...deploys.map((n) => new Option("deploy/" + n, n, false, n === keep)));
    }
    if (target.value) {
      const routes = await get("/api/routes", {namespace, resource: "deploy/" + target.value});
      fill("routes", routes, (r) => {
        const s = r.stats, total = s ? (s.actual_success_count || 0) + (s.actual_failure_count || 0) : 0;
        const actual = total ? s.actual_success_count / total : null;
        return [cell(r.name), cell(r.authority), ...golden(s), cell(pct(actual), grade(actual, 0.95, 0.8))];
      });
    }
    $("status").textContent = "updated " + new Date().toLocaleTimeString();
    $("status").className = "status";
  } catch (err) {
    $("status").textContent = String(err.message || err);
    $("status").className = "status error";
  }
}

// Live tap: an EventSource on /api/tap (a GET; closing it ends the tap).
let tapSource = null;
function stopTap(message) {
  if (tapSource) tapSource.close();
  tapSource = null;
  $("tap-start").disabled = false;
  $("tap-stop").disabled = true;
  if (message !== undefined) $("tap-status").textContent = message;
}
$("tap-start").addEventListener("click", () => {
  stopTap();
  const params = new URLSearchParams({namespace, resource: $("tap-resource").value || ""});
  if ($("tap-path").value) params.set("path", $("tap-path").value);
  $("tap").textContent = "";
  $("tap-status").textContent = "tapping " + $("tap-resource").value + "…";
  $("tap-status").className = "";
  tapSource = new EventSource("/api/tap?" + params);
  tapSource.addEventListener("message", (ev) => {
    const pre = $("tap");
    const lines = (pre.textContent ? pre.textContent.split("\n") : []).concat(JSON.parse(ev.data).line);
    pre.textContent = lines.slice(-200).join("\n");
    pre.scrollTop = pre.scrollHeight;
  });
  tapSource.addEventListener("failure", (ev) => {
    stopTap(JSON.parse(ev.data).error);
    $("tap-status").className = "error";
  });
  tapSource.onerror = () => { if (tapSource && tapSource.readyState === EventSource.CLOSED) stopTap("tap ended"); };
  $("tap-start").disabled = true;
  $("tap-stop").disabled = false;
});
$("tap-stop").addEventListener("click", () => stopTap("stopped"));

$("namespace").addEventListener("change", (ev) => { namespace = ev.target.value; refresh(); });
$("route-target").addEventListener("change", refresh);
refresh();
setInterval(refresh, 5000);

// The live cluster page: polls /status (and, with a token, /admin/parked)
// every two seconds and redraws. The admin token lives in sessionStorage
// and travels only in the Authorization header, never in a URL.
"use strict";

const REFRESH_MS = 2000;
const $ = (id) => document.getElementById(id);

function token() { return sessionStorage.getItem("ordo-admin-token") || ""; }

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("data-")) e.setAttribute(k, v); else e[k] = v;
  }
  for (const c of children) e.append(c);
  return e;
}

// colour gives each owner a stable hue; the golden angle keeps names that
// differ in one character (n1, n2, n3) far apart on the wheel.
function colour(name) {
  if (!name) return "";
  let h = 0;
  for (const ch of name) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return `hsl(${Math.round((h * 137.508) % 360)} 70% 72%)`;
}

function fmt(n, digits) { return Number(n).toLocaleString(undefined, { maximumFractionDigits: digits ?? 0 }); }

function renderStatus(st) {
  $("node").textContent = "node " + st.node;
  const h = $("health");
  const d = st.degradation || {};
  h.className = "badge " + (!st.brokerConnected ? "down" : d.degraded ? "degraded" : "ok");
  h.textContent = !st.brokerConnected ? "broker not connected" : d.degraded ? "degraded: " + (d.reasons || []).join("; ") : "ok";
  $("updated").textContent = "updated " + new Date().toLocaleTimeString();

  const members = $("members");
  members.replaceChildren(...st.members.map((m) => {
    const li = el("li", { class: m.state === "alive" ? "alive" : "gone", "data-member": m.name }, `${m.name} · ${m.state}`);
    li.style.borderLeftColor = colour(m.name);
    return li;
  }));

  let pending = 0, parked = 0, age = 0;
  const cells = (src) => src.partitions.map((p) => {
    pending += p.pending; parked += p.parked; age = Math.max(age, p.oldestPendingSeconds);
    const cls = ["cell"];
    if (!p.leaseLive) cls.push("free");
    if (p.parked > 0) cls.push("parked");
    if (p.oldestPendingSeconds > 10) cls.push("stale");
    const cell = el("div", { class: cls.join(" "), "data-partition": String(p.partition), "data-source": src.name,
      title: `source ${src.name}, partition ${p.partition}\nowner ${p.owner || "none"} (epoch ${p.epoch})\nassigned to ${src.assignment[p.partition] || "-"}\npending ${p.pending}${p.pendingEstimated ? " (estimate)" : ""}, parked ${p.parked}\noldest ${fmt(p.oldestPendingSeconds, 1)} s` },
      el("div", { class: "p" }, String(p.partition)),
      el("div", {}, fmt(p.pending) + (p.pendingEstimated ? "~" : "")),
      el("div", {}, fmt(p.oldestPendingSeconds, 1) + " s"));
    if (p.leaseLive) cell.style.background = colour(p.owner);
    return cell;
  });
  // One source named default (the one-source form) is drawn as before
  // sources existed: one grid. Several are grouped, one heading each.
  const sources = st.sources && st.sources.length ? st.sources
    : [{ name: "default", reachable: true, partitions: st.partitions, assignment: st.assignment }];
  const grid = $("grid");
  if (sources.length === 1 && sources[0].name === "default") {
    grid.replaceChildren(...cells(sources[0]));
  } else {
    grid.replaceChildren(...sources.map((src) => el("section", { class: "source" + (src.reachable ? "" : " down"), "data-source": src.name },
      el("h3", {}, `source ${src.name}` + (src.reachable ? "" : " · database unreachable from this node")),
      el("div", { class: "cells" }, ...cells(src)))));
  }
  $("s-pending").textContent = fmt(pending);
  $("s-parked").textContent = fmt(parked);
  $("s-age").textContent = fmt(age, 1);
  $("s-members").textContent = st.members.filter((m) => m.state === "alive").length;
  const hist = st.history || [];
  const last = hist[hist.length - 1];
  $("s-rate").textContent = last ? fmt(last.processedPerSecond) : "–";
  chart($("chart-rate"), hist, [["processedPerSecond", "#2563eb"], ["producedPerSecond", "#16a34a"]]);
  chart($("chart-lag"), hist, [["maxAgeSeconds", "#b45309"]]);
}

// chart draws series of samples as lines, scaled to the largest value.
function chart(canvas, hist, series) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, hgt = canvas.height, pad = 28;
  ctx.clearRect(0, 0, w, hgt);
  ctx.font = "11px system-ui"; ctx.fillStyle = "#666";
  if (hist.length < 2) { ctx.fillText("collecting…", pad, hgt / 2); return; }
  const t0 = hist[0].at, t1 = hist[hist.length - 1].at;
  let top = 1;
  for (const [k] of series) for (const s of hist) top = Math.max(top, s[k]);
  ctx.strokeStyle = "#e5e7eb"; ctx.beginPath(); ctx.moveTo(pad, hgt - pad); ctx.lineTo(w, hgt - pad); ctx.stroke();
  ctx.fillText(fmt(top, 1), 2, 12); ctx.fillText("0", 2, hgt - pad);
  ctx.fillText(Math.round((t1 - t0) / 1000) + " s", w - 40, hgt - 8);
  series.forEach(([k, c], i) => {
    ctx.strokeStyle = c; ctx.lineWidth = 1.5; ctx.beginPath();
    hist.forEach((s, j) => {
      const x = pad + (w - pad) * (s.at - t0) / Math.max(1, t1 - t0);
      const y = hgt - pad - (hgt - pad - 8) * s[k] / top;
      if (j === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
    ctx.fillStyle = c; ctx.fillText(k.replace("PerSecond", "/s"), pad + 8 + i * 120, hgt - 8);
  });
}

async function admin(method, path, body) {
  const headers = { "Authorization": "Bearer " + token(), "X-Ordo-Operator": "cluster-page" };
  if (body) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers, body: body ? JSON.stringify(body) : undefined, cache: "no-store" });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(data.error || resp.statusText);
  return data;
}

function renderParked(list) {
  const tbody = $("parked").querySelector("tbody");
  tbody.replaceChildren(...list.map((p) => {
    const act = (what) => el("button", { type: "button", "data-action": what, onclick: () => act1(what, p.id) }, what);
    return el("tr", { "data-id": p.id },
      el("td", {}, p.id), el("td", {}, String(p.partition)), el("td", {}, p.correlationId),
      el("td", {}, String(p.keySeq)), el("td", {}, String(p.attempts)), el("td", {}, String(p.waiting)),
      el("td", { class: "err" }, p.lastError), el("td", {}, act("retry"), " ", act("skip")));
  }));
  $("parked-empty").textContent = list.length ? "" : "no parked messages";
}

async function act1(what, id) {
  try {
    await admin("POST", `/admin/messages/${encodeURIComponent(id)}/${what}`);
    say(`${what}: ${id}`);
  } catch (e) { say(`${what} ${id}: ${e.message}`); }
  refresh();
}

function say(msg) { $("action-result").textContent = msg; }

async function refresh() {
  try {
    const resp = await fetch("/status", { cache: "no-store" });
    if (!resp.ok) throw new Error((await resp.json().catch(() => ({}))).error || resp.statusText);
    renderStatus(await resp.json());
  } catch (e) {
    $("health").className = "badge down";
    $("health").textContent = "status unavailable: " + e.message;
  }
  if (!token()) {
    $("token-state").textContent = "enter the node's admin token to list and act on parked messages";
    return;
  }
  try {
    renderParked(await admin("GET", "/admin/parked?limit=200"));
    $("token-state").textContent = "token set";
  } catch (e) { $("token-state").textContent = "parked messages: " + e.message; }
}

$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem("ordo-admin-token", $("token").value.trim());
  $("token").value = "";
  refresh();
});

$("bulk-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const body = { errorContains: $("bulk-error").value.trim(), keyPrefix: $("bulk-prefix").value.trim() };
  try {
    const r = await admin("POST", "/admin/retry", body);
    say(`bulk retry: ${r.retried} message(s)`);
  } catch (e) { say("bulk retry: " + e.message); }
  refresh();
});

refresh();
setInterval(refresh, REFRESH_MS);

// gwtf status --serve: polls /status.json (the object `gwtf status --json` prints, plus `live`)
// and redraws when its version changes: the routing picture (/routing.svg, drawn by the server from
// the same read), the headline, loss and tokens/s charts, stages, sync problems and events.
// Data is written with textContent only. window.gwtf exposes what was rendered and how long it took.
"use strict";

const POLL_MS = 1000;
const FETCH_TIMEOUT_MS = 5000;
const KEEP_RENDERS = 50;
const SVG_NS = "http://www.w3.org/2000/svg";
const gwtf = (window.gwtf = { version: null, last: null, renders: [], failures: 0 });

function short(peer) { return peer.length > 8 ? "…" + peer.slice(-6) : peer; }
function fmt(x, digits) { return x === null || x === undefined ? "-" : Number(x).toFixed(digits); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children) node.append(child);
  return node;
}

function svgEl(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

async function fetchWithin(url, ms) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), ms);
  try { return await fetch(url, { cache: "no-store", signal: abort.signal }); }
  finally { clearTimeout(timer); }
}

function renderHeadline(data) {
  const headline = document.getElementById("headline");
  if (!data.run_id) { headline.textContent = "waiting for the first read of the swarm…"; return; }
  const spec = data.spec, flow = data.flow;
  const oracle = flow.oracle_units === null ? "" : ` (oracle ${flow.oracle_units})`;
  const sync = el("span", { class: "badge " + (data.replicas_in_sync ? "yes" : "no") },
                  data.replicas_in_sync ? "replicas in sync" : "replicas NOT in sync");
  headline.replaceChildren(
    `run ${data.run_id} · ${spec.model_family}-${spec.model_preset} · ${spec.n_stages} stages · iteration `,
    el("b", {}, String(data.iteration)), " · loss ", el("b", {}, fmt(data.loss, 4)), " · ",
    el("b", {}, fmt(data.tokens_per_s, 0)), " tok/s · flow ", el("b", {}, String(flow.units)),
    ` unit(s)${oracle} · `, sync);
}

function renderReadState(live) {
  const now = Date.now() / 1000;
  const ago = live.read_at_s === null ? "no read yet" : `read ${Math.max(0, now - live.read_at_s).toFixed(0)} s ago`;
  document.getElementById("readstate").textContent = `${ago} · ${live.reads} read(s)`;
  const banner = document.getElementById("banner");
  banner.hidden = !live.error;
  if (live.error) banner.textContent = `last read failed: ${live.error}` +
    (live.read_at_s === null ? "" : " (showing the last good read)");
}

function renderChart(id, series, key, digits) {
  const svg = document.getElementById(id);
  const points = series.filter((p) => p[key] !== null && p[key] !== undefined);
  const [w, h, left, bottom] = [420, 150, 48, 20];
  const children = [svgEl("line", { class: "axis", x1: left, y1: 6, x2: left, y2: h - bottom }),
                    svgEl("line", { class: "axis", x1: left, y1: h - bottom, x2: w - 6, y2: h - bottom })];
  if (points.length < 2) {
    children.push(svgEl("text", { class: "empty", x: left + 10, y: h / 2 }, "not enough iterations yet"));
    svg.replaceChildren(...children);
    return;
  }
  const t0 = points[0].at_s, t1 = points[points.length - 1].at_s;
  const values = points.map((p) => p[key]);
  let lo = Math.min(...values), hi = Math.max(...values);
  if (hi === lo) { lo -= 1; hi += 1; }
  const x = (t) => left + (w - left - 6) * (t1 > t0 ? (t - t0) / (t1 - t0) : 1);
  const y = (v) => 6 + (h - bottom - 6) * (1 - (v - lo) / (hi - lo));
  children.push(svgEl("polyline", { class: "line", points: points.map((p) => `${x(p.at_s).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ") }));
  children.push(svgEl("text", { x: 2, y: 14 }, fmt(hi, digits)), svgEl("text", { x: 2, y: h - bottom }, fmt(lo, digits)));
  children.push(svgEl("text", { x: left, y: h - 4 }, `iteration ${points[0].iteration}`),
                svgEl("text", { x: w - 6, y: h - 4, "text-anchor": "end" }, `${points[points.length - 1].iteration}`));
  svg.replaceChildren(...children);
}

function renderStages(data) {
  const rows = data.stages.map((stage) => {
    const unserved = stage.stage > 0 && stage.replicas.length === 0;
    const verdicts = stage.sync.replicas;
    const replicas = unserved ? ["no replica: the swarm waits for one"] : stage.replicas.map((peer) => {
      const v = verdicts[peer], hash = stage.hashes[peer] || "-";
      const at = v.iteration === null ? "" : ` @${v.iteration}`;
      return el("span", { class: "replica", "data-peer": peer }, `${short(peer)} ${hash.slice(0, 8)}${at} `,
                el("span", { class: "badge " + v.status }, v.status.replace("_", " ")));
    });
    const name = stage.stage === 0 ? "0 (data holders)" : String(stage.stage);
    return el("tr", { class: unserved ? "unserved" : "", "data-stage": stage.stage }, el("td", {}, name),
              el("td", {}, ...replicas), el("td", {}, String(stage.capacity)),
              el("td", {}, el("span", { class: "badge " + stage.sync.state }, stage.sync.state.replace("_", " "))));
  });
  document.querySelector("#stages tbody").replaceChildren(...rows);
  document.getElementById("sync-problems").replaceChildren(...(data.sync_problems || []).map((line) => el("li", {}, line)));
}

function renderEvents(live) {
  const items = live.events.map((e) => el("li", { "data-kind": e.kind },
    el("time", {}, new Date(e.at_s * 1000).toLocaleTimeString()), el("span", { class: "badge " + e.kind }, e.kind),
    " " + e.text));
  document.getElementById("events").replaceChildren(...items);
}

async function renderGraph(version) {
  const response = await fetchWithin(`/routing.svg?v=${version}`, FETCH_TIMEOUT_MS);
  if (!response.ok) return false;
  const doc = new DOMParser().parseFromString(await response.text(), "image/svg+xml");
  const svg = doc.documentElement;
  if (svg.nodeName !== "svg") return false;
  document.getElementById("graph").replaceChildren(document.importNode(svg, true));
  return true;
}

function highlight(event) {
  const graph = document.getElementById("graph");
  const node = event.target.closest && event.target.closest(".node");
  const peer = node ? node.getAttribute("data-peer") : null;
  for (const edge of graph.querySelectorAll(".edge")) {
    edge.classList.toggle("dim", peer !== null && edge.dataset.from !== peer && edge.dataset.to !== peer);
  }
}

async function render(data) {
  const started = performance.now();
  const live = data.live;
  const graphDrawn = data.run_id ? await renderGraph(live.version) : false;
  const fetched = performance.now();
  renderHeadline(data);
  renderReadState(live);
  if (data.run_id) {
    renderStages(data);
    renderChart("loss-chart", live.series, "loss", 3);
    renderChart("tps-chart", live.series, "tokens_per_s", 0);
  }
  renderEvents(live);
  document.body.getBoundingClientRect();  // include style and layout in the measured time
  const done = performance.now();
  gwtf.renders.push({ version: live.version, nodes: (data.nodes || []).length, total_ms: done - started,
                      svg_fetch_ms: fetched - started, dom_ms: done - fetched });
  if (gwtf.renders.length > KEEP_RENDERS) gwtf.renders.shift();
  gwtf.version = live.version;
  gwtf.last = data;
  document.body.dataset.version = String(live.version);
  document.body.dataset.graph = graphDrawn ? "drawn" : "none";
}

async function poll() {
  try {
    const since = gwtf.version === null ? "" : `?since=${gwtf.version}`;
    const response = await fetchWithin(`/status.json${since}`, FETCH_TIMEOUT_MS);
    if (response.status === 204) {  // nothing new: only the age of the last read changes
      if (gwtf.last) renderReadState(gwtf.last.live);
    } else {
      const data = await response.json();
      if (data.live && data.live.version !== gwtf.version) await render(data);
      else if (data.live) renderReadState(data.live);
    }
  } catch (error) {
    gwtf.failures += 1;
    const banner = document.getElementById("banner");
    banner.hidden = false;
    banner.textContent = `the page cannot reach gwtf status (${error.name}); retrying`;
  }
  setTimeout(poll, POLL_MS);
}

document.getElementById("graph").addEventListener("mouseover", highlight);
poll();

// quartet inspect: the page. Plain DOM and SVG; every text from a run is set with textContent (a rollout
// may hold anything a model or a tool wrote), never parsed as HTML.
"use strict";

const state = { runs: [], run: 0, step: null, steps: [], offset: 0, sample: null, colorBy: null };
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

async function api(path) {
  const res = await fetch(path);
  if (!res.ok) throw new Error(`${path}: ${res.status} ${await res.text()}`);
  return res.json();
}

function fmt(v, digits = 3) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(digits);
  return String(v);
}

// ---- views -------------------------------------------------------------------------------------------

function show(view) {
  for (const s of document.querySelectorAll(".view")) s.classList.toggle("active", s.id === `view-${view}`);
  for (const b of document.querySelectorAll(".tab")) b.classList.toggle("active", b.dataset.view === view);
  document.body.dataset.view = view;
}

// ---- overview: the curves of `quartet plot`, hover a step for its values --------------------------------

const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

function chart(title, series) {
  const W = 440, H = 220, L = 50, R = 10, T = 10, B = 25;
  const box = el("div", { class: "panel" });
  box.appendChild(el("h3", {}, title));
  const names = Object.keys(series).filter((k) => series[k].length);
  if (!names.length) { box.appendChild(el("p", {}, "no data")); return box; }
  const pts = names.flatMap((k) => series[k]);
  const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) x1 = x0 + 1;
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", H);
  const line = (x1_, y1_, x2_, y2_, stroke) => {
    const l = document.createElementNS(ns, "line");
    for (const [k, v] of Object.entries({ x1: x1_, y1: y1_, x2: x2_, y2: y2_, stroke })) l.setAttribute(k, v);
    svg.appendChild(l); return l;
  };
  const label = (x, y, text, anchor) => {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("font-size", "10"); t.setAttribute("text-anchor", anchor);
    t.textContent = text; svg.appendChild(t);
  };
  line(L, H - B, W - R, H - B, "#999"); line(L, T, L, H - B, "#999");
  label(L - 4, sy(y0) + 3, fmt(y0, 3), "end"); label(L - 4, sy(y1) + 8, fmt(y1, 3), "end");
  label(sx(x0), H - 8, String(x0), "middle"); label(sx(x1), H - 8, String(x1), "middle");
  names.forEach((k, i) => {
    const p = document.createElementNS(ns, "polyline");
    p.setAttribute("points", series[k].map(([x, y]) => `${sx(x)},${sy(y)}`).join(" "));
    p.setAttribute("fill", "none"); p.setAttribute("stroke", COLORS[i % COLORS.length]); p.setAttribute("stroke-width", "1.5");
    p.dataset.metric = k;
    svg.appendChild(p);
  });
  const cursor = line(0, T, 0, H - B, "#555"); cursor.setAttribute("visibility", "hidden");
  const steps = [...new Set(xs)].sort((a, b) => a - b);
  const tip = $("tooltip");
  svg.addEventListener("mousemove", (ev) => {
    const r = svg.getBoundingClientRect();
    const x = x0 + ((ev.clientX - r.left - L) / (W - L - R)) * (x1 - x0);
    const step = steps.reduce((a, b) => (Math.abs(b - x) < Math.abs(a - x) ? b : a));
    cursor.setAttribute("x1", sx(step)); cursor.setAttribute("x2", sx(step)); cursor.setAttribute("visibility", "visible");
    const lines = [`step ${step}`];
    for (const k of names) { const hit = series[k].find((p) => p[0] === step); if (hit) lines.push(`${k}: ${fmt(hit[1], 4)}`); }
    tip.textContent = lines.join("\n"); tip.hidden = false;
    tip.style.left = `${ev.clientX + 12}px`; tip.style.top = `${ev.clientY + 12}px`;
  });
  svg.addEventListener("mouseleave", () => { tip.hidden = true; cursor.setAttribute("visibility", "hidden"); });
  box.appendChild(svg);
  const legend = el("div", { class: "legend" });
  names.forEach((k, i) => { const s = el("span", {}, `— ${k}`); s.style.color = COLORS[i % COLORS.length]; legend.appendChild(s); });
  box.appendChild(legend);
  return box;
}

async function loadOverview() {
  const data = await api(`/api/run/${state.run}/curves`);
  const panels = $("panels"); panels.replaceChildren();
  for (const [title, series] of Object.entries(data.panels)) panels.appendChild(chart(title, series));
  const pick = $("metric-pick"), chosen = pick.value;
  pick.replaceChildren(el("option", { value: "" }, "(choose)"));
  for (const k of Object.keys(data.metrics).sort()) pick.appendChild(el("option", { value: k }, k));
  pick.value = chosen;
  state.metrics = data.metrics;
  drawExtra();
}

function drawExtra() {
  const box = $("extra-panels"); box.replaceChildren();
  const k = $("metric-pick").value;
  if (k && state.metrics && state.metrics[k]) box.appendChild(chart(k, { [k]: state.metrics[k] }));
}

// ---- steps -----------------------------------------------------------------------------------------------

async function loadSteps() {
  const [steps, alarms] = await Promise.all([api(`/api/run/${state.run}/steps`), api(`/api/run/${state.run}/alarms`)]);
  showAlarms(alarms);
  const kinds = Object.fromEntries(alarms.map((a) => [a.step, alarmName(a.alarm)]));
  const known = state.steps.map((s) => `${s.step}:${s.alarm}`).join(",");
  state.steps = steps;
  if (steps.map((s) => `${s.step}:${s.alarm}`).join(",") === known) return false;
  const sel = $("step"); sel.replaceChildren();
  for (const s of steps) {
    const label = `${s.step} (${s.samples})${s.tokens ? "" : " no tokens"}${s.alarm ? ` \u26a0 ${kinds[s.step] || "mismatch"} (${s.alarm})` : ""}`;
    sel.appendChild(el("option", s.alarm ? { value: s.step, class: "alarm", "data-alarm": s.alarm } : { value: s.step }, label));
  }
  if (state.step === null || !steps.some((s) => s.step === state.step)) state.step = steps.length ? steps[steps.length - 1].step : null;
  sel.value = state.step;
  $("live").textContent = `${steps.length} recorded step(s)`;
  return true;
}

// an alarm record's kind as the step list names it: `mismatch` (trainer.mismatch_alarm), `no signal`
// (trainer.no_signal_steps)
function alarmName(kind) {
  return kind === "no_signal" ? "no signal" : "mismatch";
}

// the header's badge: which steps tripped the log-prob mismatch alarm (trainer.mismatch_alarm) or the
// no-signal alarm (trainer.no_signal_steps), hover for why
function showAlarms(alarms) {
  const badge = $("alarms");
  const steps = [...new Set(alarms.map((a) => a.step))];
  const titles = { mismatch: "log-prob mismatch", "no signal": "no-signal" };
  const parts = [...new Set(alarms.map((a) => alarmName(a.alarm)))].map((kind) => {
    const at = [...new Set(alarms.filter((a) => alarmName(a.alarm) === kind).map((a) => a.step))];
    return `${titles[kind]} alarm at step ${at.join(", ")}`;
  });
  badge.hidden = steps.length === 0;
  badge.textContent = steps.length ? `\u26a0 ${parts.join("; ")}` : "";
  badge.title = alarms.map((a) => a.message).join("\n\n");
  badge.dataset.steps = steps.join(",");
}

// ---- samples ---------------------------------------------------------------------------------------------

function filterQuery() {
  const q = new URLSearchParams();
  for (const input of $("filters").elements) if (input.name && input.value !== "") q.set(input.name, input.value);
  return q;
}

async function loadSamples(append = false) {
  if (state.step === null) { $("sample-count").textContent = "no recorded steps yet (trainer.rollout_freq)"; return; }
  state.offset = append ? state.offset + 200 : 0;
  const q = filterQuery(); q.set("offset", state.offset); q.set("limit", 200);
  const t0 = performance.now();
  const data = await api(`/api/run/${state.run}/step/${state.step}/samples?${q}`);
  const body = $("sample-table").tBodies[0];
  if (!append) body.replaceChildren();
  for (const r of data.rows) {
    const tr = el("tr", { class: "sample-row", "data-row": r.row, "data-uid": r.uid });
    const cells = [r.row, fmt(r.score), fmt(r.reward), fmt(r.advantage), r.response_tokens, r.finish_reason,
      r.data_source, fmt(r.tool_errors, 0), fmt(r.drift, 4)];
    for (const c of cells) tr.appendChild(el("td", {}, String(c)));
    tr.appendChild(el("td", { class: "text" }, r.response));
    const g = el("td"); const a = el("a", { href: "#", class: "group-link" }, "group");
    a.addEventListener("click", (ev) => { ev.preventDefault(); ev.stopPropagation(); openGroup(r.uid); });
    g.appendChild(a); tr.appendChild(g);
    tr.addEventListener("click", () => openSample(state.step, r.row));
    body.appendChild(tr);
  }
  const srcSel = $("f-source"), chosen = srcSel.value;
  srcSel.replaceChildren(el("option", { value: "" }, "any"));
  for (const s of data.sources) srcSel.appendChild(el("option", { value: s }, s));
  srcSel.value = chosen;
  $("sample-count").textContent = `${data.matched} of ${data.total} samples at step ${data.step}`;
  $("sample-count").dataset.matched = data.matched;
  $("sample-count").dataset.ms = Math.round(performance.now() - t0);
  $("more").hidden = body.children.length >= data.matched;
}

// ---- one sample, token by token ------------------------------------------------------------------------

const DIVERGING = new Set(["advantages", "logprob_diff"]);

function colorOf(field, v, lo, hi) {
  if (v === null || v === undefined) return "transparent";
  if (DIVERGING.has(field)) {
    const m = Math.max(Math.abs(lo), Math.abs(hi)) || 1;
    const a = Math.min(1, Math.abs(v) / m) * 0.85;
    return v >= 0 ? `rgba(0,150,0,${a})` : `rgba(210,0,0,${a})`;
  }
  const t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
  return `rgba(60,90,220,${(0.1 + 0.8 * t).toFixed(3)})`;
}

function tokenInfo(tok, i) {
  const lines = [`token ${i}: ${JSON.stringify(tok.token_text)} (id ${tok.token_ids})`, `mask: ${tok.mask}`];
  for (const f of state.sample.token_fields) if (tok[f] !== undefined) lines.push(`${f}: ${fmt(tok[f], 5)}`);
  return lines.join("\n");
}

function renderTokens() {
  const s = state.sample; if (!s) return;
  const field = $("color-by").value;
  const values = s.tokens.map((t) => (field === "mask" ? t.mask : t[field])).filter((v) => v !== null && v !== undefined);
  const lo = values.length ? Math.min(...values) : 0, hi = values.length ? Math.max(...values) : 1;
  $("legend").textContent = field ? `${field}: ${fmt(lo, 4)} .. ${fmt(hi, 4)}` : "";
  const box = $("sample-turns"); box.replaceChildren();
  const turns = s.turns.length ? s.turns : [{ role: "assistant", start: 0, stop: s.tokens.length }];
  for (const turn of turns) {
    const model = turn.role === "assistant";
    const div = el("div", { class: model ? "turn" : "turn env", "data-role": turn.role });
    div.appendChild(el("div", { class: "who" }, `${model ? "model" : "environment"} · ${turn.role} · tokens ${turn.start}..${turn.stop - 1}`));
    const line = el("div", { class: "tokens" });
    for (let i = turn.start; i < turn.stop && i < s.tokens.length; i++) {
      const tok = s.tokens[i];
      const span = el("span", { class: tok.mask ? "tok" : "tok masked", "data-i": i }, tok.token_text);
      const v = field === "mask" ? tok.mask : tok[field];
      span.style.background = colorOf(field, v, lo, hi);
      span.dataset.value = v === undefined || v === null ? "" : String(v);
      span.title = tokenInfo(tok, i);
      span.addEventListener("mouseenter", () => { $("token-info").textContent = tokenInfo(tok, i); });
      line.appendChild(span);
    }
    if (!s.tokens.length) line.textContent = s.response;
    div.appendChild(line); box.appendChild(div);
  }
}

// The sample's images (a vision-language run), beside its tokens: served by the run's image endpoint,
// which sends only files of the run's rollouts/images/ folder.
function renderImages(paths) {
  const box = $("sample-images"); box.replaceChildren();
  box.hidden = !paths.length;
  paths.forEach((path, i) => {
    const q = new URLSearchParams({ path });
    const img = el("img", { class: "sample-image", src: `/api/run/${state.run}/image?${q}`, alt: `image ${i + 1}` });
    img.title = path;
    const fig = el("figure");
    fig.append(img, el("figcaption", {}, `image ${i + 1}`));
    box.appendChild(fig);
  });
}

async function openSample(step, row) {
  const s = await api(`/api/run/${state.run}/step/${step}/sample/${row}`);
  state.sample = s;
  const head = $("sample-head"); head.replaceChildren();
  for (const [k, v] of [["step", s.step], ["row", s.row], ["uid", s.uid], ["score", s.score], ["reward", s.reward],
    ["advantage", s.advantage], ["finish", s.finish_reason], ["tokens", s.response_tokens], ["drift", s.drift],
    ["ground truth", s.ground_truth]]) head.appendChild(el("span", { class: "badge", "data-key": k }, `${k} ${fmt(v, 4)}`));
  if (s.tokens_dropped) head.appendChild(el("span", { class: "badge" }, "per-token values dropped (trainer.rollout_budget_mb)"));
  const sel = $("color-by"), keep = state.colorBy;
  sel.replaceChildren();
  for (const f of [...s.token_fields, "mask"]) sel.appendChild(el("option", { value: f }, f));
  sel.value = keep && [...s.token_fields, "mask"].includes(keep) ? keep : (s.token_fields.includes("advantages") ? "advantages" : "mask");
  $("sample-prompt").textContent = s.prompt;
  renderImages(s.images || []);
  renderTokens();
  show("sample");
}

// ---- a group: the n samples of one prompt ----------------------------------------------------------

function column(title, r, extra = "") {
  const col = el("div", { class: "col", "data-row": r.row, "data-step": r.step ?? state.step });
  col.appendChild(el("h4", {}, title));
  const adv = el("span", { class: `badge ${r.advantage >= 0 ? "pos" : "neg"}` }, `adv ${fmt(r.advantage)}`);
  col.append(el("span", { class: "badge" }, `score ${fmt(r.score)}`), el("span", { class: "badge" }, `reward ${fmt(r.reward)}`), adv);
  if (extra) col.appendChild(el("span", { class: "badge" }, extra));
  col.appendChild(el("pre", {}, r.response));
  col.addEventListener("click", () => openSample(r.step ?? state.step, r.row));
  return col;
}

async function openGroup(uid) {
  const rows = await api(`/api/run/${state.run}/step/${state.step}/group/${encodeURIComponent(uid)}`);
  $("group-head").textContent = `step ${state.step} · group ${uid} · ${rows.length} samples · prompt: ${rows[0] ? rows[0].prompt : ""}`;
  const cols = $("group-cols"); cols.replaceChildren();
  for (const r of rows) cols.appendChild(column(`row ${r.row}`, r));
  show("group");
}

// ---- compare: the same prompt in another run or at another step -------------------------------------

function compareTargets() {
  const sel = $("compare-target"), keep = sel.value;
  sel.replaceChildren();
  state.runs.forEach((r, i) => { if (i !== state.run) sel.appendChild(el("option", { value: `run:${i}` }, `run ${r.name} (all steps)`)); });
  for (const s of state.steps) if (s.step !== state.step) sel.appendChild(el("option", { value: `step:${s.step}` }, `this run, step ${s.step}`));
  if (keep) sel.value = keep;
}

async function openCompare() {
  compareTargets();
  const s = state.sample;
  const head = $("compare-head"), cols = $("compare-cols");
  cols.replaceChildren();
  if (!s) { head.textContent = "open a sample first: compare shows its prompt elsewhere"; show("compare"); return; }
  const target = $("compare-target").value;
  head.textContent = `prompt (dataset index ${fmt(s.index)}): ${s.prompt}`;
  const q = new URLSearchParams({ prompt: s.prompt, index: s.index === null || s.index === undefined ? "" : s.index });
  const here = await api(`/api/run/${state.run}/find?${q}`);
  const left = el("div", { class: "columns side", id: "compare-left" });
  left.appendChild(el("h4", {}, `${state.runs[state.run].name}, step ${s.step}`));
  for (const r of here.filter((r) => r.step === s.step)) left.appendChild(column(`step ${r.step} row ${r.row}`, r));
  const right = el("div", { class: "columns side", id: "compare-right" });
  if (target.startsWith("run:")) {
    const other = Number(target.slice(4));
    const there = await api(`/api/run/${other}/find?${q}`);
    right.appendChild(el("h4", {}, `${state.runs[other].name}: ${there.length} sample(s) of this prompt`));
    for (const r of there) { const c = column(`step ${r.step} row ${r.row}`, r); c.onclick = null; right.appendChild(c); }
  } else if (target.startsWith("step:")) {
    const step = Number(target.slice(5));
    const there = here.filter((r) => r.step === step);
    right.appendChild(el("h4", {}, `${state.runs[state.run].name}, step ${step}: ${there.length} sample(s) of this prompt`));
    for (const r of there) right.appendChild(column(`step ${r.step} row ${r.row}`, r));
  }
  cols.append(left, right);
  show("compare");
}

// ---- wiring ---------------------------------------------------------------------------------------------

async function refresh() {
  const changed = await loadSteps();
  if (changed) { await loadSamples(); }
  await loadOverview();
}

async function init() {
  state.runs = await api("/api/runs");
  const runSel = $("run");
  state.runs.forEach((r, i) => runSel.appendChild(el("option", { value: i }, r.name)));
  runSel.addEventListener("change", async () => { state.run = Number(runSel.value); state.step = null; state.steps = []; await refresh(); });
  $("step").addEventListener("change", async () => { state.step = Number($("step").value); await loadSamples(); });
  for (const b of document.querySelectorAll(".tab")) {
    b.addEventListener("click", () => (b.dataset.view === "compare" ? openCompare() : show(b.dataset.view)));
  }
  let timer = null;
  const reload = () => { clearTimeout(timer); timer = setTimeout(() => loadSamples(), 250); };
  $("filters").addEventListener("input", reload);
  $("filters").addEventListener("change", reload);
  $("filters").addEventListener("submit", (ev) => { ev.preventDefault(); loadSamples(); });
  $("more").addEventListener("click", () => loadSamples(true));
  $("color-by").addEventListener("change", () => { state.colorBy = $("color-by").value; renderTokens(); });
  $("metric-pick").addEventListener("change", drawExtra);
  $("compare-target").addEventListener("change", openCompare);
  await refresh();
  show("overview");
  document.body.dataset.ready = "1";
  setInterval(() => refresh().catch((e) => console.error(e)), 5000);  // a live run's new steps
}

init().catch((e) => { document.body.textContent = String(e); });

// hilrec ui: the bench page. Plain JavaScript, no build step, no library.
//
// One WebSocket (/ws) brings the server's messages (see hilrec.daemon.ui.model); the buttons POST
// to /api/<action>. Every value shown carries the time it was received; a panel whose newest
// value is older than its data-max-age is greyed out with that age, so nothing stale looks live.
"use strict";

const JOINTS = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"];
// A two-arm daemon sends twelve values per vector, left arm first (LeRobot's bi_so_follower):
// its arms are shown side by side, each named. One arm: one side without a name.
const SIDES = ["left", "right"];
const sidesOf = (v) => (Array.isArray(v) && v.length === SIDES.length * JOINTS.length ? SIDES : [null]);
const SERIES = ["state", "action", "twin", "gap"];
const SERIES_HEAD = ["follower", "command", "twin", "|command − follower|"];
const TRACE_SECONDS = 10;
const COLOURS = { follower: "#1c64d8", command: "#e8590c", twin: "#2f9e44", late: "#e03131", grid: "#e3e6ea" };

const S = {
  skew: 0,            // browser clock minus server clock (s)
  info: {},
  link: { daemon: "unknown" },
  status: null, statusAt: null,
  session: null,      // the Session panel's phase, take, task, ends_at (model.session_view)
  tick: null, tickAt: null,
  previewAt: null,
  takes: [], faultsLog: [],
  trace: [],          // {slot, state, action, twin, late, recording}
  traceDrawn: null,   // what the traces canvas shows now (drawTraces redraws only when it differs)
  wsUp: false, wsDownSince: null,
  busy: false,
};

const $ = (id) => document.getElementById(id);
const serverNow = () => Date.now() / 1000 - S.skew;
const ageOf = (at) => (at == null ? Infinity : Math.max(0, serverNow() - at));

function clock(t) {
  const d = new Date((t + S.skew) * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
}

function fmtAge(s) {
  if (!isFinite(s)) return "no data";
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s old`;
  return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s old`;
}

function fmtNum(v, digits = 1) {
  return typeof v === "number" && isFinite(v) ? v.toFixed(digits) : "—";
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

// --- the connection ------------------------------------------------------------------------

let backoff = 250;

function connect() {
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`);
  ws.onopen = () => { S.wsUp = true; S.wsDownSince = null; backoff = 250; };
  ws.onmessage = (e) => {
    const msg = JSON.parse(e.data);
    S.skew = Date.now() / 1000 - msg.now;
    handle(msg);
  };
  ws.onclose = () => {
    if (S.wsUp || S.wsDownSince == null) S.wsDownSince = serverNow();
    S.wsUp = false;
    setTimeout(connect, backoff);
    backoff = Math.min(backoff * 2, 4000);
  };
}

function handle(msg) {
  switch (msg.type) {
    case "snapshot":
      S.info = msg.info || {};
      handle(msg.link);
      if (msg.status) handle(msg.status);
      if (msg.tick) handle(msg.tick);
      if (msg.preview) handle(msg.preview);
      renderInfo();
      break;
    case "link": S.link = msg; break;
    case "status":
      S.status = msg.status; S.statusAt = msg.at; S.session = msg.session; S.takes = msg.takes; S.faultsLog = msg.faults_log;
      renderStatus(); renderTakes(); renderFaults();
      break;
    case "tick": onTick(msg); break;
    case "preview": onPreview(msg); break;
    case "event": onEvent(msg.event); break;
  }
  renderLink();
}

function onTick(t) {
  const last = S.trace[S.trace.length - 1];
  if (last && t.slot <= last.slot) S.trace = [];  // a new daemon counts slots from 0 again
  S.tick = t; S.tickAt = t.at;
  const flags = t.flags || [];
  S.trace.push({
    slot: t.slot, state: t.state, action: t.action, twin: t.twin, recording: t.recording,
    late: flags.includes("late") || flags.includes("skipped") || (t.timing && t.timing.skipped > 0),
  });
  const fps = (S.status && S.status.fps) || S.info.fps || 25;
  while (S.trace.length && S.trace[0].slot < t.slot - TRACE_SECONDS * fps) S.trace.shift();
  renderTick();
}

function onPreview(p) {
  S.previewAt = p.at;
  const grid = $("camera-grid");
  grid.querySelector(".empty")?.remove();
  for (const cam of p.cameras) {
    let fig = grid.querySelector(`figure[data-camera="${CSS.escape(cam.name)}"]`);
    if (!fig) {
      fig = el("figure", { dataset: { camera: cam.name } },
        el("img", { class: "preview", alt: `camera ${cam.name}`, dataset: { camera: cam.name } }),
        el("figcaption"));
      grid.append(fig);
    }
    fig.querySelector("img").src = `data:image/jpeg;base64,${cam.jpeg}`;
    fig.querySelector("figcaption").textContent = `${cam.name} · ${cam.width}×${cam.height} · frame ${p.frame_index ?? "idle"}`;
  }
}

function onEvent(e) {
  if (e.event === "daemon_started") S.trace = [];
}

// --- rendering -----------------------------------------------------------------------------

function renderInfo() {
  const i = S.info;
  $("daemon-info").textContent = [i.mode && `${i.mode} mode`, i.fps && `${i.fps} fps`, i.control, i.config]
    .filter(Boolean).join(" · ");
}

function renderLink() {
  const node = $("link");
  let cls, text;
  if (!S.wsUp && S.wsDownSince != null) {
    cls = "down"; text = `page server not answering since ${clock(S.wsDownSince)}; reconnecting…`;
  } else if (S.link.daemon === "down") {
    cls = "down"; text = `daemon not answering since ${clock(S.link.down_since)}; reconnecting…`;
  } else if (S.link.daemon === "up" && ageOf(S.statusAt) > 3) {
    // Said to be up, but no status for a while (a message lost on a slow page): do not claim it.
    cls = "down"; text = `no news from the daemon since ${clock(S.statusAt)}`;
  } else if (S.link.daemon === "up") {
    const st = S.status || {};
    cls = "up"; text = `daemon live · ${st.mode ?? ""} · up ${fmtNum(st.uptime_s, 0)} s`;
  } else {
    cls = "unknown"; text = "connecting to the daemon…";
  }
  node.className = `link ${cls}`;
  node.textContent = text;
  node.title = S.link.error || "";
}

function renderStatus() {
  const st = S.status;
  if (!st) return;
  const ep = st.episode;
  const session = S.session || { phase: st.state, take: "—", task: null, ends_at: null };
  const state = $("state");
  state.textContent = String(session.phase).replace("_", " ");
  state.className = `state ${session.phase}`;
  state.title = session.source === "collect" ? "as hilrec collect tells it" : "the daemon's state";
  $("take").textContent = session.take;
  $("episode-task").textContent = session.task ? `task: ${session.task}` : "";
  const last = st.last_episode;
  $("last-take").textContent = last
    ? `last take ${last.episode_index + 1} (episode ${last.episode_index}): ${last.frames} frames, ${last.ended_by}, ` +
      (last.discarded ? "discarded" : last.saved ? "saved" : last.error ? `save failed: ${last.error}` : "saving…")
    : "";
  if (!ep) { $("frames").textContent = "—"; $("elapsed").textContent = "—"; }
  // A policy drives (hilrec rollout, [policy]): who has the arm, and the switches.
  const control = st.leader?.control;
  $("rollout").hidden = !control;
  $("control").textContent = control ? `the ${control} has the arm (policy ${st.leader.policy})` : "";
  $("btn-takeover").disabled = control !== "policy";
  $("btn-handback").disabled = control !== "human";
  renderLoop();
}

function renderTick() {
  const t = S.tick;
  const st = S.status;
  if (t.recording && t.frame_index != null) $("frames").textContent = t.frame_index + 1;
  else if (!st || !st.episode) $("frames").textContent = "—";
  const faulted = t.faults || [];
  $("tick-faults").textContent = faulted.length ? `faulted: ${faulted.join(", ")}` : "";
  const table = $("joint-table"), body = table.tBodies[0];
  const sides = sidesOf(t.state || t.action || t.twin);
  if (body.rows.length !== JOINTS.length || table.dataset.arms !== String(sides.length)) {
    table.dataset.arms = String(sides.length);
    const named = sides[0] !== null;
    table.tHead.replaceChildren(
      ...(named ? [el("tr", {}, el("th", {}), ...sides.map((side) => el("th", { colspan: SERIES.length, class: "arm" }, `${side} arm`)))] : []),
      el("tr", {}, el("th", {}, "joint"), ...sides.flatMap(() => SERIES_HEAD.map((h) => el("th", {}, h)))));
    body.replaceChildren(...JOINTS.map((j) => el("tr", {},
      el("th", {}, j),
      ...sides.flatMap((side) => SERIES.map((s) => el("td", { dataset: { joint: side ? `${side}_${j}` : j, series: s } }, "—"))))));
  }
  sides.forEach((_, k) => JOINTS.forEach((j, jj) => {
    const row = body.rows[jj], i = k * JOINTS.length + jj, c = 1 + k * SERIES.length;
    row.cells[c].textContent = fmtNum(t.state?.[i]);
    row.cells[c + 1].textContent = fmtNum(t.action?.[i]);
    row.cells[c + 2].textContent = fmtNum(t.twin?.[i]);
    row.cells[c + 3].textContent = t.state && t.action ? fmtNum(Math.abs(t.action[i] - t.state[i])) : "—";
  }));
}

function renderLoop() {
  const st = S.status, lp = st.loop || {}, ds = st.dataset || {}, t = S.tick;
  const items = [
    ["ticks", lp.ticks], ["late ticks", lp.late_ticks], ["overruns", lp.overruns],
    ["skipped slots", lp.skipped_slots],
    ["last tick late", t ? `${fmtNum(t.timing?.late_ms, 2)} ms` : "—"],
    ["last tick took", t ? `${fmtNum(t.timing?.duration_ms, 2)} ms` : "—"],
    ["period", lp.period_ms != null ? `${lp.period_ms} ms` : "—"], ["priority", lp.priority ?? "—"],
    ["leader", st.leader?.state ?? "—"], ["uptime", `${fmtNum(st.uptime_s, 0)} s`],
    ["writer queue", `${ds.writer_queue ?? "—"} / ${ds.writer_capacity ?? "—"}`],
    ["saving", ds.saving ?? "—"],
    ["telemetry dropped", st.telemetry?.dropped ?? "—"],
  ];
  $("loop-numbers").replaceChildren(...items.map(([k, v]) =>
    el("div", { class: k === "late ticks" && v > 0 ? "warn" : "" }, el("dt", {}, k),
      el("dd", { dataset: { key: k.replace(/ /g, "_") } }, v ?? "—"))));
}

function renderFaults() {
  const faults = S.status?.faults || [];
  $("fault-list").replaceChildren(...(faults.length ? faults.map((f) =>
    el("li", { class: "fault" },
      el("strong", {}, f.device), ` ${f.message} `,
      el("span", { class: "muted" }, `${f.kind}${f.ends_episode ? ", ends the take" : ""}` +
        (f.since != null ? `, since ${clock(f.since)}` : ""))))
    : [el("li", { class: "empty" }, "no faults")]));
  $("faults").classList.toggle("alert", faults.length > 0);
  const log = S.faultsLog || [];
  $("fault-log").replaceChildren(...(log.length ? log.map((f) =>
    el("li", { class: f.cleared ? "cleared" : "fault" },
      el("span", { class: "muted" }, clock(f.at)), " ", el("strong", {}, f.device),
      ` ${f.cleared ? "cleared: " : ""}${f.message}`))
    : [el("li", { class: "empty" }, "none seen")]));
}

function renderTakes() {
  const rows = S.takes.map((t) => {
    const v = t.verdict;
    const verdict = v
      ? el("span", { class: "verdict-cell" },
        el("span", { class: `verdict ${String(v.verdict).toLowerCase()}` }, v.verdict),
        el("span", { class: "verdict-summary" }, v.summary ?? ""))
      : el("span", { class: "muted no-verdict" }, "no verdict");
    const report = t.replay_png
      ? el("a", { href: `/takes/${t.episode_index}/replay.png`, class: "report", dataset: { take: t.episode_index } }, "report")
      : el("span", { class: "muted" }, "—");
    const ended = t.saving ? "saving…" : [t.ended_by, t.success === true ? "success" : t.success === false ? "failure" : ""]
      .filter(Boolean).join(", ");
    return el("tr", { dataset: { take: t.episode_index } },
      el("td", { title: `episode ${t.episode_index}` }, t.episode_index + 1), el("td", {}, t.frames ?? "—"), el("td", { class: "task" }, t.task ?? ""),
      el("td", {}, ended), el("td", {}, verdict), el("td", {}, report));
  });
  $("take-list").replaceChildren(...(rows.length ? rows
    : [el("tr", { class: "empty" }, el("td", { colspan: 6 }, "no takes yet"))]));
}

// Greys out every panel whose newest value is older than it may be, with that age.
function renderAges() {
  const ages = {
    cameras: ageOf(S.previewAt),
    session: ageOf(S.statusAt), faults: ageOf(S.statusAt), loop: ageOf(S.statusAt), takes: ageOf(S.statusAt),
    joints: ageOf(S.tickAt),
  };
  const hz = S.info.preview_hz || 0;
  for (const [id, age] of Object.entries(ages)) {
    const panel = $(id);
    let limit = Number(panel.dataset.maxAge);
    if (id === "cameras" && hz > 0) limit = Math.max(limit, 3 / hz);
    const stale = !S.wsUp || age > limit;
    panel.classList.toggle("stale", stale);
    panel.querySelector("h2 .age").textContent = stale ? `(${fmtAge(age)})` : "";
  }
  const st = S.status;
  if (st && st.episode && S.wsUp && ageOf(S.statusAt) < 2.5) {
    const elapsed = st.episode.elapsed_s + (st.state === "recording" ? ageOf(S.statusAt) : 0);
    $("elapsed").textContent = `${Math.floor(elapsed / 60)}:${(elapsed % 60).toFixed(1).padStart(4, "0")}`;
  }
  // collect's countdown, on the server's clock; shown only while its status is fresh.
  const endsAt = S.session?.ends_at;
  $("left").textContent = endsAt != null && S.wsUp && ageOf(S.statusAt) < 2.5
    ? `${Math.max(0, endsAt - serverNow()).toFixed(1)} s` : "—";
  renderLink();
}

// --- the traces ----------------------------------------------------------------------------

// Called every animation frame, it draws only when what it would show has changed: new joint
// data, a new size, or the stale notice's age. Redrawing at the display's rate (60 Hz) whatever
// had changed cost Chromium twice the CPU over a take, for ticks that come at 10 to 30 Hz.
function drawTraces() {
  requestAnimationFrame(drawTraces);
  const canvas = $("traces");
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  const stale = !S.wsUp || ageOf(S.tickAt) > 1;
  const notice = !stale ? "" : S.tickAt == null ? "no joint data yet" : `no new joint data (${fmtAge(ageOf(S.tickAt))})`;
  // Every tick adds a new newest point (and a reset empties the trace), so it stands for the data.
  const shown = [w, h, dpr, notice, S.trace[S.trace.length - 1], S.status?.fps, S.info.fps];
  if (S.traceDrawn && shown.every((v, i) => v === S.traceDrawn[i])) return;
  S.traceDrawn = shown;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const sample = S.trace.find((p) => p.state || p.action || p.twin);
  const sides = sidesOf(sample && (sample.state || sample.action || sample.twin));
  // Each arm its own block of plots, side by side: 3 x 2 per arm.
  const cols = 3, rows = 2, pad = 6, aw = w / sides.length, cw = aw / cols, ch = h / rows;
  ctx.globalAlpha = stale ? 0.35 : 1;
  const fps = (S.status && S.status.fps) || S.info.fps || 25;
  const newest = S.trace.length ? S.trace[S.trace.length - 1].slot : 0;
  const span = TRACE_SECONDS * fps;
  sides.forEach((side, k) => JOINTS.forEach((joint, jj) => {
    const j = k * JOINTS.length + jj;
    const x0 = k * aw + (jj % cols) * cw + pad, y0 = Math.floor(jj / cols) * ch + pad;
    const pw = cw - 2 * pad, ph = ch - 2 * pad - 14;
    let lo = Infinity, hi = -Infinity;
    for (const p of S.trace) for (const s of [p.state, p.action, p.twin]) if (s) { lo = Math.min(lo, s[j]); hi = Math.max(hi, s[j]); }
    if (!isFinite(lo)) { lo = -1; hi = 1; }
    const margin = Math.max((hi - lo) * 0.1, 1);
    lo -= margin; hi += margin;
    const X = (slot) => x0 + pw * (1 - (newest - slot) / span);
    const Y = (v) => y0 + 14 + ph * (1 - (v - lo) / (hi - lo));
    ctx.fillStyle = "#fff"; ctx.fillRect(x0, y0 + 14, pw, ph);
    ctx.fillStyle = "rgba(224, 49, 49, 0.07)";  // recording: a red wash behind the traces
    for (const p of S.trace) if (p.recording) ctx.fillRect(X(p.slot) - pw / span / 2, y0 + 14, pw / span + 0.5, ph);
    ctx.strokeStyle = COLOURS.grid; ctx.lineWidth = 1; ctx.strokeRect(x0 + 0.5, y0 + 14.5, pw - 1, ph - 1);
    ctx.fillStyle = "#333"; ctx.font = "12px system-ui, sans-serif"; ctx.textBaseline = "top";
    ctx.fillText((side ? `${side} ` : "") + joint + (joint === "gripper" ? " (0..100)" : " (°)"), x0, y0);
    ctx.fillStyle = "#888"; ctx.textAlign = "right";
    ctx.fillText(`${fmtNum(hi, 0)} … ${fmtNum(lo, 0)}`, x0 + pw, y0);
    ctx.textAlign = "left";
    ctx.fillStyle = COLOURS.late;
    for (const p of S.trace) if (p.late) ctx.fillRect(X(p.slot) - 1, y0 + 14 + ph - 6, 2, 6);
    for (const [key, colour, dash] of [["action", COLOURS.command, []], ["twin", COLOURS.twin, [4, 3]], ["state", COLOURS.follower, []]]) {
      ctx.strokeStyle = colour; ctx.lineWidth = key === "state" ? 2 : 1.5; ctx.setLineDash(dash);
      ctx.beginPath();
      let pen = false;
      for (const p of S.trace) {
        const s = p[key];
        if (!s) { pen = false; continue; }
        if (pen) ctx.lineTo(X(p.slot), Y(s[j])); else ctx.moveTo(X(p.slot), Y(s[j]));
        pen = true;
      }
      ctx.stroke();
    }
    ctx.setLineDash([]);
  }));
  ctx.globalAlpha = 1;
  if (stale) {
    const text = notice;
    ctx.font = "bold 15px system-ui, sans-serif"; ctx.textAlign = "center"; ctx.textBaseline = "middle";
    const tw = ctx.measureText(text).width + 28;
    ctx.fillStyle = "rgba(255, 255, 255, 0.92)"; ctx.fillRect(w / 2 - tw / 2, h / 2 - 16, tw, 32);
    ctx.strokeStyle = "#adb5bd"; ctx.strokeRect(w / 2 - tw / 2 + 0.5, h / 2 - 15.5, tw - 1, 31);
    ctx.fillStyle = "#343a40"; ctx.fillText(text, w / 2, h / 2);
    ctx.textAlign = "left";
  }
}

// --- the buttons ---------------------------------------------------------------------------

function showReply(text, ok) {
  const r = $("reply");
  r.textContent = `${clock(serverNow())}  ${text}`;
  r.className = `reply ${ok ? "ok" : "refused"}`;
}

async function act(action) {
  if (S.busy) return;
  let task = $("task").value.trim();
  if (action === "rerecord" && S.status?.episode) task = S.status.episode.task;  // the same task again
  S.busy = true;
  document.body.classList.add("busy");
  try {
    const response = await fetch(`/api/${action}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(action === "start" || action === "rerecord" ? { task } : {}),
    });
    if (!response.ok) {
      showReply(`${action}: HTTP ${response.status}: ${(await response.text()).trim()}`, false);
      return;
    }
    const result = await response.json();
    showReply(result.message, result.ok);
  } catch (err) {
    showReply(`${action}: the page server did not answer (${err})`, false);
  } finally {
    S.busy = false;
    document.body.classList.remove("busy");
  }
}

function askFinalize() {
  const dialog = $("confirm-finalize");
  if (dialog.open) return;
  dialog.returnValue = "";  // a cancel (Esc) leaves returnValue as it was: start from nothing
  dialog.showModal();
}

function wire() {
  $("controls").addEventListener("submit", (e) => {
    e.preventDefault();
    $("task").blur();  // the arrow keys are the operator's again
    act("start");
  });
  $("btn-stop").addEventListener("click", () => act("stop"));
  $("btn-rerecord").addEventListener("click", () => act("rerecord"));
  $("btn-discard").addEventListener("click", () => act("discard"));
  $("btn-takeover").addEventListener("click", () => act("takeover"));
  $("btn-handback").addEventListener("click", () => act("handback"));
  $("btn-finalize").addEventListener("click", askFinalize);
  $("confirm-finalize").addEventListener("close", () => {
    if ($("confirm-finalize").returnValue === "finalize") act("finalize");
  });
  document.addEventListener("keydown", (e) => {
    if (document.querySelector("dialog[open]") || e.altKey || e.ctrlKey || e.metaKey) return;
    const typing = e.target instanceof HTMLInputElement;
    if (e.key === "Escape") { e.preventDefault(); askFinalize(); }
    else if (e.key === "ArrowRight" && !typing) { e.preventDefault(); act("stop"); }
    else if (e.key === "ArrowLeft" && !typing) { e.preventDefault(); act("rerecord"); }
  });
  $("take-list").addEventListener("click", (e) => {
    const link = e.target.closest("a.report");
    if (!link) return;
    e.preventDefault();
    $("report-title").textContent = `Replay report, take ${link.dataset.take}`;
    $("report-image").src = `${link.getAttribute("href")}?t=${Date.now()}`;
    $("report").showModal();
  });
}

wire();
connect();
setInterval(renderAges, 250);
requestAnimationFrame(drawTraces);

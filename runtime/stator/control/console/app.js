// The Stator console: reads the driver's control API (GET only: it changes nothing) every
// few seconds and draws the job. The bearer token arrives in the URL's fragment
// (#token=..., never sent to a server), moves to this tab's sessionStorage and goes out as
// the Authorization header of each request (docs/control-api.md, "The web console").

import { bytes, el, ms, number, rows, time } from "./dom.js";
import { jobGraph } from "./graph.js";
import { linePlot, pairs } from "./plot.js";

const TOKEN_KEY = "stator-console-token";
const REFRESH_MS = 2000;
const $ = (id) => document.getElementById(id);

class Refused extends Error {}

function takeToken() {
  const found = /(?:^#|&)token=([^&]*)/.exec(location.hash);
  if (found) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(found[1]));
    history.replaceState(null, "", location.pathname + location.search); // out of the address bar
  }
}

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const response = await fetch(`../v1/${path}`, {
    headers: token ? { Authorization: `Bearer ${token}` } : {},
    cache: "no-store",
    credentials: "omit",
  });
  if (response.status === 401) throw new Refused();
  if (!response.ok) throw new Error(`GET /v1/${path}: HTTP ${response.status}`);
  return response.json();
}

function askForToken(again) {
  $("main").hidden = true;
  $("token-form").hidden = false;
  $("problem").hidden = !again;
  $("problem").textContent = again ? "The driver refused the token: it is not this job's." : "";
  document.body.dataset.state = "token-required";
}

function useToken() {
  const value = $("token-input").value.trim();
  if (!value) return;
  sessionStorage.setItem(TOKEN_KEY, value);
  $("token-input").value = "";
  $("token-form").hidden = true;
  refresh();
}

let timer = null;

async function refresh() {
  clearTimeout(timer);
  try {
    const [job, history, savepoints] = await Promise.all([api("job"), api("history"), api("savepoints")]);
    render(job, history, savepoints.savepoints);
    $("problem").hidden = true;
  } catch (error) {
    if (error instanceof Refused) {
      askForToken(sessionStorage.getItem(TOKEN_KEY) !== null);
      return; // until a token is given
    }
    $("problem").hidden = false;
    $("problem").textContent = `The driver does not answer: ${error.message}`;
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

function render(job, history, savepoints) {
  $("main").hidden = false;
  $("job-name").textContent = job.job;
  $("job-state").textContent = job.state;
  $("job-state").className = `state ${String(job.state).toLowerCase()}`;
  $("updated").textContent = `updated ${time(Date.now())}`;
  summary(job);
  $("graph").replaceChildren(jobGraph(job.graph, job.regions));
  plots(history);
  epochPhases(history.epochs);
  checkpoints(history.checkpoints);
  placement(job);
  rows($("failovers"), [...(history.failovers ?? [])].reverse(), (f) => [
    time(f.at_ms), f.restarts, f.error ?? "",
  ], "failover-row");
  rows($("regions"), job.regions, (r) => [
    r.id, r.state, r.epoch, r.restarts, r.latest_checkpoint?.id ?? "", (r.lost_executors ?? []).join(", "),
    r.last_error ?? "",
  ], "region-row");
  rows($("restores"), job.restores?.latest ?? [], (r) => [
    r.operator, r.subtask, r.epoch, r.savepoint ? "savepoint" : `checkpoint ${r.checkpoint_id}`, r.source,
    bytes(r.local_bytes + r.remote_bytes), ms(r.duration_ms), r.executor ?? "", r.node ?? "", r.fallback ?? "",
  ], "restore-row");
  rows($("savepoints"), [...savepoints].reverse(), (s) => [
    s.id, s.status, s.stop ? "yes" : "", time(s.created_ms), s.location ?? s.target ?? "",
    s.state_bytes === null ? "" : bytes(s.state_bytes), s.error ?? "",
  ], "savepoint-row");
  document.body.dataset.state = "loaded";
}

function summary(job) {
  const items = [
    ["epoch", job.epoch],
    ["records in", number(job.records_in)],
    ["records out", number(job.records_out)],
    ["restarts", job.restarts],
    ["checkpoints", `${job.checkpoints.completed} completed, ${job.checkpoints.failed} failed`],
    ["latest checkpoint", job.latest_checkpoint ? `${job.latest_checkpoint.id} (${bytes(job.latest_checkpoint.state_bytes)})` : "none"],
    ["lag", `${number(job.lag_records)} records, ${ms(job.lag_ms)}`],
    ["restores", `${job.restores?.local ?? 0} local, ${job.restores?.remote ?? 0} remote`],
    ["started", time(job.started_ms)],
  ];
  $("summary").replaceChildren(...items.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  $("last-error").hidden = !job.last_error;
  $("last-error").textContent = job.last_error ? `Last error: ${job.last_error}` : "";
}

function plots(history) {
  const samples = history.samples;
  const groups = new Map(); // "group unit" -> plot
  const plot = (group, unit) => {
    const key = `${group} ${unit}`;
    if (!groups.has(key)) groups.set(key, { id: `plot-${group}-${unit}`.replace(/[^a-z0-9-]/gi, "_"), title: group, unit, series: [] });
    return groups.get(key);
  };
  for (const s of samples.series) {
    plot(s.group, s.unit).series.push({ name: s.name, points: pairs(samples.t_ms, samples.values[s.name] ?? []) });
  }
  const regions = [...new Set(history.epochs.map((e) => e.region ?? ""))];
  for (const region of regions) {
    const epochs = history.epochs.filter((e) => (e.region ?? "") === region);
    plot("latency", "ms").series.push({
      name: region ? `epoch duration (${region})` : "epoch duration",
      points: epochs.map((e) => [e.at_ms, e.duration_ms]),
    });
  }
  const order = ["throughput", "latency", "lag", "failovers"];
  const sorted = [...groups.values()].sort((a, b) => rank(order, a.title) - rank(order, b.title));
  $("plots").replaceChildren(...sorted.map(linePlot));
  const kept = samples.capacity * samples.interval_ms / 60000;
  $("history-note").textContent =
    `One sample every ${samples.interval_ms / 1000} s, the last ${kept} minutes; epochs: the last ${history.epochs_capacity}.`;
}

const PHASES = ["submitted", "source_start", "source_end", "keyed_start", "keyed_input", "keyed_processed",
  "keyed_end", "job_end", "handed_off"];

function epochPhases(epochs) {
  // The newest epoch that read records, per region (epoch/phases.py).
  const newest = new Map();
  for (const e of epochs) {
    if (e.records_in > 0 && e.phases && Object.keys(e.phases).length) newest.set(e.region ?? "", e);
  }
  rows($("epoch-phases"), [...newest.values()], (e) => [
    e.region ?? "", e.epoch, number(e.records_in), ...PHASES.map((p) => ms(e.phases[p] ?? 0)),
  ], "phase-row");
}

function rank(order, title) {
  const i = order.indexOf(title);
  return i < 0 ? order.length : i;
}

function checkpoints(attempts) {
  const done = attempts.filter((c) => c.status === "COMPLETED");
  $("checkpoint-plots").replaceChildren(
    linePlot({ id: "plot-checkpoint-duration", title: "checkpoint duration", unit: "ms",
      series: [{ name: "duration", points: done.map((c) => [c.at_ms, c.duration_ms]) }] }),
    linePlot({ id: "plot-checkpoint-size", title: "checkpoint size", unit: "bytes", series: [
      { name: "state", points: done.map((c) => [c.at_ms, c.state_bytes]) },
      { name: "incremental", points: done.map((c) => [c.at_ms, c.incremental_bytes]) },
    ] }),
  );
  rows($("checkpoints"), [...attempts].reverse().slice(0, 20), (c) => [
    c.id, c.epoch, c.status, time(c.at_ms), ms(c.duration_ms), bytes(c.state_bytes), bytes(c.incremental_bytes),
    c.error ?? "",
  ], "checkpoint-row");
}

function placement(job) {
  const placed = job.placement?.subtasks;
  let entries;
  if (placed) {
    entries = Object.entries(placed).flatMap(([uid, subtasks]) => subtasks.map((s) => ({ uid, ...s })));
    const p = job.placement;
    $("placement-note").textContent =
      `${p.keyed_tasks_local} of ${p.keyed_tasks} keyed tasks ran where their local state is` +
      (p.last_epoch ? ` (latest epoch: ${p.last_epoch.local} of ${p.last_epoch.total}).` : ".");
  } else {
    // No placement tracked (one executor, local[*]; or a job of several failover regions):
    // the subtasks and their key groups still are.
    entries = (job.graph?.nodes ?? []).filter((n) => n.key_groups.length).flatMap((n) => n.key_groups.map((kg, i) => ({
      uid: n.label, subtask: i, key_groups: kg, executor: "", node: "",
    })));
    $("placement-note").textContent = "No executor placement is reported (one executor, local[*], or a job " +
      "of several failover regions): the subtasks and their key groups only.";
  }
  rows($("placement"), entries, (s) => [
    s.uid, s.subtask, s.key_groups ? `${s.key_groups[0]}–${s.key_groups[1] - 1}` : "",
    s.host ? `${s.executor} (${s.host})` : s.executor, s.node || "",
    s.checkpoint_id ? `checkpoint ${s.checkpoint_id}` : "", s.standby ? `executor ${s.standby.executor}${s.standby.node ? " on " + s.standby.node : ""}` : "",
  ], "placement-row");
}

takeToken();
$("token-button").addEventListener("click", useToken);
$("token-input").addEventListener("keydown", (e) => { if (e.key === "Enter") useToken(); });
refresh();

// The live page: a list snapshot, then the event stream applied on top of it. Rows are kept by
// id and updated in place; events are queued and applied once per animation frame, so a burst
// of events costs one redraw, and the countdowns are one text update per visible row. Locks
// held elsewhere on the backend (no events tell of them) come from reloading the list every
// few seconds, and only their rows are touched by it.
"use strict";
(() => {
  const params = new URLSearchParams(location.search);
  const token = params.get("access_token");
  const withToken = (path) =>
    token ? path + (path.includes("?") ? "&" : "?") + "access_token=" + encodeURIComponent(token) : path;
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const $ = (id) => document.getElementById(id);
  const TIMELINE_MAX = 200;
  const OTHERS_EVERY_MS = 2000;

  const holds = new Map();   // hold id -> {data, row, left}
  const waiters = new Map(); // waiter id -> {data, row, left}
  const others = new Map();  // key -> {data, row, cells, left}: locks held elsewhere
  const lastAcquired = new Map(); // key -> at_ms of its last acquisition, for the gaps
  let offset = 0;            // server clock minus ours, ms
  let snapshotSeq = null;    // null until the list arrived; stream events wait for it
  let pending = [];
  let frame = 0;
  let filter = "";

  const now = () => Date.now() + offset;
  const clock = (ms) => new Date(ms).toISOString().slice(11, 23);
  const cell = (row, text, cls) => {
    const td = row.insertCell();
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  };
  const visible = (key) => !filter || key.toLowerCase().includes(filter);
  // The kinds of `list --json` in the words of the request: `shared`, `permits`.
  const kindLabel = (kind, permits) => {
    switch (kind) {
      case "mutex": return "exclusive";
      case "write": return "exclusive (write)";
      case "read": return "shared";
      case "semaphore": return permits ? "semaphore of " + permits : "semaphore";
      default: return kind || "held";
    }
  };

  function addHold(h, fresh) {
    removeHold(h.hold);
    const row = document.createElement("tr");
    row.dataset.key = h.key;
    row.dataset.hold = h.hold;
    cell(row, h.key, "key").title = h.key;
    cell(row, kindLabel(h.kind, h.permits), "kind").title = h.kind || "";
    cell(row, h.holder);
    cell(row, String(h.fence), "num");
    const left = cell(row, "", "num countdown");
    row.hidden = !visible(h.key);
    if (fresh) row.className = "fresh";
    insertSorted($("holds"), row, h.key);
    holds.set(h.hold, { data: h, row, left });
  }
  function removeHold(id) {
    const h = holds.get(id);
    if (h) { h.row.remove(); holds.delete(id); }
  }
  function addWaiter(w) {
    const row = document.createElement("tr");
    row.dataset.key = w.key;
    cell(row, w.key, "key").title = w.key;
    cell(row, w.holder);
    const left = cell(row, "", "num");
    row.hidden = !visible(w.key);
    insertSorted($("waiters"), row, w.key);
    waiters.set(w.waiter, { data: w, row, left });
  }
  function removeWaiter(id) {
    const w = waiters.get(id);
    if (w) { w.row.remove(); waiters.delete(id); }
  }
  // The locks of the list with holders that are not this service's: one row per key, its
  // texts rewritten only where they changed.
  function showOthers(list) {
    const seen = new Set();
    if (list.complete) {
      for (const lock of list.locks) {
        const n = lock.other_holders;
        if (n === 0 || (n == null && lock.holds_here > 0)) continue;
        seen.add(lock.key);
        const data = { key: lock.key, expires_at_ms: list.now_ms + (lock.remaining_ms || 0),
                       timed: lock.remaining_ms != null };
        const who = (lock.owners || []).slice(0, 3).join(", ") +
                    ((lock.owners || []).length > 3 ? ", \u2026" : "");
        const texts = [kindLabel(lock.kind, lock.permits),
                       (n == null ? "elsewhere" : n + " elsewhere") + (who ? " (" + who + ")" : ""),
                       lock.fence == null ? "" : String(lock.fence)];
        let o = others.get(lock.key);
        if (!o) {
          const row = document.createElement("tr");
          row.dataset.key = lock.key;
          cell(row, lock.key, "key").title = lock.key;
          const cells = [cell(row, "", "kind"), cell(row, ""), cell(row, "", "num")];
          const left = cell(row, "", "num countdown");
          row.hidden = !visible(lock.key);
          insertSorted($("others"), row, lock.key);
          o = { data, row, cells, left };
          others.set(lock.key, o);
        }
        o.data = data;
        texts.forEach((t, i) => { if (o.cells[i].textContent !== t) o.cells[i].textContent = t; });
      }
    }
    for (const [key, o] of others) if (!seen.has(key)) { o.row.remove(); others.delete(key); }
  }
  async function refreshOthers() {
    try {
      const r = await fetch(withToken("v1/locks"), { headers });
      if (r.ok) { showOthers(await r.json()); schedule(); }
    } catch (_) { /* the stream's state shows a broken connection */ }
  }
  // Keeps rows ordered by key; appending is the common case (keys arrive in any order, but a
  // binary search over the rows keeps an insert at O(log n) comparisons).
  function insertSorted(body, row, key) {
    const rows = body.rows;
    let lo = 0, hi = rows.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (rows[mid].dataset.key <= key) lo = mid + 1; else hi = mid;
    }
    body.insertBefore(row, rows[lo] || null);
  }

  // A demonstration's own timeline: its acquisitions are told as times since it started, so
  // its first one never shows the gap since an earlier run.
  const demoStarts = new Map(); // demo id -> at_ms of its demo_started
  const seconds = (ms) => (ms / 1000).toFixed(3) + " s";
  function demoText(e) {
    const d = e.demonstration || {};
    const head = "demonstration " + e.demo + " of " + JSON.stringify(e.key);
    if (e.kind === "demo_started") {
      demoStarts.set(e.demo, e.at_ms);
      return head + " started: " + d.workers + " workers, each holding it " + seconds(d.hold_ms);
    }
    let text = head + (d.stopped ? " stopped: " : " ended: ") + d.acquisitions +
      (d.acquisitions === 1 ? " acquisition" : " acquisitions") + ", one at a time";
    if (d.min_gap_ms != null) {
      text += "; gaps between consecutive acquisitions: min " + seconds(d.min_gap_ms) +
        ", max " + seconds(d.max_gap_ms);
    }
    return text + " (hold " + seconds(d.hold_ms) + ")";
  }

  function timeline(e) {
    const li = document.createElement("li");
    li.className = e.kind;
    li.dataset.kind = e.kind;
    li.dataset.key = e.key;
    li.dataset.at = e.at_ms;
    if (e.demo != null) li.dataset.demo = e.demo;
    let text = clock(e.at_ms) + " ";
    if (e.kind === "demo_started" || e.kind === "demo_ended") {
      text += demoText(e);
    } else {
      text += e.kind + " " + JSON.stringify(e.key);
      if (e.lock_kind && e.lock_kind !== "mutex") text += " " + kindLabel(e.lock_kind, e.permits);
      if (e.holder) text += " by " + e.holder;
      if (e.fence != null) text += " fence " + e.fence;
      if (e.kind === "acquired" && e.demo != null) {
        const start = demoStarts.get(e.demo);
        if (start != null) text += " (demonstration " + e.demo + " +" + seconds(e.at_ms - start) + ")";
      } else if (e.kind === "acquired" && (!e.lock_kind || e.lock_kind === "mutex" || e.lock_kind === "write")) {
        // The gap since the key's previous acquisition: how long a handoff took, for the
        // exclusive kinds (shared holds and permits overlap).
        const before = lastAcquired.get(e.key);
        if (before != null) text += " (+" + seconds(e.at_ms - before) + " after the previous)";
        lastAcquired.set(e.key, e.at_ms);
      }
      if (e.reason) text += " (" + e.reason + ")";
    }
    li.textContent = text;
    const list = $("timeline");
    list.insertBefore(li, list.firstChild);
    while (list.childElementCount > TIMELINE_MAX) list.lastChild.remove();
  }

  function apply(e) {
    switch (e.kind) {
      case "acquired":
        addHold({ hold: e.hold, key: e.key, kind: e.lock_kind, permits: e.permits,
                  holder: e.holder, fence: e.fence, lease_ms: e.lease_ms,
                  expires_at_ms: e.at_ms + e.lease_ms }, true);
        break;
      case "extended": {
        const h = holds.get(e.hold);
        if (h) h.data.expires_at_ms = e.at_ms + e.lease_ms;
        break;
      }
      case "released": case "lost": removeHold(e.hold); break;
      case "waiting":
        addWaiter({ waiter: e.waiter, key: e.key, holder: e.holder, since_ms: e.at_ms });
        break;
      case "stopped_waiting": removeWaiter(e.waiter); return; // not worth a timeline line
    }
    timeline(e);
  }

  function schedule() {
    if (!frame) frame = requestAnimationFrame(draw);
  }
  function draw() {
    frame = 0;
    if (snapshotSeq !== null) {
      const batch = pending;
      pending = [];
      for (const e of batch) if (e.seq > snapshotSeq) apply(e);
    }
    tick();
  }
  // Countdowns of the visible rows; a text node is written only when its text changes.
  function tick() {
    const t = now();
    for (const h of holds.values()) {
      if (h.row.hidden) continue;
      const left = h.data.expires_at_ms - t;
      const text = left > 0 ? (left / 1000).toFixed(1) + " s" : "ending";
      if (h.left.textContent !== text) h.left.textContent = text;
    }
    for (const o of others.values()) {
      if (o.row.hidden) continue;
      const left = o.data.expires_at_ms - t;
      const text = !o.data.timed ? "" : left > 0 ? (left / 1000).toFixed(1) + " s" : "ending";
      if (o.left.textContent !== text) o.left.textContent = text;
    }
    for (const w of waiters.values()) {
      if (w.row.hidden) continue;
      const text = ((t - w.data.since_ms) / 1000).toFixed(1) + " s";
      if (w.left.textContent !== text) w.left.textContent = text;
    }
    const shown = [...holds.values()].filter((h) => !h.row.hidden).length;
    $("counts").textContent = holds.size + " held" + (filter ? " (" + shown + " shown)" : "") +
      (others.size ? ", " + others.size + " held elsewhere" : "") + ", " + waiters.size + " waiting";
  }
  setInterval(schedule, 100);
  setInterval(() => { if (snapshotSeq !== null) refreshOthers(); }, OTHERS_EVERY_MS);

  async function load() {
    const r = await fetch(withToken("v1/locks"), { headers });
    if (!r.ok) throw new Error("GET /v1/locks: " + r.status);
    const list = await r.json();
    offset = list.now_ms - Date.now();
    for (const h of [...holds.keys()]) removeHold(h);
    for (const w of [...waiters.keys()]) removeWaiter(w);
    $("timeline").textContent = "";
    lastAcquired.clear();
    demoStarts.clear();
    for (const h of list.holds) addHold(h, false);
    for (const w of list.waiters) addWaiter(w);
    for (const e of list.timeline) if (e.seq <= list.seq && e.kind !== "stopped_waiting") timeline(e);
    showOthers(list);
    $("note").textContent = list.complete ? "" :
      "This backend cannot list its locks: the page shows the locks held and awaited through this service only.";
    snapshotSeq = list.seq;
    schedule();
  }

  function connect() {
    const source = new EventSource(withToken("v1/events"));
    const kinds = ["acquired", "extended", "released", "lost", "waiting", "stopped_waiting",
                   "demo_started", "demo_ended"];
    for (const kind of kinds) {
      source.addEventListener(kind, (m) => { pending.push(JSON.parse(m.data)); schedule(); });
    }
    source.addEventListener("lagged", () => { snapshotSeq = null; pending = []; load().catch(report); });
    source.onopen = () => {
      $("conn").textContent = "live";
      $("conn").className = "live";
      snapshotSeq = null;
      load().catch(report);
    };
    source.onerror = () => { $("conn").textContent = "reconnecting"; $("conn").className = "down"; };
  }
  function report(err) {
    $("conn").textContent = String(err.message || err);
    $("conn").className = "down";
  }

  $("filter").addEventListener("input", (ev) => {
    filter = ev.target.value.trim().toLowerCase();
    for (const m of [holds, waiters, others]) for (const x of m.values()) x.row.hidden = !visible(x.data.key);
    schedule();
  });
  $("demo-run").addEventListener("click", async () => {
    const body = { key: $("demo-key").value || "demo" };
    for (const name of ["workers", "hold_ms"]) if (params.get(name)) body[name] = Number(params.get(name));
    const r = await fetch("demo", {
      method: "POST",
      headers: { ...headers, "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    if (!r.ok) $("demo-note").textContent = "demonstration: " + ((await r.json()).error || r.status);
    else $("demo-note").textContent = "";
  });
  if (params.get("key")) $("demo-key").value = params.get("key");
  // `?demo=1` starts the demonstration on load (how the browser test presses the button).
  if (params.get("demo")) window.addEventListener("load", () => $("demo-run").click());
  connect();
})();

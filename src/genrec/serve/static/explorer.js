// genrec explorer: pick a user (or paste a history), ask /v1/recommend with "explain": true, show each stage.
// Plain script, no build step, no dependencies. Every value reaches the page through textContent.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const STAGES = ["encode", "sid", "ann", "rank", "total"];
  const HISTORY_LIMIT = 1000; // the newest events of a user sent as the history

  function setState(state, message) {
    document.body.dataset.state = state;
    $("status").textContent = message || "";
    $("status").className = state;
  }

  async function api(path, init) {
    const r = await fetch(path, init);
    let body = null;
    try { body = await r.json(); } catch (e) { /* not JSON */ }
    if (!r.ok) {
      const msg = body && body.message ? body.message : r.status + " " + r.statusText;
      const err = new Error(path.split("?")[0] + ": " + msg);
      err.status = r.status;
      throw err;
    }
    return body;
  }

  // ------------------------------------------------------------------ cells
  function fmt(x, digits) {
    return x === null || x === undefined ? "–" : Number(x).toFixed(digits);
  }

  function cell(tr, text, cls, value) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (cls) td.className = cls;
    if (value !== undefined && value !== null) td.title = String(value); // the exact number on hover
    tr.appendChild(td);
    return td;
  }

  function fill(table, rows, build) {
    const body = $(table).querySelector("tbody");
    body.replaceChildren();
    rows.forEach((row, i) => {
      const tr = document.createElement("tr");
      build(tr, row, i);
      body.appendChild(tr);
    });
  }

  function time(ts) {
    if (ts === null || ts === undefined) return "";
    return new Date(ts * 1000).toISOString().replace("T", " ").replace(/\.000Z$/, "Z");
  }

  // ------------------------------------------------------------------ the request
  function pastedHistory(text) {
    const t = text.trim();
    if (!t) throw new Error("paste a history: item ids, oldest first");
    if (t.startsWith("[")) {
      const got = JSON.parse(t);
      return got.map((h) => (typeof h === "object" && h !== null ? h : { item_id: h }));
    }
    // a number is sent as a number: a run with remapped ids reads it as its text
    return t.split(/[\s,]+/).filter(Boolean).map((x) => ({ item_id: /^-?\d+$/.test(x) ? Number(x) : x }));
  }

  async function buildRequest() {
    let history;
    const mode = document.querySelector("input[name=mode]:checked").value;
    if (mode === "user") {
      const user = $("user").value.trim();
      if (!user) throw new Error("choose a user");
      const got = await api("v1/users/" + encodeURIComponent(user) + "/history?limit=" + HISTORY_LIMIT);
      history = got.history.map((e) => ({ item_id: e.item_id, action: e.action, surface: e.surface, ts: e.ts }));
      $("history-note").textContent = "user " + got.user_id + ": " + got.events + " events" +
        (got.events > got.history.length ? ", the newest " + got.history.length + " sent" : "") +
        "; the model reads the newest " + got.context_len;
    } else {
      history = pastedHistory($("paste").value);
      $("history-note").textContent = "pasted: " + history.length + " events";
    }
    const sources = [];
    if ($("src-sid").checked) sources.push("sid");
    if ($("src-ann").checked) sources.push("ann");
    return {
      history: history, k: Number($("k").value), beam_width: Number($("beam").value),
      sources: sources, rank: $("rank").checked, exclude_history: $("exclude").checked, explain: true,
    };
  }

  // ------------------------------------------------------------------ rendering
  function render(req, res, roundTripMs) {
    const ex = res.explain;
    const top = new Set(res.items.map((it) => String(it.item_id)));

    fill("history", ex.history, (tr, h, i) => {
      tr.className = "status-" + h.status;
      cell(tr, i + 1, "pos");
      cell(tr, h.item_id, "item");
      cell(tr, h.title, "title");
      cell(tr, h.action, "action");
      cell(tr, time(h.ts), "ts");
      cell(tr, h.status === "read" ? "yes" : h.status, "read");
    });

    const actions = res.items.length && res.items[0].action_probs ? Object.keys(res.items[0].action_probs) : [];
    const head = $("ranked").querySelector("thead tr");
    head.replaceChildren();
    ["#", "item", "title", "score", ...actions.map((a) => "P(" + a + ")"), "found by", "SID"].forEach((h) => {
      const th = document.createElement("th");
      th.textContent = h;
      head.appendChild(th);
    });
    fill("ranked", res.items, (tr, it, i) => {
      cell(tr, i + 1, "pos");
      cell(tr, it.item_id, "item");
      cell(tr, ex.item_titles[i], "title");
      cell(tr, fmt(it.score, 4), "score num", it.score);
      actions.forEach((a) => {
        const p = it.action_probs ? it.action_probs[a] : null;
        const td = cell(tr, fmt(p, 3), "prob num", p);
        td.dataset.action = a;
      });
      const src = cell(tr, "", "sources");
      it.sources.forEach((s) => {
        const b = document.createElement("span");
        b.className = "badge " + s;
        b.textContent = s;
        src.appendChild(b);
      });
      cell(tr, it.sid ? it.sid.join("-") : "", "sid");
    });
    $("ranked-note").textContent = (res.cold_start ? "cold start: by popularity" : res.items.length + " items") +
      (res.degraded ? " (degraded: ranking failed, retrieval order)" : "");

    fill("sid-beams", ex.sid_beams || [], (tr, b, i) => {
      if (b.item_id !== null && top.has(String(b.item_id))) tr.className = "in-top";
      cell(tr, i + 1, "pos");
      cell(tr, b.codes.join("-"), "sid");
      cell(tr, fmt(b.log_prob, 3), "logprob num", b.log_prob);
      cell(tr, b.item_id, "item");
      cell(tr, b.title, "title");
    });
    $("sid-note").textContent = ex.sid_beams === null ? "not run" : ex.sid_beams.length + " valid beams, best " +
      "first (bold: in the ranked list)";

    fill("ann", ex.ann || [], (tr, a, i) => {
      if (top.has(String(a.item_id))) tr.className = "in-top";
      cell(tr, i + 1, "pos");
      cell(tr, a.item_id, "item");
      cell(tr, a.title, "title");
      cell(tr, fmt(a.score, 4), "score num", a.score);
    });
    $("ann-note").textContent = ex.ann === null ? "not run" : ex.ann.length + " items, best first (bold: in the " +
      "ranked list)";

    const t = res.timings_ms;
    const rows = STAGES.map((s) => ({ stage: s, ms: t[s] })).concat([{ stage: "round trip", ms: roundTripMs }]);
    const widest = Math.max(...rows.map((r) => r.ms), 1e-9);
    fill("timings", rows, (tr, r) => {
      tr.dataset.stage = r.stage;
      cell(tr, r.stage, "stage");
      cell(tr, fmt(r.ms, 2), "ms num", r.ms);
      const bar = document.createElement("div");
      bar.className = "bar";
      bar.style.width = Math.max(1, Math.round(200 * r.ms / widest)) + "px";
      cell(tr, "", "barcell").appendChild(bar);
    });
    $("version").textContent = res.index_version;
  }

  // ------------------------------------------------------------------ wiring
  async function run(event) {
    if (event) event.preventDefault();
    setState("loading", "asking /v1/recommend ...");
    try {
      const req = await buildRequest();
      $("request").textContent = JSON.stringify(req, null, 1);
      const t0 = performance.now();
      const res = await api("v1/recommend", {
        method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(req),
      });
      render(req, res, performance.now() - t0);
      window.genrecExplorer = { request: req, response: res }; // the last exchange, for the console (and tests)
      const dropped = res.dropped_items.length ? "; unknown history ids: " + res.dropped_items.join(", ") : "";
      setState("ready", res.items.length + " items" + dropped);
    } catch (e) {
      setState("error", e.message);
    }
  }

  async function loadUsers() {
    try {
      const got = await api("v1/users?limit=1000");
      const list = $("users");
      got.users.forEach((u) => {
        const o = document.createElement("option");
        o.value = String(u.user_id);
        o.label = u.events + " events";
        list.appendChild(o);
      });
      $("users-note").textContent = got.total + " users" + (got.total > got.users.length ? " (the first " +
        got.users.length + " listed; type any id)" : "");
      if (!$("user").value && got.users.length) $("user").placeholder = "e.g. " + got.users[0].user_id;
    } catch (e) {
      $("users-note").textContent = e.message;
    }
  }

  $("ask").addEventListener("submit", run);
  $("user").addEventListener("focus", () => { document.querySelector("input[value=user]").checked = true; });
  $("paste").addEventListener("focus", () => { document.querySelector("input[value=paste]").checked = true; });
  const params = new URLSearchParams(location.search);
  loadUsers().then(() => {
    if (params.get("user")) { // a link to a user: /?user=42
      $("user").value = params.get("user");
      run();
    } else if (document.body.dataset.state === "idle") {
      document.body.dataset.state = "waiting"; // for a user or a history
    }
  });
})();

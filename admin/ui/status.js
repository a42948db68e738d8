// The status page: reads /api/exchanges, /api/upcoming, /api/status and
// /readyz every few seconds and shows them. Everything is built with DOM
// calls and textContent (never innerHTML), so names from the store are
// shown as text. When the admin API asks for a token, the page asks for it
// and keeps it in sessionStorage (this tab only); a link may carry it once
// in its fragment (#token=...), which never reaches the server and is
// removed from the address bar at once.
"use strict";

(() => {
  const REFRESH_MS = 5000;
  const TOKEN_KEY = "delayproxy.admin-token";
  const RANGE_LABELS = {
    overdue: "Overdue",
    next_minute: "Next minute",
    next_hour: "Next hour",
    next_day: "Next day",
    next_week: "Next week",
    later: "Later",
  };
  const SVG = "http://www.w3.org/2000/svg";
  const nf = new Intl.NumberFormat("en-US");
  const $ = (id) => document.getElementById(id);

  class Unauthorized extends Error {}

  // Formatting. The numbers shown are rounded for reading; the API has them
  // exact.
  const count = (n) => (n == null ? "–" : nf.format(n));
  function rate(x) {
    if (x == null) return "–";
    if (x === 0) return "0";
    if (x < 1) return x.toFixed(2);
    if (x < 10) return x.toFixed(1);
    return nf.format(Math.round(x));
  }
  function span(s) {
    s = Math.round(s);
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
    const m = Math.floor((s % 3600) / 60), sec = s % 60;
    if (d) return `${d}d ${h}h`;
    if (h) return `${h}h ${m}m`;
    if (m) return `${m}m ${sec}s`;
    return `${sec}s`;
  }
  function seconds(x) {
    if (x == null) return "–";
    if (x === 0) return "0";
    if (x < 1) {
      const ms = x * 1000;
      return (ms < 10 ? ms.toFixed(1) : String(Math.round(ms))) + " ms";
    }
    if (x < 60) return x.toFixed(1) + " s";
    return span(x);
  }
  function relative(ms, nowMs) {
    const d = (ms - nowMs) / 1000;
    return d >= 0 ? "in " + span(d) : "overdue " + span(-d);
  }
  const clock = (ms) => new Date(ms).toLocaleTimeString("en-GB");

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const c of children) e.append(c);
    return e;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }
  const text = (id, s) => { $(id).textContent = s; };

  // The token.
  function takeTokenFromFragment() {
    const m = /^#token=(.+)$/.exec(location.hash);
    if (!m) return;
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  const token = () => sessionStorage.getItem(TOKEN_KEY);

  async function getJSON(path) {
    const headers = { Accept: "application/json" };
    if (token()) headers.Authorization = "Bearer " + token();
    const resp = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
    if (resp.status === 401) throw new Unauthorized();
    if (!resp.ok) {
      let msg = `${resp.status} ${resp.statusText}`;
      try { msg = (await resp.json()).error || msg; } catch { /* not JSON */ }
      throw new Error(`${path}: ${msg}`);
    }
    return resp.json();
  }

  async function readiness() {
    try {
      const resp = await fetch("/readyz", { cache: "no-store", credentials: "omit" });
      return { ok: resp.ok, text: (await resp.text()).trim() };
    } catch (e) {
      return { ok: false, text: String(e.message || e) };
    }
  }

  function setState(msg, bad) {
    const s = $("state");
    s.textContent = msg;
    s.classList.toggle("bad", bad);
  }

  function showLogin(error) {
    $("main").hidden = true;
    $("login").hidden = false;
    $("forget").hidden = true;
    text("login-error", error);
    setState("The admin token is needed", false);
    $("token").focus();
  }

  // Rendering.
  function renderTiles(ex, st) {
    const w = st.window;
    text("version", (st.version || "").replace(/^delayproxy\s+/, ""));
    text("pending", count(ex.pending));
    text("pending-sub", `in ${count(ex.exchanges.length)} exchange${ex.exchanges.length === 1 ? "" : "s"}`);
    const rel = st.releaser;
    text("overdue", count(rel.overdue));
    text("oldest-overdue", rel.oldest_overdue_seconds > 0 ? `oldest ${seconds(rel.oldest_overdue_seconds)} late` : "none waiting");
    $("overdue-tile").classList.toggle("alert", rel.overdue > 0 && rel.oldest_overdue_seconds >= 1);
    text("stored-rate", rate(w && w.stored_per_second));
    text("released-rate", rate(w && w.released_per_second));
    text("refused-rate", rate(w && w.refused_per_second));
    $("refused-tile").classList.toggle("alert", !!w && w.refused_per_second > 0);
    text("stored-total", `${count(st.totals.stored)} since start`);
    text("released-total", `${count(st.totals.released)} since start`);
    text("refused-total", `${count(st.totals.refused)} since start`);
    text("lateness-p50", seconds(w && w.lateness_p50_seconds));
    text("lateness-p99", seconds(w && w.lateness_p99_seconds));
    text("clients", count(st.connections.clients));
    text("channels", count(st.connections.channels));
    text("channels-label", st.connections.channels === 1 ? "channel" : "channels");
    $("rates").dataset.untilMs = w ? String(w.until_ms) : "";
    text("window-note", w
      ? `Rates and lateness over the last ${span(w.seconds)}, ${count(w.releases)} release${w.releases === 1 ? "" : "s"}.`
      : `Rates and lateness appear ${span(st.series.interval_seconds)} after start.`);
  }

  function renderUpcoming(up) {
    const list = $("upcoming");
    const most = Math.max(1, ...up.ranges.map((r) => r.count));
    list.replaceChildren(...up.ranges.map((r) => {
      const fill = el("span", { class: "fill" });
      fill.style.width = r.count > 0 ? `max(3px, ${(100 * r.count) / most}%)` : "0";
      const label = RANGE_LABELS[r.name] || r.name;
      const title = r.until ? `due before ${new Date(r.until_ms).toLocaleString("en-GB")}` : `due after ${new Date(r.from_ms).toLocaleString("en-GB")}`;
      return el("li", { "data-range": r.name, title },
        el("span", { class: "label" }, label),
        el("span", { class: "track", "aria-hidden": "true" }, fill),
        el("span", { class: "count" }, count(r.count)));
    }));
    text("upcoming-total", `${count(up.total)} stored message${up.total === 1 ? "" : "s"}, counted by due minute from ${clock(up.ranges[1].from_ms)}.`);
  }

  function renderExchanges(ex, nowMs) {
    const body = $("exchanges").tBodies[0];
    body.replaceChildren(...ex.exchanges.map((e) => {
      const name = el("td", { class: "name", "data-col": "name" }, e.name === "" ? "(default)" : e.name);
      if (!e.registered) name.append(" ", el("span", { class: "tag deleted", title: "Deleted; its messages are discarded at their due time" }, "deleted"));
      const due = el("td", { "data-col": "next_due" });
      if (e.next_due) {
        const t = el("time", { datetime: e.next_due, title: new Date(e.next_due_ms).toLocaleString("en-GB") }, relative(e.next_due_ms, nowMs));
        if (e.next_due_ms < nowMs) t.classList.add("overdue-text");
        due.append(t);
      } else {
        due.append(el("span", { class: "muted" }, e.pending > 0 ? "later" : "–"));
      }
      return el("tr", {},
        el("td", { "data-col": "vhost" }, e.vhost),
        name,
        el("td", { "data-col": "type" }, e.type ? el("span", { class: "tag" }, e.type)
          : e.kind === "delivery-time" ? el("span", { class: "tag", title: "Holds messages published with x-opt-delivery-time or x-opt-delivery-delay" }, "delivery-time") : ""),
        el("td", { class: "num", "data-col": "pending" }, count(e.pending)),
        due);
    }));
    $("no-exchanges").hidden = ex.exchanges.length > 0;
    $("exchanges").hidden = ex.exchanges.length === 0;
  }

  function renderFacts(st, ready) {
    const r = $("ready");
    r.textContent = ready.ok ? "reachable" : ready.text;
    r.className = ready.ok ? "ok" : "bad";
    const rel = st.releaser;
    text("vhosts", rel.vhosts.length ? rel.vhosts.join(", ") : "none yet");
    text("nodes", rel.nodes.map((n) => `${n.self ? "this node" : n.name}${n.self && n.name ? ` (${n.name})` : ""}${n.releases === "all" ? "" : `: ${n.releases}`}`).join("; "));
    text("reconnects", count(rel.reconnects));
    text("discarded", count(st.totals.discarded));
    text("cancelled", count(st.totals.cancelled));
    text("unroutable", count(st.totals.unroutable));
  }

  // lineChart draws series of the status points over the last 5 minutes:
  // one polyline per series, broken where a value is null.
  function lineChart(box, points, series, fmt, label) {
    const W = 560, H = 130, L = 56, R = 8, T = 8, B = 20;
    const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
    const legend = el("ul", { class: "legend" });
    if (points.length === 0) {
      const t = svg("text", { x: L, y: H / 2, class: "empty" });
      t.textContent = "Collecting samples…";
      chart.append(t);
      chart.setAttribute("aria-label", `${label}: no samples yet`);
      box.replaceChildren(chart);
      return;
    }
    // The last 5 minutes, or as much as there is.
    const end = points[points.length - 1].until_ms;
    const start = Math.max(end - 300_000, points[0].from_ms);
    let top = 0;
    for (const p of points) for (const s of series) if (p[s.key] != null) top = Math.max(top, p[s.key]);
    top = niceCeil(top);
    const x = (ms) => L + ((ms - start) / (end - start)) * (W - L - R);
    const y = (v) => T + (1 - v / top) * (H - T - B);
    for (const v of [0, top / 2, top]) {
      chart.append(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
      const t = svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", class: "axis" });
      t.textContent = fmt(v);
      chart.append(t);
    }
    for (const [ms, s] of [[start, "−" + span((end - start) / 1000)], [end, clock(end)]]) {
      const t = svg("text", { x: x(ms), y: H - 4, "text-anchor": ms === start ? "start" : "end", class: "axis" });
      t.textContent = s;
      chart.append(t);
    }
    const latest = [];
    for (const s of series) {
      let run = [];
      const flush = () => {
        if (run.length === 1) run.push([run[0][0] + 0.01, run[0][1]]);
        if (run.length) chart.append(svg("polyline", { points: run.map((p) => p.join(",")).join(" "), class: `series s-${s.key_class}` }));
        run = [];
      };
      for (const p of points) {
        if (p[s.key] == null || p.from_ms < start) { flush(); continue; }
        run.push([x(p.until_ms).toFixed(1), y(p[s.key]).toFixed(1)]);
      }
      flush();
      const last = points[points.length - 1][s.key];
      latest.push(`${s.name} ${fmt(last)}`);
      legend.append(el("li", { class: `s-${s.key_class}` }, el("span", { class: "k" }, `${s.name} `), fmt(last)));
    }
    chart.setAttribute("aria-label", `${label}, last 5 minutes; latest: ${latest.join(", ")}`);
    box.replaceChildren(chart, legend);
  }

  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function renderCharts(st) {
    const pts = st.series.points;
    const shown = pts.length ? (pts[pts.length - 1].until_ms - Math.max(pts[pts.length - 1].until_ms - 300_000, pts[0].from_ms)) / 1000 : 0;
    for (const e of document.querySelectorAll(".chart-span")) e.textContent = shown ? `· last ${span(shown)}` : "";
    lineChart($("rates-chart"), pts, [
      { key: "stored_per_second", key_class: "stored", name: "stored" },
      { key: "released_per_second", key_class: "released", name: "released" },
      { key: "refused_per_second", key_class: "refused", name: "refused" },
    ], rate, "Messages per second");
    lineChart($("lateness-chart"), pts, [
      { key: "lateness_p50_seconds", key_class: "p50", name: "p50" },
      { key: "lateness_p99_seconds", key_class: "p99", name: "p99" },
    ], seconds, "Release lateness");
  }

  let timer = 0;
  async function refresh() {
    clearTimeout(timer);
    try {
      const [ex, up, st, ready] = await Promise.all([
        getJSON("/api/exchanges"), getJSON("/api/upcoming"), getJSON("/api/status"), readiness(),
      ]);
      renderTiles(ex, st);
      renderUpcoming(up);
      renderExchanges(ex, st.now_ms);
      renderFacts(st, ready);
      renderCharts(st);
      $("login").hidden = true;
      $("main").hidden = false;
      $("main").setAttribute("aria-busy", "false");
      $("forget").hidden = !token();
      setState(`Updated ${clock(st.now_ms)}`, false);
    } catch (e) {
      if (e instanceof Unauthorized) {
        showLogin(token() ? "That token was refused." : "");
        return; // until a token is given
      }
      setState(`Cannot read the status: ${e.message}`, true);
    }
    timer = setTimeout(refresh, REFRESH_MS);
  }

  function start() {
    takeTokenFromFragment();
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const v = $("token").value.trim();
      if (!v) return;
      sessionStorage.setItem(TOKEN_KEY, v);
      $("token").value = "";
      refresh();
    });
    $("forget").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      refresh(); // asks for a token if the API wants one
    });
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && $("login").hidden) refresh();
    });
    refresh();
  }

  start();
})();

// idem orphan dashboard. Plain JavaScript, no framework, no network access
// beyond this server's own API and /metrics.
//
// The token lives in sessionStorage (this tab only) and travels only in the
// Authorization header; it is never put in a URL or logged.
"use strict";

(function () {
  const TOKEN_KEY = "idem.dashboard.token";
  const INTERVAL_KEY = "idem.dashboard.interval";
  const PAGE_LIMIT = 500;
  const MAX_PAGES = 4; // show at most 2000 orphans; counts say "2000+" beyond
  const OUTCOMES = [
    { id: "created", label: "Created", color: "#3b5bdb" },
    { id: "replayed", label: "Replayed", color: "#2b8a3e" },
    { id: "takeover", label: "Takeover", color: "#f08c00" },
    { id: "in_flight", label: "In flight", color: "#868e96" },
    { id: "mismatch", label: "Mismatch", color: "#c92a2a" },
    { id: "error", label: "Error", color: "#862e9c" },
  ];

  const HISTORY_KEY = "idem.dashboard.history";
  const OTHER_TENANTS = "(other)"; // metrics.TenantOther
  const HISTORY_MS = 60 * 60 * 1000; // the chart shows the last hour
  const FIRST_GAP_MS = 2000; // second /metrics sample at load, so rates show at once

  const $ = (id) => document.getElementById(id);

  const state = {
    token: null,
    mode: null, // "operator" | "tenant"
    tenant: null, // the tenant of a tenant token
    filter: null, // tenant selected in the operator view
    lastUpdate: 0, // client ms of the last successful refresh
    skewMs: 0, // server clock minus client clock, from the Date header
    prevClaims: null, // {at: ms, counts: {outcome: n}}
    rates: null,
    bucketed: false, // this tenant's claims are under "(other)" in /metrics
    history: [], // [{t: ms, orphans: n, rates: {outcome: per min} | null}], last hour, this tab
    orphans: [],
    truncated: false,
    tenants: [],
    timer: null,
    gen: 0, // bumped whenever the token changes; stale answers are dropped
    inflightGen: -1,
    canResolve: false, // operator, or a tenant token with tenant:admin
    selected: null, // {tenant, key} of the record panel
    record: null, // the record shown in the panel; null when gone
    pending: null, // the action waiting for confirmation
  };

  class HTTPError extends Error {
    constructor(status, problem) {
      super((problem && (problem.detail || problem.title)) || "HTTP " + status);
      this.status = status;
      this.problem = problem;
    }
  }

  // ---------- token ----------

  function decodeClaims(token) {
    const parts = token.split(".");
    if (parts.length !== 3) return null;
    try {
      const b64 = parts[1].replace(/-/g, "+").replace(/_/g, "/");
      const pad = b64 + "===".slice((b64.length + 3) % 4);
      return JSON.parse(atob(pad));
    } catch (e) {
      return null;
    }
  }

  function setToken(token) {
    const claims = decodeClaims(token);
    if (!claims) return "That does not look like a JWT (three base64url parts separated by dots).";
    const scopes = String(claims.scope || "").split(/\s+/).filter(Boolean);
    state.canResolve = scopes.includes("admin") || scopes.includes("tenant:admin");
    if (scopes.includes("admin")) {
      state.mode = "operator";
      state.tenant = null;
    } else if (claims.tenant) {
      if (!scopes.includes("keys:read") && !scopes.includes("keys:write")) {
        return "This tenant token has no keys:read scope; the dashboard needs it to list keys.";
      }
      state.mode = "tenant";
      state.tenant = String(claims.tenant);
    } else {
      return "This token has neither the admin scope nor a tenant.";
    }
    if (claims.exp && claims.exp * 1000 < Date.now()) {
      return "This token expired " + ago(Date.now() - claims.exp * 1000) + " ago. Mint a new one.";
    }
    state.token = token;
    sessionStorage.setItem(TOKEN_KEY, token);
    return null;
  }

  function resetData() {
    state.gen++;
    state.prevClaims = null;
    state.rates = null;
    state.bucketed = false;
    state.history = [];
    state.metricsError = null;
    state.filter = null;
    state.orphans = [];
    state.tenants = [];
    state.truncated = false;
    state.lastUpdate = 0;
    state.selected = null;
    state.record = null;
    state.pending = null;
  }

  function signOut(message) {
    state.token = null;
    resetData();
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(HISTORY_KEY);
    stopTimer();
    showLogin(message);
  }

  // ---------- HTTP ----------

  async function api(path, body) {
    const headers = { Authorization: "Bearer " + state.token, Accept: "application/json" };
    const init = { headers, cache: "no-store", credentials: "omit" };
    if (body !== undefined) {
      init.method = "POST";
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(path, init);
    noteServerClock(resp);
    if (!resp.ok) {
      let problem = null;
      try { problem = await resp.json(); } catch (e) { /* not JSON */ }
      throw new HTTPError(resp.status, problem);
    }
    return resp.json();
  }

  function noteServerClock(resp) {
    const d = Date.parse(resp.headers.get("Date") || "");
    if (!Number.isNaN(d)) state.skewMs = d - Date.now();
  }

  function serverNow() { return Date.now() + state.skewMs; }

  async function listAll(path) {
    let items = [];
    let cursor = null;
    for (let page = 0; page < MAX_PAGES; page++) {
      const sep = path.includes("?") ? "&" : "?";
      const url = path + sep + "limit=" + PAGE_LIMIT + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
      const body = await api(url);
      items = items.concat(body.items || []);
      cursor = body.next_cursor;
      if (!cursor) return { items, truncated: false };
    }
    return { items, truncated: true };
  }

  async function fetchClaimCounts() {
    const resp = await fetch("/metrics", { cache: "no-store", credentials: "omit" });
    if (!resp.ok) throw new HTTPError(resp.status, null);
    const text = await resp.text();
    const counts = {};
    for (const o of OUTCOMES) counts[o.id] = 0;
    const re = /^idem_claims_total\{([^}]*)\}\s+(\S+)/;
    let own = false, other = false;
    for (const line of text.split("\n")) {
      const m = re.exec(line);
      if (!m) continue;
      const labels = parseLabels(m[1]);
      if (labels.tenant === OTHER_TENANTS) other = true;
      if (state.mode === "tenant" && labels.tenant !== state.tenant) continue;
      own = true;
      const v = Number(m[2]);
      if (!Number.isFinite(v)) continue;
      counts[labels.outcome] = (counts[labels.outcome] || 0) + v;
    }
    // A tenant past IDEM_METRICS_MAX_TENANTS has no series of its own: its
    // claims are counted under "(other)" with other tenants'.
    state.bucketed = state.mode === "tenant" && !own && other;
    return { at: Date.now(), counts };
  }

  function parseLabels(s) {
    const out = {};
    const re = /(\w+)="((?:[^"\\]|\\.)*)"/g;
    let m;
    while ((m = re.exec(s)) !== null) out[m[1]] = m[2].replace(/\\(.)/g, "$1");
    return out;
  }

  // ---------- refresh ----------

  async function refresh() {
    const gen = state.gen;
    if (!state.token || state.inflightGen === gen) return;
    state.inflightGen = gen;
    const done = () => { if (state.inflightGen === gen) state.inflightGen = -1; };
    $("status-dot").className = "dot busy";
    refreshAmplification(gen);
    let data;
    try {
      if (state.mode === "operator") {
        const [tenants, orphans] = await Promise.all([
          api("/v1/admin/tenants"),
          listAll("/v1/admin/orphans"),
        ]);
        data = { tenants: tenants.items || [], orphans: orphans.items, truncated: orphans.truncated };
      } else {
        const tenantID = state.tenant;
        const [tenant, orphans] = await Promise.all([
          api("/v1/tenant"),
          listAll("/v1/keys?state=orphaned"),
        ]);
        data = {
          tenants: [tenant],
          orphans: orphans.items.map((o) => Object.assign({ tenant: tenantID }, o)),
          truncated: orphans.truncated,
        };
      }
    } catch (err) {
      done();
      if (gen !== state.gen) return; // the token changed meanwhile
      return handleError(err);
    }
    if (gen !== state.gen) { done(); return; }
    state.tenants = data.tenants;
    state.orphans = data.orphans;
    state.truncated = data.truncated;
    hideBanner();
    state.lastUpdate = Date.now();
    // Claim rates come from /metrics; a failure there does not hide orphans.
    // The first refresh takes a second sample FIRST_GAP_MS later, so the
    // rates show at once instead of after the next refresh.
    try {
      let now = await fetchClaimCounts();
      if (gen !== state.gen) { done(); return; }
      if (!state.prevClaims) {
        state.prevClaims = now;
        render();
        await new Promise((resolve) => setTimeout(resolve, FIRST_GAP_MS));
        if (gen !== state.gen) { done(); return; }
        now = await fetchClaimCounts();
        if (gen !== state.gen) { done(); return; }
      }
      state.rates = claimRates(state.prevClaims, now) || state.rates;
      state.prevClaims = now;
      state.metricsError = null;
    } catch (err) {
      state.metricsError = "The /metrics endpoint is not reachable from here (it may be on a separate IDEM_METRICS_ADDR), so claim rates are unavailable.";
    }
    done();
    if (gen !== state.gen) return;
    record(state.orphans.length, state.metricsError ? null : state.rates);
    render();
  }

  // claimRates turns two samples of the claim counters into rates per
  // minute; null when they cannot be compared (same instant, or a counter
  // went back: another replica answered, or it restarted).
  function claimRates(prev, now) {
    if (!prev || now.at <= prev.at) return null;
    const minutes = (now.at - prev.at) / 60000;
    const rates = {};
    for (const o of OUTCOMES) {
      const d = (now.counts[o.id] || 0) - (prev.counts[o.id] || 0);
      if (d < 0) return null;
      rates[o.id] = d / minutes;
    }
    return { perMin: rates, windowMs: now.at - prev.at };
  }

  // ---------- history and chart ----------

  // record adds one point to the last hour's history, kept in this tab's
  // sessionStorage so a reload keeps the chart.
  function record(orphans, rates) {
    const t = serverNow();
    state.history.push({ t, orphans, rates: rates ? rates.perMin : null });
    state.history = state.history.filter((p) => p.t >= t - HISTORY_MS);
    try { sessionStorage.setItem(HISTORY_KEY, JSON.stringify(state.history)); } catch (e) { /* full: keep it in memory */ }
  }

  function loadHistory() {
    try {
      const h = JSON.parse(sessionStorage.getItem(HISTORY_KEY) || "[]");
      if (Array.isArray(h)) state.history = h.filter((p) => p && typeof p.t === "number" && p.t >= serverNow() - HISTORY_MS);
    } catch (e) {
      state.history = [];
    }
  }

  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, ...children) {
    const n = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
    for (const c of children) n.append(c);
    return n;
  }

  // renderChart draws the last hour as inline SVG: orphans on top, claim
  // outcomes per minute below, one line per series, x from -60 min to now.
  function renderChart() {
    const box = $("chart");
    const W = 640, H = 240, L = 44, R = 8, plotH = 80, gap = 36, top1 = 10, top2 = top1 + plotH + gap;
    const now = serverNow();
    const x = (t) => L + (W - L - R) * (1 - (now - t) / HISTORY_MS);
    const pts = state.history;
    const root = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "Orphans and claim outcomes over the last hour", class: "chart-svg" });
    const plot = (top, label, series, max) => {
      root.append(svg("text", { x: L, y: top - 2, class: "chart-title" }, label));
      root.append(svg("line", { x1: L, x2: W - R, y1: top + plotH, y2: top + plotH, class: "chart-axis" }));
      root.append(svg("text", { x: L - 6, y: top + 8, class: "chart-tick", "text-anchor": "end" }, fmtAxis(max)));
      root.append(svg("text", { x: L - 6, y: top + plotH, class: "chart-tick", "text-anchor": "end" }, "0"));
      const y = (v) => top + plotH - (plotH * v) / max;
      for (const s of series) {
        const p = pts.filter((q) => s.value(q) !== null);
        if (p.length === 0) continue;
        const d = p.map((q, i) => (i ? "L" : "M") + x(q.t).toFixed(1) + " " + y(s.value(q)).toFixed(1)).join(" ");
        const last = p[p.length - 1];
        root.append(svg("path", { d, class: "chart-line", stroke: s.color, "data-series": s.id, "data-points": String(p.length) },
          svg("title", {}, s.label)));
        root.append(svg("circle", { cx: x(last.t).toFixed(1), cy: y(s.value(last)).toFixed(1), r: 2.5, fill: s.color },
          svg("title", {}, s.label + ": " + fmtAxis(s.value(last)))));
      }
    };
    const maxOf = (vals) => Math.max(1, ...vals);
    const orphanSeries = [{ id: "orphans", label: "Orphans", color: "#c92a2a", value: (q) => q.orphans }];
    plot(top1, "Orphans", orphanSeries, maxOf(pts.map((q) => q.orphans)));
    const rateSeries = OUTCOMES.map((o) => ({ id: o.id, label: o.label + " / min", color: o.color, value: (q) => (q.rates ? q.rates[o.id] || 0 : null) }));
    plot(top2, "Claims / min by outcome", rateSeries, maxOf(pts.flatMap((q) => (q.rates ? OUTCOMES.map((o) => q.rates[o.id] || 0) : []))));
    for (const [t, label] of [[now - HISTORY_MS, "−60 min"], [now - HISTORY_MS / 2, "−30 min"], [now, "now"]]) {
      root.append(svg("text", { x: x(t), y: H - 4, class: "chart-tick", "text-anchor": t === now ? "end" : t === now - HISTORY_MS ? "start" : "middle" }, label));
    }
    box.replaceChildren(root);
    const since = pts.length ? pts[0].t : now;
    $("chart-note").textContent = pts.length < 2
      ? "The chart fills in as this page refreshes; it keeps the last hour in this tab."
      : "Sampled by this page at each refresh since " + new Date(since).toLocaleTimeString() + "; kept for an hour in this tab.";
  }

  function fmtAxis(v) {
    if (v >= 1000) return (v / 1000).toFixed(1) + "k";
    if (v >= 10 || Number.isInteger(v)) return String(Math.round(v));
    return v.toFixed(1);
  }

  // ---------- retry amplification ----------

  const AMP_SERIES = [
    { id: "attempts", label: "All attempts", color: "#c92a2a", value: (b) => b.first_attempts + b.retries + b.refused },
    { id: "first", label: "First attempts", color: "#3b5bdb", value: (b) => b.first_attempts },
    { id: "refused", label: "Retries refused", color: "#f08c00", value: (b) => b.refused },
  ];
  const AMP_WARN = 1.5; // a ratio past this shows in the warning colour

  // refreshAmplification reads the retry budget's last hour (an admin
  // endpoint: operator tokens only) apart from the orphans, so a failure
  // here never hides them, and one there never hides this.
  async function refreshAmplification(gen) {
    const section = $("amp");
    if (state.mode !== "operator") { section.hidden = true; return; }
    section.hidden = false;
    let body;
    try {
      body = await api("/v1/admin/retry-amplification");
    } catch (err) {
      if (gen !== state.gen) return;
      $("amp-note").textContent = "Cannot read the retry amplification (" + err.message + "); retrying on the next refresh.";
      return;
    }
    if (gen !== state.gen) return;
    renderAmplification(body);
  }

  function fmtRatio(v) { return v.toFixed(2) + "×"; }

  // renderAmplification shows, per tenant, the ratio over the budget's
  // window now and the last hour by minute: an inline SVG (attempts,
  // first attempts and refused retries per minute above, the minute's
  // amplification below) and the same numbers in a table.
  function renderAmplification(body) {
    const list = $("amp-list");
    const tenants = body.tenants || [];
    list.replaceChildren(...tenants.map((t) => ampTenant(t, body)));
    const empty = $("amp-empty");
    empty.hidden = tenants.length > 0;
    if (!tenants.length) {
      empty.replaceChildren(el("strong", { text: "No attempts in the last hour" }),
        "This replica has counted no request of any tenant in the last hour.");
    }
    $("amp-note").textContent = "Counted by the replica that answered, in its memory (each replica keeps its own; " +
      "behind a load balancer each sees about the same share). The ratio is over the retry budget's " +
      fmtWindow(body.window_seconds * 1000) + " window; the chart has one point per minute. Amplification = " +
      "(first attempts + retries + refused retries) ÷ first attempts; 1.00× is no retry.";
  }

  function ampTenant(t, body) {
    const ratio = t.amplification;
    const w = t.window;
    const idle = w.first_attempts + w.retries + w.refused === 0;
    return el("div", { class: "amp-tenant", "data-tenant": t.tenant },
      el("div", { class: "amp-head" },
        el("span", { class: "tenant-name", text: t.tenant }),
        el("span", {
          class: "amp-ratio" + (idle ? "" : ratio > AMP_WARN ? " warn" : " good"),
          "data-ratio": ratio.toFixed(2),
          "aria-label": t.tenant + ": amplification " + (idle ? "none, no attempts" : fmtRatio(ratio)) + " over the last " + fmtWindow(body.window_seconds * 1000),
          text: idle ? "–" : fmtRatio(ratio),
        }),
        el("span", { class: "muted small", text: idle
          ? "no attempts in the last " + fmtWindow(body.window_seconds * 1000)
          : "last " + fmtWindow(body.window_seconds * 1000) + ": " + w.first_attempts + " first, " + w.retries + " retries, " + w.refused + " refused" })),
      el("div", { class: "amp-legend", "aria-hidden": "true" }, ...AMP_SERIES.map((s) =>
        el("span", null, el("span", { class: "swatch", style: "background:" + s.color }), s.label))),
      ampChart(t),
      ampTable(t));
  }

  // ampChart draws the buckets (oldest first, one a minute) as inline SVG.
  function ampChart(t) {
    const W = 640, H = 200, L = 44, R = 8, plotH = 70, gap = 34, top1 = 12, top2 = top1 + plotH + gap;
    const n = t.buckets.length;
    const x = (i) => L + (W - L - R) * (n > 1 ? i / (n - 1) : 1);
    const sum = (k) => t.buckets.reduce((a, b) => a + b[k], 0);
    const peak = Math.max(0, ...t.buckets.map((b) => b.amplification));
    const root = svg("svg", {
      viewBox: "0 0 " + W + " " + H, role: "img", class: "chart-svg", "data-tenant": t.tenant,
      "aria-label": "Retry amplification of " + t.tenant + " over the last hour: " + sum("first_attempts") + " first attempts, " +
        sum("retries") + " retries admitted, " + sum("refused") + " refused; highest minute " + fmtRatio(peak) + ". The table below has every minute.",
    });
    const axis = (top, label, max) => {
      root.append(svg("text", { x: L, y: top - 2, class: "chart-title" }, label));
      root.append(svg("line", { x1: L, x2: W - R, y1: top + plotH, y2: top + plotH, class: "chart-axis" }));
      root.append(svg("text", { x: L - 6, y: top + 8, class: "chart-tick", "text-anchor": "end" }, fmtAxis(max)));
      root.append(svg("text", { x: L - 6, y: top + plotH, class: "chart-tick", "text-anchor": "end" }, "0"));
      return (v) => top + plotH - (plotH * v) / max;
    };
    const line = (id, label, color, pts) => {
      if (!pts.length) return;
      const d = pts.map(([i, v], k) => (k ? "L" : "M") + x(i).toFixed(1) + " " + v.toFixed(1)).join(" ");
      root.append(svg("path", { d, class: "chart-line", stroke: color, "data-series": id, "data-points": String(pts.length) },
        svg("title", {}, label)));
    };
    const y1 = axis(top1, "Attempts / min", Math.max(1, ...t.buckets.map(AMP_SERIES[0].value)));
    for (const s of AMP_SERIES) line(s.id, s.label + " / min", s.color, t.buckets.map((b, i) => [i, y1(s.value(b))]));
    // The ratio of a minute without attempts is no point at all.
    const y2 = axis(top2, "Amplification (× first attempts)", Math.max(2, Math.ceil(peak)));
    const ratioPts = [];
    t.buckets.forEach((b, i) => { if (b.first_attempts + b.retries + b.refused > 0) ratioPts.push([i, y2(b.amplification)]); });
    line("amplification", "Amplification", "#862e9c", ratioPts);
    for (const p of ratioPts) root.append(svg("circle", { cx: x(p[0]).toFixed(1), cy: p[1].toFixed(1), r: 2, fill: "#862e9c" }));
    for (const [i, label] of [[0, "−60 min"], [(n - 1) / 2, "−30 min"], [n - 1, "now"]]) {
      root.append(svg("text", { x: x(i).toFixed(1), y: H - 4, class: "chart-tick", "text-anchor": i === 0 ? "start" : i === n - 1 ? "end" : "middle" }, label));
    }
    return root;
  }

  // ampTable lists the minutes with attempts, newest first: the chart's
  // numbers as text.
  function ampTable(t) {
    const rows = t.buckets.filter((b) => b.first_attempts + b.retries + b.refused > 0).reverse();
    const caption = "Minutes with attempts of " + t.tenant + " (" + rows.length + " of " + t.buckets.length + ")";
    return el("details", null,
      el("summary", { text: caption }),
      el("table", { class: "table amp-table", "data-tenant": t.tenant },
        el("caption", { class: "sr-only", text: caption }),
        el("thead", null, el("tr", null,
          el("th", { text: "Minute" }), el("th", { class: "num", text: "First attempts" }), el("th", { class: "num", text: "Retries" }),
          el("th", { class: "num", text: "Refused" }), el("th", { class: "num", text: "Amplification" }))),
        el("tbody", null, ...rows.map((b) => el("tr", { "data-start": b.start },
          el("td", { text: new Date(b.start).toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" }) }),
          el("td", { class: "num", text: String(b.first_attempts) }),
          el("td", { class: "num", text: String(b.retries) }),
          el("td", { class: "num", text: String(b.refused) }),
          el("td", { class: "num", text: fmtRatio(b.amplification) }))))));
  }

  function handleError(err) {
    if (err instanceof HTTPError && err.status === 401) {
      return signOut("The server rejected this token (" + err.message + "). Paste a new one.");
    }
    if (err instanceof HTTPError && (err.status === 403)) {
      const code = err.problem && err.problem.code;
      const why = code === "tenant_unknown"
        ? "The token's tenant does not exist or is disabled."
        : "This token lacks the scope the dashboard needs (admin for operators, keys:read for a tenant).";
      return signOut(why + " Paste another token.");
    }
    const msg = err instanceof HTTPError
      ? "The server answered " + err.status + ": " + err.message
      : "Cannot reach the server (" + err.message + ").";
    showBanner(msg + " Showing the last data; retrying on the next refresh.", err.status === 503 ? "warn" : "");
    $("status-dot").className = "dot stale";
    updateAgo();
  }

  // ---------- rendering ----------

  function el(tag, attrs, ...children) {
    const n = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (v === undefined || v === null || v === false) continue;
        if (k === "class") n.className = v;
        else if (k === "text") n.textContent = v;
        else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
        // Through the CSSOM: the page's Content-Security-Policy refuses
        // inline style attributes (style-src 'self').
        else if (k === "style") n.style.cssText = v;
        else n.setAttribute(k, v);
      }
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      n.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return n;
  }

  function ago(ms) {
    const s = Math.max(0, Math.floor(ms / 1000));
    if (s < 60) return s + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return (m + " min " + (s % 60 ? (s % 60) + " s" : "")).trim();
    const h = Math.floor(m / 60);
    if (h < 48) return (h + " h " + (m % 60 ? (m % 60) + " min" : "")).trim();
    const d = Math.floor(h / 24);
    return (d + " d " + (h % 24 ? (h % 24) + " h" : "")).trim();
  }

  function fmtTime(iso) {
    const d = new Date(iso);
    return Number.isNaN(d.getTime()) ? "" : d.toLocaleString(undefined, {
      year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
    });
  }

  function fmtWindow(ms) {
    return ms < 10000 ? (ms / 1000).toFixed(1) + " s" : ago(ms);
  }

  function fmtRate(v) {
    if (v === 0) return "0";
    if (v < 0.1) return v.toFixed(2);
    if (v < 10) return v.toFixed(1);
    return Math.round(v).toLocaleString();
  }

  function tenantSummaries() {
    const by = new Map();
    for (const t of state.tenants) {
      by.set(t.id, { id: t.id, name: t.name, count: 0, oldest: null, leaseMax: t.settings && t.settings.lease_seconds_max });
    }
    for (const o of state.orphans) {
      let s = by.get(o.tenant);
      if (!s) { s = { id: o.tenant, name: o.tenant, count: 0, oldest: null }; by.set(o.tenant, s); }
      s.count++;
      const exp = Date.parse(o.lease_expires_at);
      if (!Number.isNaN(exp) && (s.oldest === null || exp < s.oldest)) s.oldest = exp;
    }
    return [...by.values()].sort((a, b) =>
      (b.count > 0) - (a.count > 0) || (a.oldest ?? Infinity) - (b.oldest ?? Infinity) || a.id.localeCompare(b.id));
  }

  function render() {
    const now = serverNow();
    const summaries = tenantSummaries();
    const affected = summaries.filter((s) => s.count > 0);
    const total = state.orphans.length;
    const oldest = affected.reduce((m, s) => (s.oldest !== null && (m === null || s.oldest < m) ? s.oldest : m), null);

    // Stats
    setStat("stat-orphans", total === 0 ? "0" : total.toLocaleString() + (state.truncated ? "+" : ""), total > 0 ? "warn" : "good");
    $("stat-orphans-note").textContent = total === 0 ? "nothing stuck" : state.truncated ? "showing the oldest " + total : "in flight with an expired lease";
    if (state.mode === "operator") {
      setStat("stat-tenants", affected.length + " / " + state.tenants.length, affected.length ? "warn" : "good");
      $("stat-tenants-note").textContent = "tenants with orphans";
    } else {
      const t = state.tenants[0] || {};
      const leaseMax = t.settings && t.settings.lease_seconds_max;
      setStat("stat-tenants", leaseMax ? ago(leaseMax * 1000) : "–", "");
      $("stat-tenants-note").textContent = "lease_seconds_max of " + state.tenant;
    }
    setStat("stat-oldest", oldest === null ? "–" : ago(now - oldest), oldest !== null ? "warn" : "");
    if (state.rates) {
      const sum = OUTCOMES.reduce((a, o) => a + state.rates.perMin[o.id], 0);
      setStat("stat-rate", fmtRate(sum), "");
      $("stat-rate-note").textContent = "over the last " + fmtWindow(state.rates.windowMs);
    } else {
      setStat("stat-rate", "–", "");
      $("stat-rate-note").textContent = state.metricsError ? "unavailable" : "measuring…";
    }

    renderTenants(summaries, now);
    renderRates();
    renderChart();
    renderKeys(now);
    $("status-dot").className = "dot ok";
    $("dash").dataset.loaded = "1";
    updateAgo();
  }

  function setStat(id, text, cls) {
    const n = $(id);
    n.textContent = text;
    n.className = "stat-value" + (cls ? " " + cls : "");
  }

  function renderTenants(summaries, now) {
    const body = $("tenants-body");
    body.replaceChildren();
    const max = Math.max(1, ...summaries.map((s) => s.count));
    for (const s of summaries) {
      const overLease = s.oldest !== null && s.leaseMax && (now - s.oldest) / 1000 > s.leaseMax;
      const row = el("tr", {
        class: [state.mode === "operator" ? "clickable" : "", s.count === 0 ? "zero" : "", state.filter === s.id ? "selected" : ""].join(" ").trim(),
        "data-tenant": s.id,
        title: state.mode === "operator" ? "Show only " + s.id : null,
        onclick: state.mode === "operator" ? () => { state.filter = state.filter === s.id ? null : s.id; render(); } : null,
      },
      el("td", null, el("span", { class: "tenant-name", text: s.name || s.id }),
        s.name && s.name !== s.id ? el("span", { class: "tenant-id", text: s.id }) : null),
      el("td", { class: "num", text: s.count.toLocaleString() }),
      el("td", null, s.oldest === null
        ? el("span", { class: "pill ok", text: "none" })
        : el("span", { class: "pill" + (overLease ? " warn" : ""), title: overLease ? "older than the tenant's lease_seconds_max" : null, text: ago(now - s.oldest) })),
      el("td", { class: "bar-col" }, el("div", { class: "bar" }, el("span", { style: "width:" + (100 * s.count / max).toFixed(1) + "%" }))));
      body.append(row);
    }
    const empty = $("tenants-empty");
    if (summaries.length === 0) {
      empty.replaceChildren(el("strong", { text: "No tenants yet" }), "Create one with POST /v1/admin/tenants.");
      empty.hidden = false;
    } else {
      empty.hidden = true;
    }
  }

  function renderRates() {
    const list = $("rates");
    list.replaceChildren();
    const rates = state.rates && state.rates.perMin;
    const max = rates ? Math.max(0.0001, ...OUTCOMES.map((o) => rates[o.id])) : 1;
    for (const o of OUTCOMES) {
      const v = rates ? rates[o.id] : null;
      const totalSince = state.prevClaims ? state.prevClaims.counts[o.id] || 0 : 0;
      list.append(el("li", { "data-outcome": o.id },
        el("span", { class: "rate-name" }, el("span", { class: "swatch", style: "background:" + o.color }), o.label),
        el("div", { class: "bar" }, el("span", { style: "background:" + o.color + ";width:" + (v === null ? 0 : (100 * v / max)).toFixed(1) + "%" })),
        el("span", { class: "rate-val" }, v === null ? "–" : fmtRate(v) + "/min",
          el("span", { class: "sub", text: totalSince.toLocaleString() + " total" }))));
    }
    $("rates-window").textContent = state.rates ? "per minute, last " + fmtWindow(state.rates.windowMs) : "";
    $("rates-note").textContent = state.metricsError
      ? state.metricsError
      : state.bucketed
      ? "This tenant has no claim series of its own in /metrics: the server counts tenants past IDEM_METRICS_MAX_TENANTS under tenant=\"(other)\", so its rates show as 0 here."
      : (state.rates ? "" : "Measuring: a second sample follows in two seconds. ") +
        "Counted by the replica that served /metrics" + (state.mode === "tenant" ? ", for tenant " + state.tenant : ", all tenants") + "; totals since it started.";
  }

  // completerPill shows the completer's hold on a key (issue 24): unknown
  // (the outcome is being found out; the next attempt's time), or review
  // (it gave up: a person must release or complete the key).
  function completerPill(c) {
    if (!c) return el("span", { class: "muted", text: "—" });
    const next = c.state === "unknown" && c.next_attempt_at ? ", next " + fmtTime(c.next_attempt_at) : "";
    const cls = c.state === "review" ? "pill review" : "pill warn";
    return el("span", { class: cls, title: "completer " + c.completer_id + ", attempt " + c.attempts + next + ", deadline " + fmtTime(c.deadline),
      text: c.state + " · " + c.attempts + (c.attempts === 1 ? " attempt" : " attempts") });
  }

  function renderKeys(now) {
    const body = $("keys-body");
    body.replaceChildren();
    const rows = state.filter ? state.orphans.filter((o) => o.tenant === state.filter) : state.orphans;
    const showTenant = state.mode === "operator";
    document.querySelectorAll(".col-tenant").forEach((n) => { n.hidden = !showTenant; });
    const sorted = rows.slice().sort((a, b) => Date.parse(a.lease_expires_at) - Date.parse(b.lease_expires_at));
    for (const o of sorted) {
      const exp = Date.parse(o.lease_expires_at);
      const tr = el("tr", { "data-key": o.key, "data-tenant": o.tenant },
        el("td", null, el("span", { class: "key", text: o.key })),
        showTenant ? el("td", { class: "col-tenant", text: o.tenant }) : null,
        el("td", null, o.operation ? el("span", { class: "op", text: o.operation }) : el("span", { class: "muted", text: "—" })),
        el("td", { class: "num", text: String(o.attempt) }),
        el("td", null, o.recovery_point ? el("span", { class: "pill rp", text: o.recovery_point }) : el("span", { class: "muted", text: "none" })),
        el("td", { class: "ago", title: fmtTime(o.lease_expires_at) }, Number.isNaN(exp) ? "—" : ago(now - exp) + " ago",
          el("span", { class: "sub", text: fmtTime(o.lease_expires_at) })),
        el("td", { class: "ago", title: fmtTime(o.created_at) }, o.created_at ? ago(now - Date.parse(o.created_at)) + " ago" : "—"),
        el("td", { class: "review-cell" }, o.review ? el("span", { class: "pill review", title: o.review.note, text: "review" }) : ""),
        el("td", { class: "completer-cell" }, completerPill(o.completer)));
      if (o.completer) tr.dataset.completer = o.completer.state;
      tr.addEventListener("click", () => openRecord(o.tenant, o.key));
      if (state.selected && state.selected.tenant === o.tenant && state.selected.key === o.key) tr.classList.add("selected");
      body.append(tr);
    }
    const chip = $("filter-chip");
    if (state.filter) {
      chip.replaceChildren("tenant " + state.filter, el("button", { type: "button", title: "Clear filter", "aria-label": "Clear filter", onclick: () => { state.filter = null; render(); } }, "×"));
      chip.hidden = false;
    } else {
      chip.hidden = true;
    }
    $("keys-count").textContent = rows.length === 0 ? "" : rows.length.toLocaleString() + " key" + (rows.length === 1 ? "" : "s") + ", oldest first" + (state.truncated ? " (first " + state.orphans.length + " loaded)" : "");
    const empty = $("keys-empty");
    $("keys-table").hidden = rows.length === 0;
    if (rows.length === 0) {
      empty.replaceChildren(el("div", { class: "icon", text: "✓" }), el("strong", { text: "No orphaned keys" + (state.filter ? " for " + state.filter : "") }),
        "Every claimed key was completed, released, or is still within its lease.");
      empty.hidden = false;
    } else {
      empty.hidden = true;
    }
  }

  // ---------- one key: record, resolutions, audit trail ----------

  function keyBase(tenant, key) {
    const k = encodeURIComponent(key);
    return state.mode === "operator"
      ? "/v1/admin/tenants/" + encodeURIComponent(tenant) + "/keys/" + k
      : "/v1/keys/" + k;
  }

  async function openRecord(tenant, key) {
    state.selected = { tenant, key };
    state.pending = null;
    $("record-result").hidden = true;
    $("record-error").hidden = true;
    await loadRecord();
    renderKeys(serverNow());
    $("record").scrollIntoView({ block: "nearest" });
  }

  // loadRecord reads the selected record (unless known to be gone: after a
  // release) and its audit trail and renders the panel; a record that is
  // gone (released, reaped) shows as such.
  async function loadRecord(gone) {
    const sel = state.selected;
    if (!sel) return;
    const gen = state.gen;
    const base = keyBase(sel.tenant, sel.key);
    let record = null;
    let audit = [];
    try {
      try {
        if (!gone) record = await api(base);
      } catch (err) {
        if (!(err instanceof HTTPError && err.status === 404)) throw err;
      }
      audit = (await api(base + "/audit?limit=100")).items || [];
    } catch (err) {
      if (gen === state.gen) showRecordError(err);
      return;
    }
    if (gen !== state.gen || state.selected !== sel) return;
    state.record = record;
    renderRecord(audit);
  }

  function renderRecord(audit) {
    const sel = state.selected;
    const r = state.record;
    const panel = $("record");
    panel.hidden = false;
    panel.dataset.key = sel.key;
    panel.dataset.tenant = sel.tenant;
    panel.dataset.state = r ? r.state : "gone";
    $("record-key").textContent = sel.key;
    $("record-tenant").textContent = "tenant " + sel.tenant;
    const fields = $("record-fields");
    fields.replaceChildren();
    const add = (name, value) => fields.append(el("dt", { text: name }), el("dd", { "data-field": name, text: value }));
    if (r) {
      add("state", r.state);
      add("fencing token", String(r.fencing_token));
      add("attempt", String(r.attempt));
      add("operation", r.operation || "—");
      add("recovery point", r.recovery_point || "none");
      if (r.lease_expires_at) add("lease expires", fmtTime(r.lease_expires_at));
      if (r.completed_at) add("completed", fmtTime(r.completed_at));
      if (r.response) add("response status", String(r.response.status));
      if (r.completer) {
        add("completer", r.completer.state + ", " + r.completer.attempts + (r.completer.attempts === 1 ? " attempt" : " attempts") +
          (r.completer.state === "unknown" && r.completer.next_attempt_at ? ", next " + fmtTime(r.completer.next_attempt_at) : "") +
          (r.completer.state === "review" ? ": a person must release or complete it" : ""));
        add("completer deadline", fmtTime(r.completer.deadline));
      }
    } else {
      add("state", "gone: released or reaped; the next claim of this key runs the work again");
    }
    const flag = $("record-review");
    flag.hidden = !(r && r.review);
    if (r && r.review) flag.textContent = "Flagged for review " + fmtTime(r.review.at) + ": " + r.review.note;

    const open = r && r.state !== "completed" && r.state !== "expired";
    const actions = $("record-actions");
    actions.hidden = !open;
    for (const b of actions.querySelectorAll("button[data-action]")) {
      const act = b.dataset.action;
      b.disabled = !state.canResolve || (act !== "review" && r && r.state !== "orphaned");
    }
    $("record-actions-note").textContent = !state.canResolve
      ? "Resolving needs an operator token or a tenant token with tenant:admin."
      : r && r.state === "in_flight" ? "The lease still runs: only a review flag is possible." : "";
    renderConfirm();

    const body = $("audit-body");
    body.replaceChildren();
    for (const e of audit) {
      const who = (e.actor.subject || "?") + " (" + e.actor.scope + (e.actor.tenant ? ", " + e.actor.tenant : "") + ")";
      body.append(el("tr", { "data-action": e.action, "data-id": String(e.id) },
        el("td", { class: "ago", title: e.created_at }, fmtTime(e.created_at)),
        el("td", null, el("span", { class: "pill", text: e.action })),
        el("td", { text: who }),
        el("td", { class: "num", text: String(e.fencing_token) + (e.new_fencing_token ? " → " + e.new_fencing_token : "") }),
        el("td", { class: "note", text: e.note })));
    }
    $("audit-table").hidden = audit.length === 0;
    $("audit-empty").hidden = audit.length !== 0;
    panel.dataset.audit = String(audit.length);
  }

  function renderConfirm() {
    const form = $("confirm");
    const act = state.pending;
    form.hidden = !act;
    if (!act) return;
    const r = state.record;
    const sel = state.selected;
    const what = {
      release: "Release key " + sel.key + "? The record is deleted and the next retry runs the work again. " +
        "Only right if the work did not happen (or may safely happen twice).",
      complete: "Complete key " + sel.key + " with the response below? Retries get it replayed, and the late worker is fenced off. " +
        "Only right if the work is known to be done.",
      review: "Flag key " + sel.key + " for review? Nothing else changes; the note shows on the record.",
    }[act];
    $("confirm-text").textContent = what + " (tenant " + sel.tenant + ", fencing token " + r.fencing_token + ")";
    $("confirm-response").hidden = act !== "complete";
    $("confirm-note-req").textContent = act === "review" ? "(required)" : "(optional)";
    $("confirm-go").textContent = { release: "Confirm release", complete: "Confirm completion", review: "Confirm review flag" }[act];
    form.dataset.action = act;
  }

  async function submitResolution() {
    const act = state.pending;
    const r = state.record;
    const sel = state.selected;
    if (!act || !r || !sel) return;
    const body = { action: act, fencing_token: r.fencing_token };
    const note = $("confirm-note").value;
    if (note) body.note = note;
    if (act === "complete") {
      let headers;
      try {
        headers = JSON.parse($("confirm-headers").value || "{}");
      } catch (e) {
        return showRecordError(new Error("The response headers are not a JSON object: " + e.message));
      }
      body.response = { status: Number($("confirm-status").value), headers, body: $("confirm-body").value };
    }
    $("record-error").hidden = true;
    $("confirm-go").disabled = true;
    let gone = false;
    try {
      const res = await api(keyBase(sel.tenant, sel.key) + "/resolve", body);
      gone = res.action === "release";
      state.pending = null;
      $("confirm-note").value = "";
      const done = { release: "Released", complete: "Completed", review: "Flagged for review" }[res.action];
      const result = $("record-result");
      result.textContent = done + " (audit entry " + res.audit.id + ").";
      result.dataset.action = res.action;
      result.hidden = false;
    } catch (err) {
      showRecordError(err);
    } finally {
      $("confirm-go").disabled = false;
    }
    await loadRecord(gone);
    refresh();
  }

  function showRecordError(err) {
    const e = $("record-error");
    const code = err instanceof HTTPError && err.problem && err.problem.code;
    e.textContent = (code ? code + ": " : "") + err.message +
      (code === "lease_lost" ? " The key moved on since it was read; look at it again." : "");
    e.dataset.code = code || "";
    e.hidden = false;
  }

  function updateAgo() {
    const n = $("updated");
    if (!state.lastUpdate) { n.textContent = "Loading…"; return; }
    n.textContent = "Updated " + ago(Date.now() - state.lastUpdate) + " ago";
  }

  // clearView empties every figure so nothing of a previous token shows.
  function clearView() {
    for (const id of ["stat-orphans", "stat-tenants", "stat-oldest", "stat-rate"]) setStat(id, "–", "");
    for (const id of ["stat-orphans-note", "stat-tenants-note", "stat-rate-note", "keys-count", "rates-window", "rates-note", "chart-note"]) $(id).textContent = "";
    for (const id of ["tenants-body", "keys-body", "rates", "chart"]) $(id).replaceChildren();
    for (const id of ["tenants-empty", "keys-empty", "filter-chip", "banner", "record"]) $(id).hidden = true;
    $("keys-table").hidden = false;
  }

  function showBanner(msg, cls) {
    const b = $("banner");
    b.textContent = msg;
    b.className = "banner" + (cls ? " " + cls : "");
    b.hidden = false;
  }

  function hideBanner() { $("banner").hidden = true; }

  // ---------- views ----------

  function showLogin(message) {
    $("dash").hidden = true;
    $("identity").hidden = true;
    $("signout").hidden = true;
    $("login").hidden = false;
    const e = $("login-error");
    e.textContent = message || "";
    e.hidden = !message;
    $("token").value = "";
    $("token").focus();
  }

  function showDashboard() {
    $("login").hidden = true;
    $("dash").hidden = false;
    $("signout").hidden = false;
    const id = $("identity");
    id.textContent = state.mode === "operator" ? "Operator · all tenants" : "Tenant · " + state.tenant;
    id.hidden = false;
    const dash = $("dash");
    dash.dataset.mode = state.mode;
    delete dash.dataset.loaded;
    $("stat-tenants-label").textContent = state.mode === "operator" ? "Tenants affected" : "Lease max";
    $("tenants-hint").hidden = state.mode !== "operator";
    $("title").textContent = state.mode === "operator" ? "Orphaned keys across tenants" : "Orphaned keys of " + state.tenant;
    $("subtitle").textContent = state.mode === "operator"
      ? "Claims whose lease expired with no completion, release or takeover, oldest first."
      : "Your claims whose lease expired with no completion, release or takeover, oldest first.";
    resetData();
    loadHistory(); // this tab's last hour survives a reload
    clearView();
    updateAgo();
    refresh();
    startTimer();
  }

  function startTimer() {
    stopTimer();
    const secs = Number($("interval").value);
    if (secs > 0) state.timer = setInterval(refresh, secs * 1000);
  }

  function stopTimer() {
    if (state.timer) clearInterval(state.timer);
    state.timer = null;
  }

  function init() {
    const saved = sessionStorage.getItem(INTERVAL_KEY);
    if (saved !== null && [...$("interval").options].some((o) => o.value === saved)) $("interval").value = saved;

    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const token = $("token").value.trim().replace(/^Bearer\s+/i, "");
      const err = token ? setToken(token) : "Paste a token first.";
      if (err) {
        $("login-error").textContent = err;
        $("login-error").hidden = false;
        return;
      }
      showDashboard();
    });
    $("token").addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("login-form").requestSubmit(); }
    });
    $("signout").addEventListener("click", () => signOut(null));
    for (const b of $("record-actions").querySelectorAll("button[data-action]")) {
      b.addEventListener("click", () => {
        state.pending = b.dataset.action;
        $("record-result").hidden = true;
        $("record-error").hidden = true;
        renderConfirm();
        $("confirm-note").focus();
      });
    }
    $("confirm").addEventListener("submit", (ev) => { ev.preventDefault(); submitResolution(); });
    $("confirm-cancel").addEventListener("click", () => { state.pending = null; renderConfirm(); });
    $("record-close").addEventListener("click", () => {
      state.selected = null;
      state.record = null;
      state.pending = null;
      $("record").hidden = true;
      renderKeys(serverNow());
    });
    $("refresh").addEventListener("click", refresh);
    $("interval").addEventListener("change", () => {
      sessionStorage.setItem(INTERVAL_KEY, $("interval").value);
      startTimer();
    });
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && state.token) refresh();
    });
    setInterval(updateAgo, 1000);

    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token && !setToken(token)) showDashboard();
    else { sessionStorage.removeItem(TOKEN_KEY); showLogin(null); }
  }

  init();
})();

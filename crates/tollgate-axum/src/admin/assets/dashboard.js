// tollgate's operator dashboard. Everything shown comes from the admin API
// and, through it, from clients (subject ids, labels, holders): it is
// written with textContent only, never parsed as HTML.
(function () {
  "use strict";

  const REFRESH_MS = 1500;
  // The API is beside this script, wherever the application mounted both.
  const BASE = new URL(".", document.currentScript.src);
  const TOKEN_KEY = "tollgate-admin-token";

  let token = null;
  let timer = null;
  let running = false;
  // The last lookup, re-run on every refresh so its figures stay live.
  let search = null;
  // Per limiter: the last cumulative counters seen, for rates.
  const counters = new Map();

  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------ the token

  // The token from `#token=…` (then dropped from the address bar and the
  // history), else the one this tab was given before.
  function readToken() {
    const hash = window.location.hash;
    if (hash.length > 1) {
      const given = new URLSearchParams(hash.slice(1)).get("token");
      if (given) {
        remember(given);
        history.replaceState(null, "", window.location.pathname + window.location.search);
        return given;
      }
    }
    try {
      return sessionStorage.getItem(TOKEN_KEY);
    } catch (_) {
      return null;
    }
  }

  function remember(t) {
    try {
      sessionStorage.setItem(TOKEN_KEY, t);
    } catch (_) {
      // Storage off: the token lives as long as the page.
    }
  }

  function forget(message) {
    token = null;
    search = null;
    clearTimeout(timer);
    try {
      sessionStorage.removeItem(TOKEN_KEY);
    } catch (_) {
      // Nothing stored.
    }
    $("dashboard").hidden = true;
    $("forget-token").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    setStatus("idle", "not connected");
    $("token-input").focus();
  }

  function start(t) {
    token = t;
    $("login").hidden = true;
    $("dashboard").hidden = false;
    $("forget-token").hidden = false;
    setStatus("idle", "connecting…");
    tick();
  }

  // ------------------------------------------------------------- the API

  class ApiError extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status;
    }
  }

  // One API call with the bearer token; the JSON answer, null for a 204,
  // or an ApiError carrying the problem document's detail.
  async function api(path, init) {
    const options = Object.assign({ cache: "no-store", credentials: "omit" }, init || {});
    options.headers = Object.assign({ Authorization: "Bearer " + token }, options.headers || {});
    let res;
    try {
      res = await fetch(new URL("api/" + path, BASE), options);
    } catch (e) {
      throw new ApiError(0, "the server did not answer");
    }
    if (res.status === 204) {
      return null;
    }
    const text = await res.text();
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch (_) {
      body = null;
    }
    if (!res.ok) {
      const detail = body && typeof body.detail === "string" ? body.detail : res.statusText;
      throw new ApiError(res.status, detail || "HTTP " + res.status);
    }
    return body;
  }

  function post(path, body) {
    return api(path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
  }

  // ------------------------------------------------------------ formatting

  function duration(ms) {
    if (ms === null || ms === undefined) {
      return "—";
    }
    if (ms < 1000) {
      return Math.round(ms) + " ms";
    }
    const s = ms / 1000;
    if (s < 60) {
      return (s < 10 ? s.toFixed(1) : Math.round(s)) + " s";
    }
    if (s < 3600) {
      return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    }
    if (s < 86400) {
      return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
    }
    return Math.floor(s / 86400) + " d " + Math.round((s % 86400) / 3600) + " h";
  }

  const PERIODS = { 1: "second", 60: "minute", 3600: "hour", 86400: "day" };

  function period(seconds) {
    return PERIODS[seconds] || duration(seconds * 1000);
  }

  function quotas(list) {
    return (list || [])
      .map((q) => {
        let s = q.limit + " / " + period(q.period_seconds);
        if (q.burst !== undefined && q.burst !== q.limit) {
          s += " (burst " + q.burst + ")";
        }
        return s;
      })
      .join(", ");
  }

  function clock(ms) {
    return new Date(ms).toLocaleTimeString();
  }

  function ago(ms) {
    const d = Date.now() - ms;
    return d < 1000 ? "just now" : duration(d) + " ago";
  }

  // Per-second rates of a limiter: given by the server (its recent
  // traffic), or from the change of cumulative counters since the last
  // refresh; null when neither exists.
  function rates(l) {
    const t = l.traffic;
    if (t && (typeof t.allowed_per_second === "number" || typeof t.denied_per_second === "number")) {
      return { allowed: t.allowed_per_second, denied: t.denied_per_second };
    }
    if (typeof l.allowed !== "number" || typeof l.denied !== "number") {
      return null;
    }
    const now = Date.now();
    const last = counters.get(l.name);
    counters.set(l.name, { at: now, allowed: l.allowed, denied: l.denied });
    if (!last || now <= last.at) {
      return null;
    }
    const secs = (now - last.at) / 1000;
    return {
      allowed: Math.max(0, l.allowed - last.allowed) / secs,
      denied: Math.max(0, l.denied - last.denied) / secs,
    };
  }

  function rate(r) {
    if (typeof r !== "number") {
      return "—";
    }
    return r < 10 ? r.toFixed(1) : String(Math.round(r));
  }

  // ------------------------------------------------------------- rendering

  function setStatus(state, text) {
    const el = $("status");
    el.dataset.state = state;
    el.textContent = text;
  }

  function setText(el, text) {
    const s = String(text);
    if (el.textContent !== s) {
      el.textContent = s;
    }
  }

  function field(row, name) {
    return row.querySelector('[data-field="' + name + '"]');
  }

  // A row whose cells are named by `fields` (a name, or [name, class]).
  function row(fields) {
    const tr = document.createElement("tr");
    for (const f of fields) {
      const [name, cls] = Array.isArray(f) ? f : [f, ""];
      const td = document.createElement("td");
      td.dataset.field = name;
      if (cls) {
        td.className = cls;
      }
      tr.appendChild(td);
    }
    return tr;
  }

  function button(action, label, cls) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "act" + (cls ? " " + cls : "");
    b.dataset.action = action;
    b.textContent = label;
    return b;
  }

  // Brings `table`'s rows to `items`, in order, keeping the rows that stay
  // (a button being clicked is not replaced under the pointer). Rows of one
  // key are matched in order, so a key listed twice never leaves a row
  // behind.
  function sync(tableId, items, keyOf, build, update) {
    const tbody = $(tableId).tBodies[0];
    const old = new Map();
    for (const tr of Array.from(tbody.rows)) {
      const same = old.get(tr.dataset.key);
      if (same) {
        same.push(tr);
      } else {
        old.set(tr.dataset.key, [tr]);
      }
    }
    let prev = null;
    for (const item of items) {
      const key = keyOf(item);
      const same = old.get(key);
      let tr = same && same.shift();
      if (!tr) {
        tr = build(item);
        tr.dataset.key = key;
      }
      update(tr, item);
      const want = prev ? prev.nextSibling : tbody.firstChild;
      if (want !== tr) {
        tbody.insertBefore(tr, want);
      }
      prev = tr;
    }
    old.forEach((rows) => rows.forEach((tr) => tr.remove()));
    document.querySelector('[data-empty-for="' + tableId + '"]').hidden = items.length > 0;
    $(tableId).classList.toggle("is-empty", items.length === 0);
  }

  function showError(tableId, message) {
    setText(document.querySelector('[data-error-for="' + tableId + '"]'), message || "");
  }

  function renderLimiters(limiters, throttled) {
    const perLimiter = new Map();
    for (const t of throttled || []) {
      perLimiter.set(t.limiter, (perLimiter.get(t.limiter) || 0) + 1);
    }
    sync(
      "limiters-table",
      limiters,
      // A name run under two algorithms (a plan change) has a row for each.
      (l) => l.name + "\u0000" + l.algorithm,
      (l) => {
        const tr = row([
          "name",
          "algorithm",
          "quotas",
          ["allowed", "num"],
          ["denied", "num"],
          ["throttled", "num"],
        ]);
        tr.dataset.limiter = l.name;
        return tr;
      },
      (tr, l) => {
        const r = rates(l);
        setText(field(tr, "name"), l.name);
        setText(field(tr, "algorithm"), l.algorithm);
        setText(field(tr, "quotas"), quotas(l.quotas));
        setText(field(tr, "allowed"), rate(r && r.allowed));
        setText(field(tr, "denied"), rate(r && r.denied));
        setText(field(tr, "throttled"), perLimiter.get(l.name) || 0);
      }
    );
    syncLimiterChoice(limiters);
  }

  // The search box's limiter list follows the registry, keeping the choice.
  function syncLimiterChoice(limiters) {
    const select = $("search-limiter");
    const names = Array.from(new Set(limiters.map((l) => l.name)));
    const have = Array.from(select.options).map((o) => o.value);
    if (names.join("\n") === have.join("\n")) {
      return;
    }
    const chosen = select.value;
    select.replaceChildren();
    for (const name of names) {
      const o = document.createElement("option");
      o.value = name;
      o.textContent = name;
      select.appendChild(o);
    }
    if (names.includes(chosen)) {
      select.value = chosen;
    }
  }

  function renderThrottled(subjects) {
    sync(
      "throttled-table",
      subjects,
      (t) => t.limiter + "\u0000" + t.subject,
      (t) => {
        const tr = row(["limiter", "subject", "label", ["denied", "num"], "last", ["actions", "actions"]]);
        tr.dataset.limiter = t.limiter;
        tr.dataset.subject = t.subject;
        const code = document.createElement("code");
        field(tr, "subject").appendChild(code);
        const actions = field(tr, "actions");
        actions.append(button("reset", "Reset"), button("block", "Block", "warn"), button("unblock", "Unblock"));
        return tr;
      },
      (tr, t) => {
        setText(field(tr, "limiter"), t.limiter);
        setText(field(tr, "subject").firstChild, t.subject);
        setText(field(tr, "label"), t.label === null || t.label === undefined ? "—" : t.label);
        setText(field(tr, "denied"), t.denied);
        const last = field(tr, "last");
        setText(last, ago(t.last_denied_ms));
        last.title = new Date(t.last_denied_ms).toLocaleString();
      }
    );
  }

  function renderHolders(holders) {
    sync(
      "holders-table",
      holders,
      (h) => [h.kind, h.name, h.subject, h.fence].join("\u0000"),
      () =>
        row(["kind", "name", "subject", ["fence", "num"], "holder", ["held", "num"], ["ttl", "num"]]),
      (tr, h) => {
        tr.dataset.kind = h.kind;
        setText(field(tr, "kind"), h.kind);
        setText(field(tr, "name"), h.name);
        setText(field(tr, "subject"), h.subject);
        setText(field(tr, "fence"), h.fence);
        setText(field(tr, "holder"), h.holder);
        setText(field(tr, "held"), duration(h.held_ms));
        setText(field(tr, "ttl"), duration(h.ttl_ms));
      }
    );
  }

  // Idempotency keys claimed and not completed: the key id, never a payload.
  function renderInFlight(keys) {
    sync(
      "idempotency-table",
      keys,
      (k) => [k.name, k.key, k.fence].join("\u0000"),
      () => row(["name", "key", ["fence", "num"], ["held", "num"], ["ttl", "num"]]),
      (tr, k) => {
        setText(field(tr, "name"), k.name);
        setText(field(tr, "key"), k.key);
        setText(field(tr, "fence"), k.fence);
        setText(field(tr, "held"), duration(k.held_ms));
        setText(field(tr, "ttl"), duration(k.ttl_ms));
      }
    );
  }

  function renderSearch(s) {
    const box = $("search-result");
    box.dataset.limiter = s.limiter;
    box.dataset.subject = s.subject;
    setText(field(box, "limiter"), s.limiter);
    setText(field(box, "subject"), s.subject);
    setText(field(box, "remaining"), s.remaining + " of " + s.limit);
    setText(field(box, "retry"), s.retry_after_ms === null ? "admitted now" : duration(s.retry_after_ms));
    setText(field(box, "reset"), duration(s.reset_after_ms));
    setText(
      field(box, "blocked"),
      s.blocked_until_ms === null || s.blocked_until_ms === undefined
        ? "not blocked"
        : clock(s.blocked_until_ms) + " (in " + duration(s.blocked_until_ms - Date.now()) + ")"
    );
    box.classList.toggle("blocked", s.blocked_until_ms !== null && s.blocked_until_ms !== undefined);
    box.hidden = false;
  }

  // ------------------------------------------------------------ refreshing

  function settled(result, tableId, render) {
    if (result.status === "fulfilled") {
      showError(tableId, "");
      render(result.value);
      return null;
    }
    return result.reason;
  }

  async function refresh() {
    const results = await Promise.allSettled([
      api("limiters"),
      api("throttled"),
      api("holders"),
      api("idempotency"),
    ]);
    const [limiters, throttled, holders, inFlight] = results;
    const refused = results.find((r) => r.status === "rejected" && r.reason.status === 401);
    if (refused) {
      forget("The token was refused: " + refused.reason.message);
      return;
    }
    const throttledList = throttled.status === "fulfilled" ? throttled.value.subjects || [] : [];
    const errors = [
      settled(limiters, "limiters-table", (v) => renderLimiters(v.limiters || [], throttledList)),
      settled(throttled, "throttled-table", () => renderThrottled(throttledList)),
    ];
    errors.push(settled(holders, "holders-table", (v) => renderHolders(v.holders || [])));
    errors.push(settled(inFlight, "idempotency-table", (v) => renderInFlight(v.in_flight || [])));
    const tables = ["limiters-table", "throttled-table", "holders-table", "idempotency-table"];
    for (const [i, e] of errors.entries()) {
      if (e) {
        showError(tables[i], e.message);
      }
    }
    if (search) {
      await lookUp(search, false);
    }
    const failed = errors.filter((e) => e);
    if (failed.length) {
      setStatus("error", "refresh failed: " + failed[0].message);
    } else {
      setStatus("ok", "live · updated " + clock(Date.now()));
    }
  }

  async function tick() {
    clearTimeout(timer);
    if (!token || running) {
      return;
    }
    running = true;
    try {
      await refresh();
    } finally {
      running = false;
      if (token) {
        timer = setTimeout(tick, REFRESH_MS);
      }
    }
  }

  // ---------------------------------------------------------- lookups, actions

  async function lookUp(s, announce) {
    const q = new URLSearchParams({ limiter: s.limiter });
    q.set(s.by === "subject" ? "subject" : "key", s.value);
    try {
      const state = await api("subjects?" + q.toString());
      setText($("search-error"), "");
      renderSearch(state);
    } catch (e) {
      if (e.status === 401) {
        forget("The token was refused: " + e.message);
        return;
      }
      if (announce || e.status !== 0) {
        $("search-result").hidden = true;
        setText($("search-error"), e.message);
      }
      if (announce && (e.status === 400 || e.status === 404)) {
        // Nothing to keep live.
        search = null;
      }
    }
  }

  function notice(text, kind) {
    const n = $("notice");
    n.textContent = text;
    n.dataset.kind = kind;
    n.hidden = false;
    clearTimeout(notice.timer);
    notice.timer = setTimeout(() => {
      n.hidden = true;
    }, 5000);
  }

  async function act(action, limiter, subject) {
    const body = { limiter: limiter, subject: subject };
    if (action === "block") {
      body.seconds = Number($("block-seconds").value);
    }
    try {
      await post(action, body);
      const n = $("notice");
      n.dataset.lastAction = action;
      n.dataset.lastSubject = subject;
      const what = action === "block" ? "Blocked for " + duration(body.seconds * 1000) : action === "reset" ? "Reset" : "Unblocked";
      notice(what + ": " + limiter + " · " + subject, "ok");
    } catch (e) {
      if (e.status === 401) {
        forget("The token was refused: " + e.message);
        return;
      }
      notice(action + " failed: " + e.message, "error");
    }
    tick();
  }

  // ----------------------------------------------------------------- wiring

  function onAction(ev, locate) {
    const b = ev.target.closest("button[data-action]");
    if (!b) {
      return;
    }
    const where = locate(b);
    if (where && where.dataset.limiter && where.dataset.subject) {
      b.disabled = true;
      act(b.dataset.action, where.dataset.limiter, where.dataset.subject).finally(() => {
        b.disabled = false;
      });
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const t = $("token-input").value.trim();
      if (t) {
        $("token-input").value = "";
        remember(t);
        start(t);
      }
    });
    $("forget-token").addEventListener("click", () => forget(""));
    $("throttled-table").addEventListener("click", (ev) => onAction(ev, (b) => b.closest("tr")));
    $("search-result").addEventListener("click", (ev) => onAction(ev, () => $("search-result")));
    $("search-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      search = {
        limiter: $("search-limiter").value,
        by: $("search-by").value,
        value: $("search-value").value,
      };
      lookUp(search, true);
    });

    const t = readToken();
    if (t) {
      start(t);
    } else {
      forget("");
    }
  });
})();

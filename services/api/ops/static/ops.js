// keel's operator's page: polls /ops/api/* every few seconds and fills the tables;
// every action is confirmed in a dialog before it is sent, with the page's CSRF token.
// No framework and no build step: the DOM is built with createElement and textContent
// only, so nothing from the server is ever parsed as HTML.
"use strict";

(() => {
  const POLL_MS = 2000;
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const statusLine = document.getElementById("status");
  const updatedLine = document.getElementById("updated");
  const expanded = new Set();
  let sessionEnded = false;
  let timer = null;
  let refreshing = false;
  let refreshAgain = false;

  class SessionEnded extends Error {}

  // --- small helpers --------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === false || value === null || value === undefined) continue;
      if (name === "text") node.textContent = value;
      else if (name === "onclick") node.addEventListener("click", value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function duration(seconds) {
    const s = Math.max(0, Math.round(seconds));
    if (s < 120) return `${s} s`;
    if (s < 7200) return `${Math.round(s / 60)} min`;
    if (s < 172800) return `${Math.round(s / 3600)} h`;
    return `${Math.round(s / 86400)} days`;
  }

  function ago(seconds) {
    return seconds === null || seconds === undefined ? "never" : `${duration(seconds)} ago`;
  }

  function shortId(id) {
    return String(id).slice(0, 8);
  }

  async function faultMessage(response) {
    try {
      const body = await response.json();
      for (const value of Object.values(body)) {
        if (value && typeof value.message === "string") return value.message;
      }
    } catch (_) {
      // not JSON: fall through
    }
    return `HTTP ${response.status}`;
  }

  async function getJSON(path) {
    const response = await fetch(path, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (response.status === 401 || response.status === 403) throw new SessionEnded();
    if (!response.ok) throw new Error(await faultMessage(response));
    return response.json();
  }

  async function post(path, body) {
    const response = await fetch(path, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify(body || {}),
    });
    if (response.status === 401) throw new SessionEnded();
    if (!response.ok) throw new Error(await faultMessage(response));
    return response.json();
  }

  function record(message, ok) {
    const when = new Date().toLocaleTimeString();
    const item = el("li", { class: ok ? "ok" : "failed" }, `${when}: ${message}`);
    document.getElementById("activity").prepend(item);
  }

  // Rebuilding a table would lose the keyboard focus: put it back on the same control.
  function keepingFocus(render) {
    const focused = document.activeElement && document.activeElement.id;
    render();
    if (focused) {
      const again = document.getElementById(focused);
      if (again && again !== document.activeElement) again.focus();
    }
  }

  function fill(tableId, rows, emptyText, columns) {
    const body = document.querySelector(`#${tableId} tbody`);
    body.replaceChildren(...rows);
    if (!rows.length) {
      body.append(el("tr", {}, el("td", { colspan: columns, class: "muted", text: emptyText })));
    }
  }

  // --- the confirmation dialog -----------------------------------------------------

  function ask({ title, text, reason = false, items = [], ok = "Confirm" }) {
    const dialog = document.getElementById("confirm");
    document.getElementById("confirm-title").textContent = title;
    document.getElementById("confirm-text").textContent = text;
    const reasonRow = document.getElementById("confirm-reason-row");
    const reasonInput = document.getElementById("confirm-reason");
    reasonRow.hidden = !reason;
    reasonInput.required = reason;
    reasonInput.value = "";
    document.getElementById("confirm-list").replaceChildren(
      ...items.map((item) => el("li", { text: item }))
    );
    document.getElementById("confirm-ok").textContent = ok;
    return new Promise((resolve) => {
      dialog.addEventListener(
        "close",
        () => resolve({ confirmed: dialog.returnValue === "confirm", reason: reasonInput.value }),
        { once: true }
      );
      dialog.returnValue = "";
      dialog.showModal();
      (reason ? reasonInput : document.getElementById("confirm-cancel")).focus();
    });
  }

  // --- actions -----------------------------------------------------------------------

  async function hostAction(host, action, body, done) {
    try {
      await post(`/ops/api/hosts/${host.uuid}/${action}`, body);
      record(`${host.host}: ${done}`, true);
    } catch (error) {
      if (error instanceof SessionEnded) return endSession();
      record(`${host.host}: refused: ${error.message}`, false);
    }
    refresh();
  }

  async function disable(host) {
    const answer = await ask({
      title: `Disable ${host.host}?`,
      text: "The scheduler stops placing new servers there; its servers keep running.",
      reason: true,
      ok: "Disable",
    });
    if (answer.confirmed && answer.reason.trim()) {
      await hostAction(host, "disable", { reason: answer.reason.trim() }, "disabled");
    }
  }

  async function enable(host) {
    const answer = await ask({
      title: `Enable ${host.host}?`,
      text: "The scheduler places servers there again.",
      ok: "Enable",
    });
    if (answer.confirmed) await hostAction(host, "enable", {}, "enabled");
  }

  async function forceDown(host) {
    const answer = await ask({
      title: `Force ${host.host} down?`,
      text:
        "Do this only once the host is off or its guests are stopped: a host forced down " +
        "counts as fenced, and its servers may be evacuated and run elsewhere.",
      ok: "Force down",
    });
    if (answer.confirmed) await hostAction(host, "force-down", {}, "forced down");
  }

  async function forceUp(host) {
    const answer = await ask({
      title: `Bring ${host.host} back up?`,
      text: "keel takes its heartbeats into account again.",
      ok: "Force up",
    });
    if (answer.confirmed) await hostAction(host, "force-up", {}, "no longer forced down");
  }

  async function evacuate(host) {
    let listed;
    try {
      listed = await getJSON(`/ops/api/hosts/${host.uuid}/servers`);
    } catch (error) {
      if (error instanceof SessionEnded) return endSession();
      record(`${host.host}: cannot list its servers: ${error.message}`, false);
      return;
    }
    const servers = listed.servers;
    const answer = await ask({
      title: `Evacuate ${servers.length} server(s) of ${host.host}?`,
      text:
        `${host.fence_reason}. Each server is rebuilt on another host the scheduler ` +
        "chooses; one request is sent per server.",
      items: servers.map((s) => `${s.name} (${shortId(s.id)}, ${s.status})`),
      ok: "Evacuate",
    });
    if (!answer.confirmed) return;
    for (const server of servers) {
      try {
        await post(`/ops/api/servers/${server.id}/evacuate`, {});
        record(`${server.name}: evacuation from ${host.host} accepted`, true);
      } catch (error) {
        if (error instanceof SessionEnded) return endSession();
        record(`${server.name}: evacuation refused: ${error.message}`, false);
      }
    }
    refresh();
  }

  async function drain(host) {
    const answer = await ask({
      title: `Drain ${host.host}?`,
      text:
        `The host is disabled first, then each of its ${host.servers} server(s) is moved to ` +
        "another host, at most 2 at once: live where it can (it runs throughout), by cold " +
        "migration where it cannot (a stopped server, or a live migration that failed: " +
        "shut down, moved and started again). The conductors carry " +
        "the drain out; its progress shows under Host tasks, and the host stays disabled " +
        "once it is empty.",
      ok: "Drain",
    });
    if (!answer.confirmed) return;
    try {
      const started = await post(`/ops/api/hosts/${host.uuid}/drain`, {
        parallel: 2,
        cold_fallback: true,
      });
      record(
        `${host.host}: ${started.new ? "drain started" : "already draining"} (host task ${started.number})`,
        true
      );
    } catch (error) {
      if (error instanceof SessionEnded) return endSession();
      record(`${host.host}: drain refused: ${error.message}`, false);
    }
    refresh();
  }

  // --- rendering -----------------------------------------------------------------------

  const STATE_CLASS = {
    up: "state-up",
    down: "state-down",
    fenced: "state-fenced",
    "forced down": "state-forced",
  };

  function actionButton(host, action, label, enabled, handler) {
    return el("button", {
      type: "button",
      id: `${action}-${host.uuid}`,
      "data-action": action,
      "data-host": host.host,
      "aria-label": `${label} ${host.host}`,
      disabled: !enabled,
      text: label,
      onclick: () => handler(host),
    });
  }

  function fencingCell(host) {
    const cell = el("td", {});
    cell.append(
      host.fence_lease === null
        ? "no armed fence"
        : `fence armed, lease ${duration(host.fence_lease)}`
    );
    if (!host.up) {
      let detail = host.fence_reason;
      if (!host.fenced && host.fenced_in !== null) {
        detail = `fenced in ${duration(host.fenced_in)}`;
      }
      cell.append(el("br"), el("span", { class: "detail", text: detail }));
    }
    return cell;
  }

  function serversCell(host) {
    const counts = Object.entries(host.servers_by_status)
      .map(([status, n]) => `${n} ${status}`)
      .join(", ");
    const open = expanded.has(host.uuid);
    const toggle = el("button", {
      type: "button",
      class: "link",
      id: `servers-toggle-${host.uuid}`,
      "aria-expanded": open ? "true" : "false",
      "aria-controls": `servers-${host.uuid}`,
      text: `${host.servers} server${host.servers === 1 ? "" : "s"}`,
      onclick: () => {
        if (expanded.has(host.uuid)) expanded.delete(host.uuid);
        else expanded.add(host.uuid);
        refresh();
      },
    });
    return el("td", {}, toggle, counts ? el("br") : null, counts ? el("span", { class: "detail", text: counts }) : null);
  }

  function hostRow(host) {
    const a = host.actions;
    const scheduling = host.disabled
      ? `disabled: ${host.disabled_reason || "no reason given"}`
      : "enabled";
    return el(
      "tr",
      { "data-host": host.host, "data-state": host.state, "data-disabled": String(host.disabled) },
      el("th", { scope: "row" }, host.host, el("br"), el("span", { class: "detail", text: `zone ${host.zone || "none"}` })),
      el("td", {}, el("span", { class: `badge ${STATE_CLASS[host.state] || ""}`, text: host.state })),
      el("td", { class: host.disabled ? "disabled-host" : "", text: scheduling }),
      fencingCell(host),
      el("td", { text: `${host.version} (${host.release})` }),
      el("td", { text: ago(host.silent_for) }),
      serversCell(host),
      el(
        "td",
        { class: "actions" },
        a.enable
          ? actionButton(host, "enable", "Enable", true, enable)
          : actionButton(host, "disable", "Disable", a.disable, disable),
        a.force_up
          ? actionButton(host, "force-up", "Force up", true, forceUp)
          : actionButton(host, "force-down", "Force down", a.force_down, forceDown),
        actionButton(host, "evacuate", "Evacuate", a.evacuate, evacuate),
        actionButton(host, "drain", "Drain", a.drain, drain)
      )
    );
  }

  function serverRows(host, listed) {
    const rows = listed.servers.map((s) =>
      el(
        "li",
        { "data-server": s.id },
        `${s.name} (${s.id}): ${s.status}, power ${s.power_state}${s.task_state ? `, task ${s.task_state}` : ""}`
      )
    );
    if (listed.truncated) rows.push(el("li", { class: "muted", text: "… and more" }));
    if (!rows.length) rows.push(el("li", { class: "muted", text: "No servers." }));
    return el(
      "tr",
      { class: "servers", id: `servers-${host.uuid}` },
      el("td", { colspan: 8 }, el("ul", { "aria-label": `Servers on ${host.host}` }, ...rows))
    );
  }

  function renderHosts(data, servers) {
    const rows = [];
    for (const host of data.hosts) {
      rows.push(hostRow(host));
      if (servers.has(host.uuid)) rows.push(serverRows(host, servers.get(host.uuid)));
    }
    fill("hosts", rows, "No compute host has registered yet.", 8);
  }

  function deadlineText(move) {
    if (move.waiting_for) return `waits for ${move.waiting_for}`;
    if (move.deadline_in === null) return "none";
    if (move.deadline_in < 0) return `overdue by ${duration(-move.deadline_in)}: ${move.deadline}`;
    return `in ${duration(move.deadline_in)}: ${move.deadline}`;
  }

  function moveRow(move) {
    return el(
      "tr",
      { "data-move": move.id, "data-status": move.status },
      el("td", { text: move.type }),
      el("td", { text: `${move.server_name || "?"} (${shortId(move.server_id)})` }),
      el("td", { text: move.source || "" }),
      el("td", { text: move.dest || "(choosing)" }),
      el("td", { text: move.status }),
      el("td", { text: ago(move.age) }),
      el("td", { text: deadlineText(move) })
    );
  }

  function renderMoves(data) {
    fill("moves", data.moves.map(moveRow), "No move in flight.", 7);
  }

  function taskRows(task) {
    const c = task.counts;
    const finished = c.moved + c.failed + c.skipped;
    const bar = el("progress", {
      max: String(Math.max(task.total, 1)),
      value: String(finished),
      "aria-label": `host task ${task.number}: ${finished} of ${task.total} servers done`,
    });
    const deadline =
      task.status !== "running"
        ? "ended"
        : task.deadline_in < 0
          ? "passed"
          : `in ${duration(task.deadline_in)}`;
    const rows = [
      el(
        "tr",
        { "data-task": task.number, "data-status": task.status },
        el("th", { scope: "row", text: `${task.number}: ${task.kind}` }),
        el("td", { text: task.host }),
        el("td", {}, el("span", { class: `badge task-${task.status}`, text: task.status })),
        el("td", {}, bar, ` ${c.moved}/${task.total} moved`),
        el("td", { text: String(c.moving) }),
        el("td", { text: String(c.failed) }),
        el("td", { text: deadline }),
        el("td", { text: task.message || "" })
      ),
    ];
    if (task.items.length) {
      const servers = task.items.map((item) =>
        el(
          "li",
          { "data-server": item.server_id, "data-status": item.status },
          `${item.name || shortId(item.server_id)}: ${item.status}` +
            (item.dest ? ` → ${item.dest}` : "") +
            (item.message && item.status !== "moved" ? ` (${item.message})` : "")
        )
      );
      rows.push(
        el(
          "tr",
          { class: "servers" },
          el(
            "td",
            { colspan: 8 },
            el("ul", { "aria-label": `Servers of host task ${task.number}` }, ...servers)
          )
        )
      );
    }
    return rows;
  }

  function renderHostTasks(data) {
    fill("host-tasks", data.tasks.flatMap(taskRows), "No host task yet.", 8);
  }

  function renderVersions(data) {
    document.getElementById("waiting-for").textContent =
      `This keel-api runs release ${data.release} (${data.release_name}). Waiting for: ${data.waiting_for}`;
    const byBinary = new Map(data.binaries.map((b) => [b.binary, b]));
    const rows = data.pins.map((pin) => {
      const running = byBinary.get(pin.follows);
      const releases = running
        ? Object.entries(running.releases).map(([r, n]) => `${r} × ${n}`).join(", ") || "none"
        : "";
      return el(
        "tr",
        { class: pin.cap === pin.latest ? "" : "held-back" },
        el("th", { scope: "row", text: pin.api }),
        el("td", { text: pin.setting }),
        el("td", { text: pin.cap }),
        el("td", { text: pin.latest }),
        el("td", { text: pin.follows }),
        el("td", { text: releases })
      );
    });
    fill("pins", rows, "", 6);
  }

  function renderEvents(data) {
    document.getElementById("fenced-now").textContent =
      (data.fenced.length ? `Fenced now: ${data.fenced.join(", ")}.` : "No host is fenced now.") +
      ` Automatic evacuation: ${data.auto_evacuate}.`;
    const evacuations = data.evacuations.map((move) =>
      el(
        "tr",
        { "data-move": move.id, "data-status": move.status },
        el("td", { text: `${move.server_name || "?"} (${shortId(move.server_id)})` }),
        el("td", { text: move.source || "" }),
        el("td", { text: move.dest || "(choosing)" }),
        el("td", { text: move.status }),
        el("td", { text: move.asked_by || "" }),
        el("td", { text: ago(move.age) })
      )
    );
    fill("evacuations", evacuations, "No evacuation yet.", 6);
    const recoveries = data.recoveries.map((r) =>
      el(
        "tr",
        {},
        el("td", { text: r.host }),
        el("td", { text: ago(r.age) }),
        el("td", { text: String(r.evacuations) }),
        el("td", { text: String(r.skipped) })
      )
    );
    fill("recoveries", recoveries, "None yet.", 4);
  }

  // --- polling -----------------------------------------------------------------------

  function endSession() {
    sessionEnded = true;
    clearTimeout(timer);
    statusLine.replaceChildren(
      "Your session has ended. ",
      el("a", { href: "/ops/", text: "Sign in again" }),
      "."
    );
  }

  async function poll() {
    const [hosts, moves, tasks, versions, events] = await Promise.all([
      getJSON("/ops/api/hosts"),
      getJSON("/ops/api/moves"),
      getJSON("/ops/api/host-tasks"),
      getJSON("/ops/api/versions"),
      getJSON("/ops/api/events"),
    ]);
    const servers = new Map();
    for (const host of hosts.hosts) {
      if (expanded.has(host.uuid)) {
        servers.set(host.uuid, await getJSON(`/ops/api/hosts/${host.uuid}/servers`));
      }
    }
    keepingFocus(() => {
      renderHosts(hosts, servers);
      renderMoves(moves);
      renderHostTasks(tasks);
      renderVersions(versions);
      renderEvents(events);
    });
    updatedLine.textContent =
      `Updated at ${new Date().toLocaleTimeString()}: ${hosts.hosts.length} host(s), ` +
      `${moves.moves.length} move(s) in flight.`;
  }

  // One refresh at a time; one asked for meanwhile runs right after.
  async function refresh() {
    if (sessionEnded) return;
    if (refreshing) {
      refreshAgain = true;
      return;
    }
    refreshing = true;
    clearTimeout(timer);
    try {
      await poll();
      if (statusLine.textContent) statusLine.textContent = "";
    } catch (error) {
      if (error instanceof SessionEnded) {
        endSession();
        return;
      }
      statusLine.textContent = `Could not refresh (trying again): ${error.message}`;
    } finally {
      refreshing = false;
    }
    if (refreshAgain) {
      refreshAgain = false;
      refresh();
      return;
    }
    timer = setTimeout(refresh, POLL_MS);
  }

  refresh();
})();

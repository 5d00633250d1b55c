// Loom console: the slider, live updates by server-sent events, and confirmations.
// Everything from the log is inserted with textContent, never as markup.
"use strict";

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

function eventRow(e) {
  const tr = el("tr");
  tr.dataset.seq = String(e.sequence);
  tr.appendChild(el("td", String(e.sequence), "num"));
  tr.appendChild(el("td", e.time));
  tr.appendChild(el("td", String(e.fence), "num"));
  const type = el("td");
  type.appendChild(el("span", e.type, "etype etype-" + e.type));
  tr.appendChild(type);
  const detail = el("td");
  const details = el("details");
  details.appendChild(el("summary", e.summary));
  details.appendChild(el("pre", JSON.stringify(e.payload, null, 2), "json"));
  detail.appendChild(details);
  tr.appendChild(detail);
  return tr;
}

function setupSlider(head) {
  const form = document.querySelector("[data-slider]");
  if (!form) return null;
  const range = form.querySelector("input[type=range]");
  const label = form.querySelector("[data-slider-label]");
  const statePre = document.querySelector("[data-state]");
  const uiPre = document.querySelector("[data-ui]");
  const stateStatus = document.querySelector("[data-state-status]");
  const id = head.dataset.execution;
  let pending = 0;

  async function show(at) {
    const ticket = ++pending;
    label.textContent = "sequence " + at + " of " + range.max;
    const url = "/api/executions/" + encodeURIComponent(id) + "/state?at=" + at;
    const response = await fetch(url, { headers: { accept: "application/json" } });
    const body = await response.json();
    if (ticket !== pending) return; // a newer position was asked for meanwhile
    if (!response.ok) {
      label.textContent = body.error ? body.error.message : "error " + response.status;
      return;
    }
    statePre.textContent = JSON.stringify(body.state, null, 2);
    uiPre.textContent = JSON.stringify(body.state.ui, null, 2);
    stateStatus.textContent = body.state.status;
    label.textContent = "sequence " + at + " of " + range.max + ": " + body.event.type;
    document.querySelectorAll("[data-events] tr").forEach((tr) => {
      tr.classList.toggle("current", tr.dataset.seq === String(at));
    });
    history.replaceState(null, "", "?at=" + at);
  }

  range.addEventListener("input", () => show(range.value));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); show(range.value); });
  return range;
}

const TERMINAL = ["completed", "failed", "cancelled"];

function setupLive(head, range) {
  // A terminal execution never changes again: nothing to follow.
  if (!window.EventSource || TERMINAL.includes(head.dataset.statusValue)) return;
  const id = head.dataset.execution;
  const tbody = document.querySelector("[data-events]");
  const badge = head.querySelector("[data-status]");
  const live = head.querySelector("[data-live]");
  let last = Number(head.dataset.last);
  const source = new EventSource(
    "/api/executions/" + encodeURIComponent(id) + "/events?after=" + last
  );
  source.addEventListener("open", () => { live.hidden = false; });
  source.addEventListener("error", () => { live.hidden = true; });
  source.addEventListener("envelope", (msg) => {
    const data = JSON.parse(msg.data);
    const e = data.envelope;
    if (e.sequence <= last) return;
    last = e.sequence;
    head.dataset.last = String(last);
    tbody.appendChild(eventRow(e));
    badge.textContent = data.status;
    badge.className = "badge status-" + data.status;
    head.dataset.statusValue = data.status;
    if (TERMINAL.includes(data.status)) {
      source.close();
      live.hidden = true;
    }
    if (range) {
      const following = Number(range.value) === Number(range.max);
      range.max = String(last);
      if (following) range.value = String(last);
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("form[data-confirm]").forEach((form) => {
    form.addEventListener("submit", (ev) => {
      if (!window.confirm(form.dataset.confirm)) ev.preventDefault();
    });
  });
  const head = document.querySelector("[data-execution]");
  if (head) {
    const range = setupSlider(head);
    setupLive(head, range);
  }
});

// Live updates for the approval page: follows the server-sent events of the page's store or session and
// swaps in HTML the server rendered (and escaped). No inline script, no external code.
"use strict";

(function () {
  const body = document.body;
  const events = body.dataset.events;
  const state = document.getElementById("live-state");
  if (!events || !window.EventSource) {
    return;
  }

  function show(text, on) {
    state.textContent = text;
    state.className = "live-state " + (on ? "on" : "off");
  }

  function keyOf(node) {
    const owner = node.closest("[data-item],[data-request]");
    return (owner ? owner.dataset.item || owner.dataset.request : "") + "/" + (node.dataset.key || "");
  }

  function openKeys(root) {
    // which folded values are open, so a refresh does not close what the reader unfolded
    return new Set(Array.from(root.querySelectorAll("details[open]"), keyOf));
  }

  function reopen(root, keys) {
    root.querySelectorAll("details").forEach((node) => {
      if (keys.has(keyOf(node))) {
        node.open = true;
      }
    });
  }

  let busy = false;
  let again = false;
  async function refresh() {
    const fragment = body.dataset.fragment;
    const target = document.getElementById("live");
    if (!fragment || !target) {
      return;
    }
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    try {
      const response = await fetch(fragment, { credentials: "same-origin", cache: "no-store" });
      if (response.ok) {
        const keys = openKeys(target);
        target.innerHTML = await response.text();
        reopen(target, keys);
        body.dataset.refreshed = String(Number(body.dataset.refreshed || "0") + 1);
      }
    } finally {
      busy = false;
      if (again) {
        again = false;
        refresh();
      }
    }
  }

  function place(id, html) {
    const template = document.createElement("template");
    template.innerHTML = html;
    const node = template.content.firstElementChild;
    if (!node) {
      return;
    }
    const list = document.getElementById("items");
    const old = list.querySelector('[data-item="' + CSS.escape(id) + '"]');
    if (old) {
      const keys = openKeys(old);
      old.replaceWith(node);
      reopen(node, keys);
    } else {
      list.append(node);
    }
  }

  const from = body.dataset.from;
  const source = new EventSource(events + (from ? "?from=" + encodeURIComponent(from) : ""));
  source.onopen = () => show("live", true);
  source.onerror = () => show("reconnecting…", false);
  source.addEventListener("store", refresh);
  source.addEventListener("item", (event) => {
    const data = JSON.parse(event.data);
    place(data.id, data.html);
  });
  source.addEventListener("status", (event) => {
    const status = document.getElementById("status");
    if (status) {
      const value = JSON.parse(event.data).status;
      status.textContent = value;
      status.className = "badge badge-" + value;
    }
  });
  source.addEventListener("reset", () => {
    source.close();
    window.location.reload();
  });
})();

// The pages' script (the approval page, the unit server's page): keeps the page session's secret (sessionStorage: this origin, this tab), sends it
// as a header on every request, fetches the page the shell stands for, posts the forms, and follows the
// server-sent events of the page's store or session, swapping in HTML the server rendered (and escaped).
// No inline script, no external code, no cookie.
"use strict";

(function () {
  const body = document.body;
  const root = body.dataset.root || "";
  const key = "unit-mcp-page-session:" + root;
  if (body.dataset.session) {
    sessionStorage.setItem(key, body.dataset.session);
    delete body.dataset.session;
  }
  const address = new URL(window.location.href);
  if (address.searchParams.has("token")) {
    address.searchParams.delete("token"); // spent: out of the address bar and the history
    window.history.replaceState(null, "", address);
  }

  function call(url, init) {
    const headers = new Headers((init && init.headers) || {});
    headers.set("X-Page-Session", sessionStorage.getItem(key) || "");
    return fetch(url, Object.assign({}, init, { headers, credentials: "omit", cache: "no-store" }));
  }

  function message(text) {
    let note = document.getElementById("shell-message");
    if (!note) {
      note = document.createElement("p");
      note.id = "shell-message";
      note.className = "notice notice-error";
      note.setAttribute("role", "status");
      (document.querySelector("main") || body).prepend(note);
    }
    note.textContent = text;
    note.hidden = false;
  }

  async function refusal(response) {
    // what the server said: the shell's message, or its plain text
    const text = await response.text();
    if ((response.headers.get("content-type") || "").startsWith("text/html")) {
      const said = new DOMParser().parseFromString(text, "text/html").getElementById("shell-message");
      return said ? said.textContent : "HTTP " + response.status;
    }
    return text;
  }

  function show(text, on) {
    const state = document.getElementById("live-state");
    if (state) {
      state.textContent = text;
      state.className = "live-state " + (on ? "on" : "off");
    }
  }

  function render(html) {
    const page = new DOMParser().parseFromString(html, "text/html");
    document.title = page.title;
    Array.from(body.attributes).forEach((attribute) => body.removeAttribute(attribute.name));
    Array.from(page.body.attributes).forEach((attribute) => body.setAttribute(attribute.name, attribute.value));
    const nodes = Array.from(page.body.childNodes); // a copy: adopting a node takes it out of the live list
    body.replaceChildren(...nodes.map((node) => document.adoptNode(node)));
  }

  async function load(url, init, push) {
    let response;
    try {
      response = await call(url, init);
    } catch (error) {
      message("The page's server does not answer: " + error.message);
      return;
    }
    if (response.status !== 200) {
      message(await refusal(response));
      return;
    }
    render(await response.text());
    if (push) {
      window.history.pushState(null, "", response.url);
    } else if (response.url !== window.location.href) {
      window.history.replaceState(null, "", response.url);
    }
    follow();
  }

  function keyOf(node) {
    const owner = node.closest("[data-item],[data-request]");
    return (owner ? owner.dataset.item || owner.dataset.request : "") + "/" + (node.dataset.key || "");
  }

  function openKeys(part) {
    // which folded values are open, so a refresh does not close what the reader unfolded
    return new Set(Array.from(part.querySelectorAll("details[open]"), keyOf));
  }

  function reopen(part, keys) {
    part.querySelectorAll("details").forEach((node) => {
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
      const response = await call(fragment);
      if (response.ok) {
        // Put in only what changed: a part replaced by the same content would take a click that lands on it
        // meanwhile (its button gone from under the pointer). Both sides serialized by the browser compare.
        const fresh = document.createElement("template");
        fresh.innerHTML = await response.text();
        if (fresh.innerHTML !== target.innerHTML) {
          const keys = openKeys(target);
          target.replaceChildren(fresh.content);
          reopen(target, keys);
        }
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

  const handlers = {
    store: refresh,
    item: (data) => {
      const item = JSON.parse(data);
      place(item.id, item.html);
    },
    status: (data) => {
      const status = document.getElementById("status");
      if (status) {
        const value = JSON.parse(data).status;
        status.textContent = value;
        status.className = "badge badge-" + value;
      }
    },
    reset: () => {
      following.abort();
      load(window.location.href, {}, false);
    },
  };

  function dispatch(block, seen) {
    // one server-sent event: `id:`, `event:` and `data:` lines (comments and `retry:` are skipped)
    let event = "message";
    let data = "";
    block.split("\n").forEach((line) => {
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") {
        event = value;
      } else if (field === "data") {
        data = data ? data + "\n" + value : value;
      } else if (field === "id") {
        seen.id = value;
      }
    });
    if (data && handlers[event]) {
      handlers[event](data);
    }
  }

  let following = new AbortController();
  function follow() {
    // the event stream over fetch (an EventSource cannot send the header), reconnecting with Last-Event-ID
    following.abort();
    following = new AbortController();
    const signal = following.signal;
    const events = body.dataset.events;
    if (!events) {
      return;
    }
    const from = body.dataset.from;
    const seen = { id: null };
    (async () => {
      while (!signal.aborted) {
        try {
          const headers = seen.id ? { "Last-Event-ID": seen.id } : {};
          const url = events + (from ? "?from=" + encodeURIComponent(from) : "");
          const response = await call(url, { headers, signal });
          if (response.status === 401) {
            show("not live", false);
            message(await refusal(response));
            return;
          }
          if (response.ok && response.body) {
            show("live", true);
            const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
            let buffer = "";
            for (;;) {
              const { value, done } = await reader.read();
              if (done) {
                break;
              }
              buffer += value;
              let end;
              while ((end = buffer.indexOf("\n\n")) >= 0) {
                dispatch(buffer.slice(0, end), seen);
                buffer = buffer.slice(end + 2);
              }
            }
          }
        } catch (error) {
          if (signal.aborted) {
            return;
          }
        }
        show("reconnecting…", false);
        await new Promise((resolve) => setTimeout(resolve, 1000));
      }
    })();
  }

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!(form instanceof HTMLFormElement)) {
      return;
    }
    event.preventDefault(); // a form cannot send the header: send it from here
    const data = new URLSearchParams(new FormData(form));
    if (event.submitter && event.submitter.name) {
      data.append(event.submitter.name, event.submitter.value);
    }
    if (form.method === "get") {
      const url = new URL(form.action);
      url.search = data.toString();
      load(url.href, {}, true);
    } else {
      load(form.action, { method: "POST", body: data }, true);
    }
  });
  window.addEventListener("popstate", () => load(window.location.href, {}, false));

  if ("refused" in body.dataset) {
    return;
  }
  if (!sessionStorage.getItem(key)) {
    const note = document.getElementById("shell-message");
    if (note) {
      note.hidden = false;
    }
    return;
  }
  if ("shell" in body.dataset) {
    load(window.location.href, {}, false);
  } else {
    follow();
  }
})();

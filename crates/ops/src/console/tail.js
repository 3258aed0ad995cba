// The live tail of a job's page in ring0's console: polls the page's source (the job's
// `/tail`, same origin) and writes what it answers as text, never as markup, until the job
// finished, the server refused, or the poll budget is spent. Served by ring0 itself and allowed
// by the page's nonce; the page works without it (reload to refresh).
"use strict";
(() => {
  const POLL_MS = 1000;
  const POLLS_MAX = 3600;
  const tail = document.getElementById("tail");
  const state = document.getElementById("state");
  const exit = document.getElementById("exit");
  const live = document.getElementById("live");
  if (!tail || !tail.dataset.source) return;
  let polls = 0;
  const stop = (why) => {
    if (live) live.textContent = why;
  };
  async function poll() {
    polls += 1;
    let answer;
    try {
      const response = await fetch(tail.dataset.source, {
        headers: { accept: "application/json" },
        cache: "no-store",
        credentials: "same-origin",
      });
      if (response.redirected) return stop("not refreshed: signed out");
      if (!response.ok) return stop(`not refreshed: the server answered ${response.status}`);
      answer = await response.json();
    } catch (e) {
      answer = null;
    }
    if (answer) {
      tail.textContent = String(answer.tail ?? "");
      if (state) state.textContent = String(answer.state ?? "");
      if (exit) exit.textContent = String(answer.exit ?? "");
      if (answer.finished) return stop("finished");
    }
    if (polls >= POLLS_MAX) return stop("not refreshed any more: reload the page");
    setTimeout(poll, POLL_MS);
  }
  if (live) live.textContent = "live";
  setTimeout(poll, POLL_MS);
})();

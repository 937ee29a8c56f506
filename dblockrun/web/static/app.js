// dblockrun dashboard: keeps the live parts of the Fleet, Job and Run pages
// fresh. Each is an element with data-live="URL": every 2 s its content is
// replaced by the server's rendering of URL (rendered and escaped there),
// until the content holds an element marked data-final (a run that ended).
// Served as a file (the Content-Security-Policy allows no inline script).
"use strict";

const EVERY_MS = 2000;

function finished(live) {
  return live.querySelector("[data-final]") !== null;
}

function refresh(live) {
  fetch(live.dataset.live, { credentials: "same-origin" })
    .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
    .then((html) => { live.innerHTML = html; })
    .catch(() => {})
    .finally(() => {
      if (!finished(live)) setTimeout(() => refresh(live), EVERY_MS);
    });
}

document.addEventListener("DOMContentLoaded", () => {
  for (const live of document.querySelectorAll("[data-live]")) {
    if (!finished(live)) setTimeout(() => refresh(live), EVERY_MS);
  }
  // The timeline's bars: a click opens the run (one listener, not 10,000 links).
  const timeline = document.getElementById("timeline");
  if (timeline) {
    timeline.addEventListener("click", (event) => {
      const run = event.target.closest("[data-run]");
      if (run) window.location.assign(`/runs/${encodeURIComponent(run.dataset.run)}`);
    });
  }
});

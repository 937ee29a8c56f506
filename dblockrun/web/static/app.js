// dblockrun dashboard: keeps the Fleet page and a running run's output fresh.
// Served as a file (the Content-Security-Policy allows no inline script).
"use strict";

const EVERY_MS = 2000;

function refreshFleet(live) {
  fetch(live.dataset.live, { credentials: "same-origin" })
    .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
    .then((html) => { live.innerHTML = html; }) // rendered and escaped by the server
    .catch(() => {})
    .finally(() => setTimeout(() => refreshFleet(live), EVERY_MS));
}

function refreshRun(pre) {
  fetch(`/api/v1/runs/${pre.dataset.run}/output`, { credentials: "same-origin" })
    .then((r) => (r.ok ? r.json() : Promise.reject(r.status)))
    .then((doc) => {
      pre.textContent = doc.output; // text, never markup
      const result = document.getElementById("result");
      result.textContent = doc.run.result;
      result.className = `result r-${doc.run.result}`;
      document.getElementById("finished").textContent = doc.run.finished || "-";
      document.getElementById("duration").textContent =
        doc.run.duration === null ? "-" : String(doc.run.duration);
      document.getElementById("live").hidden = !doc.live;
      pre.dataset.running = doc.live ? "yes" : "no";
    })
    .catch(() => {})
    .finally(() => {
      if (pre.dataset.running === "yes") setTimeout(() => refreshRun(pre), EVERY_MS);
    });
}

document.addEventListener("DOMContentLoaded", () => {
  const live = document.getElementById("live");
  if (live) setTimeout(() => refreshFleet(live), EVERY_MS);
  const pre = document.getElementById("output");
  if (pre && pre.dataset.running === "yes") setTimeout(() => refreshRun(pre), EVERY_MS);
});

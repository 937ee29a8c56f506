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

// A chart or timeline wider than a phone scrolls in its frame (.figure):
// shown at its right end, now, and kept where the reader scrolled it to
// when the live part is replaced.
function fromRight(root) {
  const frame = root.querySelector(".figure");
  return frame ? frame.scrollWidth - frame.scrollLeft - frame.clientWidth : 0;
}

function toRight(root, right) {
  for (const frame of root.querySelectorAll(".figure")) {
    frame.scrollLeft = frame.scrollWidth - frame.clientWidth - right;
  }
}

function refresh(live) {
  fetch(live.dataset.live, { credentials: "same-origin" })
    .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
    .then((html) => {
      const right = fromRight(live);
      live.innerHTML = html;
      toRight(live, right);
    })
    .catch(() => {})
    .finally(() => {
      if (!finished(live)) setTimeout(() => refresh(live), EVERY_MS);
    });
}

document.addEventListener("DOMContentLoaded", () => {
  toRight(document, 0);
  for (const live of document.querySelectorAll("[data-live]")) {
    if (!finished(live)) setTimeout(() => refresh(live), EVERY_MS);
  }
  const timeline = document.getElementById("timeline");
  if (timeline) followPointer(timeline);
});

// The timeline: each run is a rectangle of one path per result (10,000
// elements would be slow to lay out); its data beside the SVG says where
// each bar is: [run id, x, width, y, what to say]. Hovering shows what it
// says, a click opens the run.
function followPointer(svg) {
  const runs = JSON.parse(document.getElementById("timeline-runs").textContent);
  const lane = Number(svg.dataset.lane);
  const tip = document.getElementById("tip");
  const under = (event) => {
    const m = svg.getScreenCTM();
    if (!m) return null;
    const p = new DOMPoint(event.clientX, event.clientY).matrixTransform(m.inverse());
    let found = null;
    for (const r of runs) { // the last drawn is on top
      if (p.y >= r[3] && p.y <= r[3] + lane && p.x >= r[1] - 1 && p.x <= r[1] + r[2] + 1) found = r;
    }
    return found;
  };
  svg.addEventListener("mousemove", (event) => {
    const r = under(event);
    svg.style.cursor = r ? "pointer" : "";
    if (!r) { tip.hidden = true; return; }
    tip.textContent = r[4]; // text, never markup
    tip.style.left = `${event.pageX + 12}px`;
    tip.style.top = `${event.pageY + 12}px`;
    tip.hidden = false;
  });
  svg.addEventListener("mouseleave", () => { tip.hidden = true; });
  svg.addEventListener("click", (event) => {
    const r = under(event);
    if (r) window.location.assign(`/runs/${encodeURIComponent(r[0])}`);
  });
}

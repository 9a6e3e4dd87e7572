// Run page: draw the charts, and while the run is active poll its status and swap in the
// fresh results when a measurement arrives or the run ends (no page reload); keep the
// runner's log tail fresh; answer "max throughput within a TTFT budget".
(function () {
  "use strict";
  const POLL_MS = 2000;
  const LOG_POLL_MS = 5000;
  const sb = window.servebench;

  function setup(live) {
    withPlotly(live, function () {
      sb.drawCharts(live);
      sb.wire(live);
      wireBudget(live);
    });
    wireReference(live);
  }

  // Choosing the reference reloads the page with ?reference= (the form's own submit), so
  // the choice lives in the URL a reader shares.
  function wireReference(live) {
    const form = live.querySelector("#reference-picker");
    if (!form) return;
    const apply = form.querySelector("#reference-apply");
    if (apply) apply.hidden = true;
    form.querySelector("select").addEventListener("change", function () { form.submit(); });
  }

  // The page loads the chart library only when it has a chart; a run that was queued when
  // the page opened loads it when its first results (and charts) arrive.
  function withPlotly(live, then) {
    const wants = live.querySelector("#figures-data, #telemetry-data");
    if (window.Plotly || !wants || !live.dataset.plotlySrc) { then(); return; }
    const script = document.createElement("script");
    script.src = live.dataset.plotlySrc;
    script.onload = function () {
      then();
      // telemetry.js wires its panel on a change under <body>: make one now Plotly is here.
      document.body.appendChild(document.createComment("charts ready"));
    };
    document.body.appendChild(script);
  }

  async function refresh() {
    const response = await fetch(window.location.href, { headers: { Accept: "text/html" } });
    if (!response.ok) return;
    const doc = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = doc.getElementById("live");
    const live = document.getElementById("live");
    if (fresh && live) {
      live.replaceWith(fresh);
      setup(fresh);
      watch(fresh);
    }
  }

  function watch(live) {
    if (live.dataset.final === "1") return;
    const url = live.dataset.statusUrl;
    let done = Number(live.dataset.done);
    const logTimer = live.dataset.logUrl ? setInterval(function () { pollLog(live); }, LOG_POLL_MS) : null;
    const timer = setInterval(async function () {
      let state;
      try {
        const r = await fetch(url, { headers: { Accept: "application/json" } });
        if (!r.ok) return;
        state = await r.json();
      } catch (e) {
        return; // the portal may be restarting; try again on the next tick
      }
      const badge = document.getElementById("run-status");
      badge.textContent = state.status_display;
      badge.className = "badge " + state.status;
      const queueNote = document.getElementById("queue-note");
      if (queueNote) {
        queueNote.hidden = !state.queue;
        queueNote.textContent = state.queue ? "Queued: " + state.queue.message + "." : "";
      }
      document.getElementById("run-done").textContent = state.done;
      document.getElementById("run-total").textContent = state.total;
      const pct = state.total ? Math.round((100 * state.done) / state.total) : 0;
      document.getElementById("run-progress").style.width = pct + "%";
      if (state.final || state.done !== done) {
        done = state.done;
        clearInterval(timer);
        if (logTimer) clearInterval(logTimer);
        refresh();
      }
    }, POLL_MS);
  }

  async function pollLog(live) {
    const pre = live.querySelector("#run-log");
    if (!pre) return;
    try {
      const r = await fetch(live.dataset.logUrl, { headers: { Accept: "text/plain" } });
      if (!r.ok) return;
      const text = await r.text();
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent = text || "(nothing logged yet)";
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    } catch (e) {
      // try again on the next tick
    }
  }

  // For each Pareto chart (each marker trace carries its points' load levels, "c=16", in
  // customdata), the most output tok/s whose p99 TTFT is within the budget typed in
  // #budget-ms; the server wrote the answer for the default budget the same way.
  function wireBudget(live) {
    const input = live.querySelector("#budget-ms");
    const out = live.querySelector("#budget-result");
    if (!input || !out) return;
    const update = function () {
      const budget = Number(input.value);
      if (!input.value || !(budget > 0)) { out.textContent = "type a budget"; return; }
      const parts = [];
      live.querySelectorAll("[data-figure-id$='-pareto']").forEach(function (el) {
        const sweep = el.dataset.figureId.replace(/-pareto$/, "");
        (el.data || []).forEach(function (trace) {
          if (!trace.customdata) return;
          let best = null;
          trace.x.forEach(function (lat, i) {
            if (lat !== null && lat <= budget && (best === null || trace.y[i] > trace.y[best])) best = i;
          });
          const who = trace.name + " " + sweep;
          if (best === null) parts.push(who + ": no point within budget");
          else parts.push(who + ": " + trace.y[best].toFixed(1) + " tok/s at " + trace.customdata[best] + " (" + Math.round(trace.x[best]) + " ms)");
        });
      });
      out.textContent = parts.join("; ") || "no throughput-latency chart";
    };
    input.addEventListener("input", update);
  }

  const live = document.getElementById("live");
  if (live) {
    setup(live);
    watch(live);
  }
  sb.wire(document.getElementById("reproduce") || document.createElement("div"));
})();

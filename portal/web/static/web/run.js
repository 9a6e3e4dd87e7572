// Run page: draw the charts, and while the run is active poll its status and swap in the
// fresh results when a measurement arrives or the run ends (no page reload).
(function () {
  "use strict";
  const POLL_MS = 2000;

  function drawCharts(root) {
    const data = root.querySelector("#figures-data");
    if (!data || !window.Plotly) return;
    const figures = JSON.parse(data.textContent);
    root.querySelectorAll("[data-figure]").forEach(function (el) {
      const fig = figures[Number(el.dataset.figure)].figure;
      window.Plotly.newPlot(el, fig.data, fig.layout, {
        responsive: true,
        displaylogo: false,
        toImageButtonOptions: { format: "png", filename: el.id, scale: 2 },
      });
    });
  }

  async function refresh() {
    const response = await fetch(window.location.href, { headers: { Accept: "text/html" } });
    if (!response.ok) return;
    const doc = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = doc.getElementById("live");
    const live = document.getElementById("live");
    if (fresh && live) {
      live.replaceWith(fresh);
      drawCharts(fresh);
      watch(fresh);
    }
  }

  function watch(live) {
    if (live.dataset.final === "1") return;
    const url = live.dataset.statusUrl;
    let done = Number(live.dataset.done);
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
      document.getElementById("run-done").textContent = state.done;
      document.getElementById("run-total").textContent = state.total;
      const pct = state.total ? Math.round((100 * state.done) / state.total) : 0;
      document.getElementById("run-progress").style.width = pct + "%";
      if (state.final || state.done !== done) {
        done = state.done;
        clearInterval(timer);
        refresh();
      }
    }, POLL_MS);
  }

  const live = document.getElementById("live");
  if (live) {
    drawCharts(live);
    watch(live);
  }
})();

// Run page: the time series of one point at a time (templates/web/_telemetry.html), the
// point chosen in #telemetry-point. The live page swaps its results in without a reload,
// so a new panel is wired whenever one appears.
(function () {
  "use strict";
  const CONFIG = {
    responsive: true,
    displaylogo: false,
    toImageButtonOptions: { format: "png", scale: 2 },
  };

  function wire(panel) {
    const data = panel.querySelector("#telemetry-data");
    const select = panel.querySelector("#telemetry-point");
    if (!data || !select || !window.Plotly || panel.dataset.wired === "1") return;
    panel.dataset.wired = "1";
    const points = {};
    JSON.parse(data.textContent).forEach(function (p) { points[p.id] = p; });
    const show = function () {
      const point = points[select.value];
      if (!point) return;
      panel.querySelector("#telemetry-note").textContent = point.note;
      ["server", "gpu"].forEach(function (kind) {
        const el = panel.querySelector("#telemetry-" + kind);
        const figure = point[kind];
        if (!figure) {
          if (el.data) window.Plotly.purge(el);
          el.hidden = true;
          return;
        }
        el.hidden = false;
        const prefix = document.body.dataset.exportPrefix || "servebench";
        const config = Object.assign({}, CONFIG, {
          toImageButtonOptions: Object.assign({}, CONFIG.toImageButtonOptions, {
            filename: prefix + "-" + point.id + "-" + kind,
          }),
        });
        window.Plotly.react(el, figure.data, figure.layout, config);
      });
    };
    select.addEventListener("change", show);
    show();
  }

  function scan() {
    const panel = document.getElementById("telemetry-panel");
    if (panel) wire(panel);
  }

  new MutationObserver(scan).observe(document.body, { childList: true, subtree: true });
  scan();
})();

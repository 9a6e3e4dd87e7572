// servebench pages: draw plotly figures embedded as JSON, sortable tables, copy buttons.
// No framework, no CDN: plotly.js (its basic bundle) is served from our own static files.
(function () {
  "use strict";

  // The toolbar keeps what a reader of these charts uses: PNG export (with the chart's
  // title drawn in), zoom, pan and reset; it sits in the chart's top margin, above the
  // plot, while the title is the page's own HTML above the chart.
  const PLOT_CONFIG = {
    responsive: true,
    displaylogo: false,
    modeBarButtonsToRemove: [
      "toImage", "select2d", "lasso2d", "autoScale2d", "zoomIn2d", "zoomOut2d",
      "hoverClosestCartesian", "hoverCompareCartesian", "toggleSpikelines",
    ],
  };
  const EXPORT_SCALE = 2;

  function exportName(el) {
    return (document.body.dataset.exportPrefix || "servebench") + "-" + el.dataset.figureId;
  }

  // PNG export runs in the browser (no network), from the figure as drawn plus its title.
  function exportButton(el, title) {
    return {
      name: "Download PNG",
      title: "Download plot as PNG",
      icon: window.Plotly.Icons.camera,
      click: function (gd) {
        const layout = Object.assign({}, gd.layout, {
          title: title,
          margin: Object.assign({}, gd.layout.margin, { t: 84 }),
        });
        const size = gd.getBoundingClientRect();
        window.Plotly.downloadImage({ data: gd.data, layout: layout }, {
          format: "png",
          scale: EXPORT_SCALE,
          width: Math.max(640, Math.round(size.width)),
          height: Math.max(420, Math.round(size.height)) + 50,
          filename: exportName(el),
        });
      },
    };
  }

  // Draw every [data-figure-id] element inside root from the #figures-data JSON list.
  function drawCharts(root) {
    const data = (root || document).querySelector("#figures-data");
    if (!data || !window.Plotly) return [];
    const figures = {};
    JSON.parse(data.textContent).forEach(function (f) { figures[f.id] = f.figure; });
    const drawn = [];
    (root || document).querySelectorAll("[data-figure-id]").forEach(function (el) {
      const fig = figures[el.dataset.figureId];
      if (!fig) return;
      const layout = Object.assign({}, fig.layout);
      const title = layout.title;
      delete layout.title; // shown as HTML above the chart; drawn into PNG exports
      const config = Object.assign({}, PLOT_CONFIG, {
        modeBarButtonsToAdd: [exportButton(el, title)],
      });
      window.Plotly.newPlot(el, fig.data, layout, config);
      drawn.push(el);
    });
    return drawn;
  }

  // Tables with class "sortable": click a header to sort by it (again to reverse).
  // Cells may carry data-sort (a number, or text); empty values sort last.
  function makeSortable(table) {
    const heads = table.querySelectorAll("thead th");
    heads.forEach(function (th, index) {
      if (!th.dataset.sort) return;
      th.classList.add("sort");
      th.tabIndex = 0;
      th.setAttribute("role", "button");
      const sort = function () {
        const numeric = th.dataset.sort === "num";
        const dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
        const body = table.tBodies[0];
        const rows = Array.from(body.rows);
        const key = function (row) {
          const cell = row.cells[index];
          const raw = cell ? (cell.dataset.sort !== undefined ? cell.dataset.sort : cell.textContent.trim()) : "";
          if (!numeric) return raw.toLowerCase();
          return raw === "" ? null : Number(raw);
        };
        rows.sort(function (a, b) {
          const ka = key(a), kb = key(b);
          if (ka === null || ka === "") return 1;
          if (kb === null || kb === "") return -1;
          return ka < kb ? -dir : ka > kb ? dir : 0;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      };
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); } });
    });
  }

  // Buttons with data-copy="<element id>": copy that element's text. navigator.clipboard
  // needs a secure context; elsewhere fall back to a selected textarea + execCommand, and
  // failing that select the text so the reader can press Ctrl+C.
  function fallbackCopy(text) {
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    let ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    return ok;
  }

  function selectText(el) {
    const range = document.createRange();
    range.selectNodeContents(el);
    const sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
  }

  function copyFrom(button) {
    const target = document.getElementById(button.dataset.copy);
    if (!target) return;
    const text = target.textContent;
    const done = function (ok) {
      button.textContent = ok ? "Copied" : "Press Ctrl+C";
      if (!ok) selectText(target);
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { done(true); }, function () { done(fallbackCopy(text)); });
    } else {
      done(fallbackCopy(text));
    }
  }

  function wire(root) {
    (root || document).querySelectorAll("table.sortable").forEach(makeSortable);
    (root || document).querySelectorAll("button[data-copy]").forEach(function (b) {
      b.addEventListener("click", function () { copyFrom(b); });
    });
  }

  window.servebench = { drawCharts: drawCharts, wire: wire };
  document.addEventListener("DOMContentLoaded", function () {
    if (!document.getElementById("live")) {
      drawCharts(document);
      wire(document);
    }
  });
})();

// History page: a click on a marker opens that run (its URL is the point's customdata).
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    const el = document.getElementById("chart-history");
    if (!el || !el.on) return;
    el.on("plotly_click", function (event) {
      const point = event.points && event.points[0];
      if (point && typeof point.customdata === "string" && point.customdata.startsWith("/runs/")) {
        window.location.href = point.customdata;
      }
    });
  });
})();

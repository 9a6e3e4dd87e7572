// Compare page: filter the metric table by metric.
(function () {
  "use strict";
  const select = document.getElementById("metric-filter");
  const table = document.getElementById("compare-table");
  if (!select || !table) return;
  select.addEventListener("change", function () {
    table.querySelectorAll("tbody tr").forEach(function (row) {
      row.hidden = Boolean(select.value) && row.dataset.metric !== select.value;
    });
  });
})();

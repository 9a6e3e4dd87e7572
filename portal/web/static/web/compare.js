// Compare page: filter the metric table by metric, and to the changes the verdict engine
// calls worse or better (the coloured cells).
(function () {
  "use strict";
  const select = document.getElementById("metric-filter");
  const changed = document.getElementById("changed-only");
  const table = document.getElementById("compare-table");
  if (!select || !table) return;
  function apply() {
    table.querySelectorAll("tbody tr").forEach(function (row) {
      const metricHidden = Boolean(select.value) && row.dataset.metric !== select.value;
      const unchanged = Boolean(changed && changed.checked) && !row.querySelector("td.worse, td.better");
      row.hidden = metricHidden || unchanged;
    });
  }
  select.addEventListener("change", apply);
  if (changed) changed.addEventListener("change", apply);
})();

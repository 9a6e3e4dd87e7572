// Compare page: a new reference run from the selector opens at once (the button stays for
// keyboards and for pages without script); filter the metric table by metric, and to
// the changes the verdict engine calls worse or better (the coloured cells). A point's
// heading row hides with its last visible metric.
(function () {
  "use strict";
  const picker = document.getElementById("reference-select");
  if (picker && picker.form) {
    picker.addEventListener("change", function () { picker.form.submit(); });
  }
  const select = document.getElementById("metric-filter");
  const changed = document.getElementById("changed-only");
  const table = document.getElementById("compare-table");
  if (!select || !table) return;
  function apply() {
    table.querySelectorAll("tbody").forEach(function (group) {
      let shown = 0;
      group.querySelectorAll("tr[data-metric]").forEach(function (row) {
        const metricHidden = Boolean(select.value) && row.dataset.metric !== select.value;
        const unchanged = Boolean(changed && changed.checked) && !row.querySelector("td.worse, td.better");
        row.hidden = metricHidden || unchanged;
        if (!row.hidden) shown += 1;
      });
      group.hidden = shown === 0;
    });
  }
  select.addEventListener("change", apply);
  if (changed) changed.addEventListener("change", apply);
})();

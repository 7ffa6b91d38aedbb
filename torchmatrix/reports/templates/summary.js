"use strict";
const selects = Array.from(document.querySelectorAll("#filters select"));
const rows = Array.from(document.querySelectorAll("tr.cell-row"));
function applyFilters() {
  let shown = 0;
  for (const row of rows) {
    const values = row.dataset.values.split(" ");
    const keep = selects.every((s) => s.value === "" || values[Number(s.dataset.axis)] === s.value);
    row.hidden = !keep;
    if (keep) shown += 1;
  }
  document.getElementById("shown").textContent = shown + " of " + rows.length + " cells shown";
}
for (const select of selects) select.addEventListener("change", applyFilters);
function openTarget() {
  const target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
  if (target && target.tagName === "DETAILS") target.open = true;
}
window.addEventListener("hashchange", openTarget);
openTarget();
applyFilters();

// New-run form: choosing a preset loads its YAML into the spec box (the server does the same
// when the box is empty, so the form works without JavaScript too).
(function () {
  const presets = JSON.parse(document.getElementById("preset-specs").textContent);
  const select = document.getElementById("id_preset");
  const text = document.getElementById("id_spec_text");
  if (!select || !text) return;
  select.addEventListener("change", function () {
    if (select.value && presets[select.value]) {
      text.value = presets[select.value];
    }
  });
})();

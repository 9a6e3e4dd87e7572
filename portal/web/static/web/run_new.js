// The new-run form (web/run_new.html; rules in portal/web/forms.py). The spec text is what
// runs; the fields show it and edit it. Every edit posts the whole form to the check URL,
// which runs the same form as a submit and answers the spec text (rewritten when a field
// changed it), the fields read back from it, the preset it equals, every error and warning.
// Without this script the submit does the same, so the form works without JavaScript.
(function () {
  "use strict";

  const form = document.getElementById("run-form");
  if (!form || !window.fetch || !window.FormData) return;
  const url = form.dataset.checkUrl;
  const text = form.querySelector("#id_spec_text");
  const preset = form.querySelector("#id_preset");
  const synced = form.querySelector("#id_synced");
  const status = document.getElementById("check-status");
  const presetData = document.getElementById("preset-specs");
  const presetTexts = presetData ? JSON.parse(presetData.textContent) : {};
  const FIELDS = ["name", "model_id", "input_len", "output_len", "num_prompts", "concurrency",
                  "backends", "gpu_count"];
  let timer = null;
  let sent = 0;      // checks sent
  let shown = 0;     // the newest check whose answer is on the page
  let edited = 0;    // edits since the page load

  function schedule(delay) {
    edited += 1;
    window.clearTimeout(timer);
    timer = window.setTimeout(check, delay);
  }

  function check() {
    const mine = ++sent;
    const seenEdits = edited;
    status.textContent = "checking…";
    fetch(url, {
      method: "POST",
      body: new FormData(form),
      credentials: "same-origin",
      headers: { "X-Requested-With": "fetch" },
    }).then(function (response) {
      const type = response.headers.get("Content-Type") || "";
      if (!response.ok || type.indexOf("json") < 0) throw new Error("HTTP " + response.status);
      return response.json();
    }).then(function (state) {
      if (mine < shown) return;  // an older answer than the one on the page
      shown = mine;
      // Typing went on while this was checked: keep what the user typed, check again.
      show(state, seenEdits === edited);
      if (seenEdits !== edited) return;
      status.textContent = state.valid ? "ready to submit" : "";
    }).catch(function () {
      status.textContent = "could not check (the submit checks again)";
    });
  }

  function setField(name, value) {
    const inputs = form.querySelectorAll("[name=" + name + "]");
    inputs.forEach(function (input) {
      if (input === document.activeElement) return;  // never move the caret under a typist
      if (input.type === "checkbox") {
        input.checked = Array.isArray(value) && value.indexOf(input.value) >= 0;
      } else if (input.value !== value) {
        input.value = value;
      }
    });
  }

  function list(id, items) {
    const ul = document.getElementById(id);
    if (!ul) return;
    ul.replaceChildren();
    items.forEach(function (text) {
      const li = document.createElement("li");
      li.textContent = text;
      ul.appendChild(li);
    });
    ul.hidden = items.length === 0;
  }

  function summary(id, items) {
    const box = document.getElementById(id);
    const ul = document.getElementById(id + "-list");
    ul.replaceChildren();
    items.forEach(function (item) {
      const li = document.createElement("li");
      const a = document.createElement("a");
      a.href = "#id_" + item.field;
      const path = document.createElement("span");
      path.className = "mono";
      path.textContent = item.path;
      a.appendChild(path);
      li.appendChild(a);
      li.appendChild(document.createTextNode(": " + item.message));
      ul.appendChild(li);
    });
    box.hidden = items.length === 0;
  }

  function show(state, settled) {
    if (settled) {
      if (text.value !== state.spec_text && text !== document.activeElement) {
        text.value = state.spec_text;
      }
      FIELDS.forEach(function (name) { setField(name, state.fields[name]); });
      if (preset.value !== state.preset) preset.value = state.preset;
      synced.value = state.synced;
    }
    const byField = {};
    const warnByField = {};
    state.errors.forEach(function (e) {
      (byField[e.field] = byField[e.field] || []).push(e.path === "spec" ? e.message : e.path + ": " + e.message);
    });
    state.warnings.forEach(function (w) {
      (warnByField[w.field] = warnByField[w.field] || []).push(w.path + ": " + w.message);
    });
    form.querySelectorAll("[data-field]").forEach(function (box) {
      const name = box.dataset.field;
      box.classList.toggle("has-error", !!byField[name]);
      box.classList.toggle("has-warning", !!warnByField[name]);
      list(name + "-errors", byField[name] || []);
      list(name + "-warnings", warnByField[name] || []);
    });
    const title = document.getElementById("spec-problems-title");
    const n = state.errors.length;
    title.textContent = n ? "The spec has " + n + " problem" + (n === 1 ? "" : "s") + ":" : "";
    summary("spec-problems", state.errors);
    summary("spec-warnings", state.warnings);
  }

  text.addEventListener("input", function () { schedule(400); });
  preset.addEventListener("change", function () {
    // The whole spec becomes the preset's at once (nothing of the previous one stays);
    // the check then reads the fields back from it. "Custom" keeps the spec as it is.
    if (presetTexts[preset.value]) text.value = presetTexts[preset.value];
    schedule(0);
  });
  FIELDS.forEach(function (name) {
    form.querySelectorAll("[name=" + name + "]").forEach(function (input) {
      input.addEventListener("input", function () { schedule(350); });
      input.addEventListener("change", function () { schedule(0); });
    });
  });
  // What this portal can run, checked once on arrival (a preset it has no GPU for...).
  check();
})();

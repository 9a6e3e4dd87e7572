"""The submission form: the spec text is the truth, the fields are a view of it.

- **The spec text runs.** The common fields (name, model, lengths, prompts, the
  concurrency sweep, backends, GPUs) show what the spec says and edit it: a field the
  user changed is written into the spec (``write_field``); a field they did not change
  never overrides it. "Changed" is judged against ``synced``, a hidden input holding the
  field values the page last derived from the spec text (and a digest of that text), so
  the rule holds without JavaScript, with it, and for a submit that races a sync.
- **Presets fill both.** Choosing a preset (with the spec text untouched since the page
  showed it) replaces the whole spec, so nothing of the previous one, such as the seed's
  prompt- and output-length sweeps, survives; "Custom" keeps the spec text as it is.
- **Live.** ``static/web/run_new.js`` posts the form to ``/runs/new/check`` on every edit;
  that view runs this same form and answers ``state()``: the spec text (rewritten when a
  field changed it), the fields (read back from it), the preset it equals, and every
  error and warning. Without JavaScript the submit does the same and re-renders.
- **Every problem at once, at its field**, named by its spec path as the API names it
  (``spec.workload.input_len``); what has no field of its own goes under the spec text.
  The spec text is read as the API reads a spec (``runners.spec.safe_yaml``, then
  ``json_problem``): what JSON would read otherwise (YAML 1.1 scalars, a key given twice)
  and what cannot be stored (a lone surrogate, NUL, a key with control characters, deep
  nesting) stop there, at the field the path names. ``synced`` is the page's own and
  read as JSON; one that is hostile (nested too deep...) is an error at it. Every message
  is made encodable (``renderable``) before the page shows it.
  The runner's spec model validates; this portal's rules (``policy.check_image``,
  ``policy.check``) and what its executor can give (``preflight``: refusals and warnings)
  follow.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

import yaml
from django import forms

from portal.benchmarks import policy, preflight, presets
from runners import spec as rs

_WHOLE = re.compile(r"\A[0-9]{1,9}\Z")

# Every backend kind a spec may list (``runners.spec.BACKEND_KINDS``), so the boxes show
# what any spec or preset holds. Ticking one adds it with its defaults; an endpoint needs
# its URL in the spec text, and the check says so at once.
BACKEND_CHOICES = [
    ("hf-sequential", "HF Transformers, sequential (one request at a time)"),
    ("hf-static-cache", "HF Transformers, static cache + torch.compile"),
    ("hf-batched", "HF Transformers, static batches"),
    ("transformers-serve", "transformers serve (continuous batching)"),
    ("vllm", "vLLM server (continuous batching, PagedAttention)"),
    ("endpoint", "A deployed OpenAI-compatible endpoint (set its url in the spec)"),
]
assert {kind for kind, _ in BACKEND_CHOICES} == set(rs.BACKEND_KINDS)
_MANAGED_KINDS = {kind for kind, _ in BACKEND_CHOICES}

# The fields that mirror the spec, and the spec path each one shows.
FIELD_PATHS: dict[str, str] = {
    "name": "name",
    "model_id": "model.id",
    "input_len": "workload.input_len",
    "output_len": "workload.output_len",
    "num_prompts": "workload.num_prompts",
    "concurrency": "sweeps.max_concurrency",
    "backends": "backends",
    "gpu_count": "resources.gpu_count",
}
_INTS = {
    "input_len": ("workload", "input_len"),
    "output_len": ("workload", "output_len"),
    "num_prompts": ("workload", "num_prompts"),
    "gpu_count": ("resources", "gpu_count"),
}
# Spec error paths shown at a field (besides the concurrency sweep's, found per spec).
_FIELD_FOR_PATH = {
    "name": "name",
    "model.id": "model_id",
    "model.tokenizer": "model_id",
    "workload.input_len": "input_len",
    "workload.output_len": "output_len",
    "workload.num_prompts": "num_prompts",
    "backends": "backends",
    "resources.gpu_count": "gpu_count",
}

FieldValue = str | list[str]


def preset_choices() -> list[tuple[str, str]]:
    return [("", "Custom (the spec below)")] + [
        (key, str(value["title"])) for key, value in presets.available().items()
    ]


def preset_yaml(name: str) -> str:
    return rs.dump_spec(presets.build(name))


def _digest(text: str) -> str:
    """What ``synced`` remembers of the spec text (browsers send textareas with CRLF)."""
    return hashlib.sha256(text.replace("\r\n", "\n").strip().encode()).hexdigest()[:24]


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _concurrency_sweep(data: dict[str, Any]) -> int | None:
    sweeps = data.get("sweeps")
    if not isinstance(sweeps, list):
        return None
    for i, sweep in enumerate(sweeps):
        if isinstance(sweep, dict) and sweep.get("axis") == "max_concurrency":
            return i
    return None


def field_values(data: dict[str, Any]) -> dict[str, FieldValue]:
    """What each field shows for a spec mapping: the values that will run (defaults
    included) when the spec validates, else what the mapping says."""
    try:
        shown: dict[str, Any] = rs.parse_spec(data).model_dump(mode="json", exclude_none=True)
    except rs.SpecError:
        shown = data
    model, workload = _mapping(shown.get("model")), _mapping(shown.get("workload"))
    resources = _mapping(shown.get("resources"))
    index = _concurrency_sweep(shown)
    values = shown["sweeps"][index].get("values") if index is not None else None
    backends = shown.get("backends") if isinstance(shown.get("backends"), list) else []
    kinds = {str(b.get("kind")) for b in backends if isinstance(b, dict)}
    name = shown.get("name")
    return {
        "name": name if isinstance(name, str) else "",
        "model_id": model.get("id") if isinstance(model.get("id"), str) else "",
        "input_len": _number(workload.get("input_len")),
        "output_len": _number(workload.get("output_len")),
        "num_prompts": _number(workload.get("num_prompts")),
        "concurrency": ", ".join(_number(v) for v in values) if isinstance(values, list) else "",
        "backends": sorted(kinds & _MANAGED_KINDS),
        "gpu_count": _number(resources.get("gpu_count")),
    }


def write_field(data: dict[str, Any], field: str, value: Any) -> None:
    """Write one field's value into a spec mapping, in place. ``None`` (an emptied field)
    removes the key, so the spec's default applies; keys keep their order."""
    if field == "name":
        if value:
            data["name"] = value
        else:
            data.pop("name", None)
    elif field == "model_id":
        model = _mapping(data.get("model"))
        if value:
            model["id"] = value
        else:
            model.pop("id", None)
        data["model"] = model
    elif field in _INTS:
        section, key = _INTS[field]
        part = _mapping(data.get(section))
        if value is None:
            part.pop(key, None)
        else:
            part[key] = value
        data[section] = part
    elif field == "concurrency":
        sweeps = list(data["sweeps"]) if isinstance(data.get("sweeps"), list) else []
        index = _concurrency_sweep(data)
        if value is None:
            if index is not None:
                del sweeps[index]
        elif index is not None:
            sweeps[index] = {**sweeps[index], "values": value}
        else:
            sweeps.insert(0, {"name": "concurrency", "axis": "max_concurrency", "values": value})
        data["sweeps"] = sweeps
    elif field == "backends":
        existing = data.get("backends") if isinstance(data.get("backends"), list) else []
        kept = [
            b
            for b in existing
            if not isinstance(b, dict)
            or b.get("kind") in value
            or b.get("kind") not in _MANAGED_KINDS
        ]
        have = {b.get("kind") for b in kept if isinstance(b, dict)}
        data["backends"] = kept + [{"kind": kind} for kind in value if kind not in have]
    else:
        raise KeyError(field)


class RunForm(forms.Form):
    preset = forms.ChoiceField(required=False, choices=preset_choices)
    spec_text = forms.CharField(
        required=False,
        label="Spec (YAML or JSON)",
        widget=forms.Textarea(attrs={"rows": 24, "spellcheck": "false"}),
        max_length=200_000,
    )
    synced = forms.CharField(required=False, widget=forms.HiddenInput, max_length=20_000)
    name = forms.CharField(required=False, max_length=200)
    model_id = forms.CharField(
        required=False, max_length=256, label="Model", help_text="hub id or local directory"
    )
    input_len = forms.IntegerField(required=False, label="Prompt tokens")
    output_len = forms.IntegerField(required=False, label="Output tokens")
    num_prompts = forms.IntegerField(required=False, label="Prompts per point")
    concurrency = forms.CharField(
        required=False, max_length=200, label="Concurrency sweep", help_text="e.g. 1, 4, 16, 64"
    )
    gpu_count = forms.IntegerField(required=False, label="GPUs (0: the CPU)")
    backends = forms.MultipleChoiceField(
        required=False, choices=BACKEND_CHOICES, widget=forms.CheckboxSelectMultiple
    )
    is_public = forms.BooleanField(required=False, label="Public (readable without sign-in)")

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        self.spec: rs.Spec | None = None
        self.mapping: dict[str, Any] | None = None  # the spec as it will be validated
        self.text: str | None = None  # the spec text to show (rewritten if a field changed)
        self.matched_preset = ""
        self.problems: list[dict[str, str]] = []  # every error: field, path, message
        self.warnings: list[dict[str, str]] = []
        self._conc_index: int | None = None
        self._added: set[tuple[str, str]] = set()  # (field, text) of the errors above
        self._unwritten: set[str] = set()  # edited fields whose value could not be read
        choices = policy.form_choices()
        self.gpu_types: list[str] = choices["gpu_types"]
        self.node_selector_keys: list[str] = choices["node_selector_keys"]

    # ------------------------------------------------------------------ reading the post

    def _synced(self) -> dict[str, Any] | None:
        raw = (self.data.get("synced") or "").strip()
        if not raw:
            return None
        try:
            value = json.loads(raw)
        except RecursionError:
            self._problem("synced", "synced", "The page's state is nested too deeply; reload it.")
            return None
        except ValueError:
            return None
        problem = rs.json_problem(value)
        if problem is not None:
            where = f"synced.{problem[0]}" if problem[0] else "synced"
            self._problem("synced", where, f"{problem[1]}; reload the page.")
            return None
        if not isinstance(value, dict) or not isinstance(value.get("fields"), dict):
            return None
        return value

    def _posted(self, field: str) -> FieldValue:
        if field == "backends":
            return sorted(self.data.getlist("backends")) if hasattr(self.data, "getlist") else []
        return str(self.data.get(field) or "").strip()

    def _edited(self, synced: dict[str, Any] | None) -> list[str]:
        """The fields the user changed since the page last showed the spec's values (all
        filled-in ones when the post carries no ``synced``: a client without the page)."""
        if synced is None:
            return [f for f in FIELD_PATHS if self._posted(f)]
        before = synced["fields"]
        return [
            f
            for f in FIELD_PATHS
            if self._posted(f) != before.get(f, "" if f != "backends" else [])
        ]

    def _parse_text(self, text: str) -> dict[str, Any] | None:
        try:
            data = rs.safe_yaml(text)
        except rs.YAMLFieldError as exc:
            self._spec_problem({"field": exc.field, "message": exc.message})
            return None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            self._problem("spec_text", "spec", f"This is not valid YAML or JSON{where}.")
            return None
        if not isinstance(data, dict):
            self._problem(
                "spec_text", "spec", "A spec is a mapping (model:, workload:, sweeps: ...)."
            )
            return None
        problem = rs.json_problem(data)
        if problem is not None:  # nothing else reads it: it could not be stored or shown
            self._spec_problem({"field": problem[0], "message": problem[1]})
            return None
        return data

    def _base(self, synced: dict[str, Any] | None) -> tuple[dict[str, Any], bool] | None:
        """The spec the fields are applied to, and whether it came from the spec text."""
        text = (self.cleaned_data.get("spec_text") or "").strip()
        chosen = self.cleaned_data.get("preset") or ""
        switched = (
            synced is not None
            and chosen
            and chosen != synced.get("preset", "")
            and (not text or _digest(text) == synced.get("text"))
        )
        if chosen and (switched or not text):
            return rs.safe_yaml(preset_yaml(chosen)), False
        if not text:
            self._problem("spec_text", "spec", "Paste a spec, or choose a preset.")
            return None
        data = self._parse_text(text)
        return (data, True) if data is not None else None

    def _field_value(self, field: str) -> tuple[bool, Any]:
        """(ok, the value to write) for an edited field; a value that cannot be read is
        reported at its field and not written."""
        if field in self._errors:
            return False, None
        if field == "concurrency":
            raw = self.cleaned_data.get("concurrency") or ""
            values = []
            for part in raw.replace(";", ",").replace(" ", ",").split(","):
                if not part:
                    continue
                if not _WHOLE.match(part) or int(part) < 1:
                    self._problem(
                        "concurrency",
                        "spec.sweeps",
                        f"{part!r} is not a positive whole number; use e.g. 1, 4, 16",
                    )
                    return False, None
                values.append(int(part))
            return True, values or None
        if field == "backends":
            return True, list(self.cleaned_data.get("backends") or [])
        if field in ("name", "model_id"):
            return True, (self.cleaned_data.get(field) or "").strip() or None
        return True, self.cleaned_data.get(field)

    # ------------------------------------------------------------------ validation

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        synced = self._synced()
        base = self._base(synced)
        if base is None:
            return cleaned
        original, from_text = base
        data = copy.deepcopy(original)
        for field in self._edited(synced):
            ok, value = self._field_value(field)
            if ok:
                write_field(data, field, value)
            else:
                self._unwritten.add(field)
        self.mapping = data
        text = (cleaned.get("spec_text") or "").strip()
        # The text as typed while no field changed what it says (comments, JSON and all).
        keep = from_text and data == original
        self.text = text if keep else yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        self._conc_index = _concurrency_sweep(data)
        try:
            spec = rs.parse_spec(data)
        except rs.SpecError as exc:
            for err in exc.errors:
                self._spec_problem(err)
            return cleaned
        self.matched_preset = _preset_of(spec)
        # The runner image, the deployment's rules, then what its executor can give: at
        # their fields too, every one at once, before anything is queued.
        for rule in (policy.check_image, lambda s: policy.check(s, self.user)):
            try:
                rule(spec)
            except rs.SpecError as exc:
                for err in exc.errors:
                    self._spec_problem(err)
        for finding in preflight.findings(spec):
            if finding.blocking:
                self._spec_problem(finding.as_error())
            else:
                field = self._field_for(finding.field)
                self.warnings.append(
                    {"field": field, "path": f"spec.{finding.field}", "message": finding.message}
                )
        if not self.problems and not self._errors:
            self.spec = spec
        return cleaned

    def _problem(self, field: str, path: str, message: str) -> None:
        path, message = rs.renderable(path), rs.renderable(message)
        self.problems.append({"field": field, "path": path, "message": message})
        text = f"{path}: {message}" if path != "spec" else message
        self._added.add((field, text))
        self.add_error(field, text)

    def _field_for(self, path: str) -> str:
        if path in _FIELD_FOR_PATH:
            return _FIELD_FOR_PATH[path]
        i = self._conc_index
        if i is not None and (path == f"sweeps.{i}" or path.startswith(f"sweeps.{i}.values")):
            return "concurrency"
        return "spec_text"

    def _spec_problem(self, err: dict[str, str]) -> None:
        path = err.get("field") or ""
        self._problem(self._field_for(path), f"spec.{path}" if path else "spec", err["message"])

    # ------------------------------------------------------------------ what the page shows

    def shown(self) -> tuple[str, dict[str, FieldValue]]:
        """The spec text and field values the page shows now: after a post, the merged
        spec and the fields read back from it (a field whose own value could not be read
        keeps what was typed)."""
        if self.mapping is None:
            text = str(self.data.get("spec_text") or "")
            return text, {f: self._posted(f) for f in FIELD_PATHS}
        values = field_values(self.mapping)
        for field in self._unwritten:
            values[field] = self._posted(field)
        return self.text or "", values

    def _synced_values(self, values: dict[str, FieldValue]) -> dict[str, FieldValue]:
        """What ``synced`` records: the values read from the spec. A field whose typed
        value could not be written keeps showing it, but ``synced`` holds the spec's, so
        the next check or submit still sees that field as edited (and its error again)."""
        if self.mapping is None or not self._unwritten:
            return values
        spec_values = field_values(self.mapping)
        return {f: spec_values[f] if f in self._unwritten else v for f, v in values.items()}

    @property
    def warnings_at(self) -> dict[str, list[str]]:
        """Warnings by form field, for the template (``form.warnings_at.model_id``)."""
        out: dict[str, list[str]] = {}
        for w in self.warnings:
            out.setdefault(w["field"], []).append(f"{w['path']}: {w['message']}")
        return out

    def synced_json(self, text: str, values: dict[str, FieldValue], preset: str) -> str:
        return json.dumps({"preset": preset, "text": _digest(text), "fields": values})

    def rebind_shown(self) -> None:
        """Make a bound form render what ``shown()`` says (the view re-renders it after
        errors), so the fields, the spec text and ``synced`` agree again."""
        text, values = self.shown()
        data = self.data.copy()
        data["spec_text"] = text
        data["preset"] = self.matched_preset
        data["synced"] = self.synced_json(text, self._synced_values(values), self.matched_preset)
        for field, value in values.items():
            if isinstance(value, list):
                data.setlist(field, value)
            else:
                data[field] = value
        self.data = data

    def state(self) -> dict[str, Any]:
        """What ``/runs/new/check`` answers, for the page's script."""
        text, values = self.shown()
        problems = list(self.problems)
        for field, messages in self._errors.items():  # a field's own check (not a number...)
            for message in messages:
                if (field, message) not in self._added:
                    path = f"spec.{FIELD_PATHS[field]}" if field in FIELD_PATHS else field
                    problems.append({"field": field, "path": path, "message": message})
        return {
            "spec_text": text,
            "fields": values,
            "preset": self.matched_preset,
            "synced": self.synced_json(text, self._synced_values(values), self.matched_preset),
            "errors": problems,
            "warnings": self.warnings,
            "valid": self.spec is not None,
        }

    def initial_from_text(self, text: str) -> None:
        """An unbound form showing a spec text (a run's, to edit and submit again)."""
        values = field_values(rs.safe_yaml(text))
        preset = _preset_of(rs.loads_spec(text))
        self.initial.update(
            {
                "preset": preset,
                "spec_text": text,
                "synced": self.synced_json(text, values, preset),
                **values,
            }
        )

    def initial_from_preset(self, name: str) -> None:
        """An unbound form showing a preset: its spec text, the fields read from it."""
        text = preset_yaml(name)
        values = field_values(rs.safe_yaml(text))
        self.initial.update(
            {
                "preset": name,
                "spec_text": text,
                "synced": self.synced_json(text, values, name),
                **values,
            }
        )


def _preset_of(spec: rs.Spec) -> str:
    """The name of the preset ``spec`` is exactly, else "" (the form shows "Custom")."""
    dumped = spec.model_dump(mode="json")
    for name, entry in presets.available().items():
        if entry["build"]().model_dump(mode="json") == dumped:
            return name
    return ""


class TokenForm(forms.Form):
    name = forms.CharField(
        max_length=100, help_text="What uses it, e.g. 'github-actions main'.", required=True
    )

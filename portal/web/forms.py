"""The submission form: a preset or a YAML/JSON spec, with the common fields editable.

The spec text is the base (the chosen preset's YAML when the text is empty); the common
fields, when filled, override it. Validation is the runner's own spec model, and each
error is shown next to the form field it belongs to (anything without a form field of its
own is shown under the spec text, with its dotted path).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml
from django import forms

from portal.benchmarks import policy
from runners import spec as rs

_WHOLE = re.compile(r"^[0-9]{1,9}$")

BACKEND_CHOICES = [
    ("hf-sequential", "HF Transformers sequential baseline"),
    ("vllm", "vLLM server (continuous batching, PagedAttention)"),
]


def preset_choices() -> list[tuple[str, str]]:
    return [("", "Custom (use the spec below)")] + [
        (key, str(value["title"])) for key, value in rs.PRESETS.items()
    ]


def preset_yaml(name: str) -> str:
    return rs.dump_spec(rs.preset(name))


class RunForm(forms.Form):
    preset = forms.ChoiceField(required=False, choices=preset_choices)
    spec_text = forms.CharField(
        required=False,
        label="Spec (YAML or JSON)",
        widget=forms.Textarea(attrs={"rows": 22, "spellcheck": "false"}),
        max_length=200_000,
    )
    name = forms.CharField(required=False, max_length=200)
    model_id = forms.CharField(required=False, max_length=256, label="Model")
    input_len = forms.IntegerField(required=False, label="Prompt tokens")
    output_len = forms.IntegerField(required=False, label="Output tokens")
    num_prompts = forms.IntegerField(required=False, label="Prompts per point")
    concurrency = forms.CharField(
        required=False, max_length=200, label="Concurrency sweep", help_text="e.g. 1, 4, 16, 64"
    )
    backends = forms.MultipleChoiceField(
        required=False, choices=BACKEND_CHOICES, widget=forms.CheckboxSelectMultiple
    )
    is_public = forms.BooleanField(required=False, label="Public (readable without sign-in)")

    # Spec error paths shown next to a form field; everything else goes under spec_text.
    FIELD_FOR_PATH = {
        "name": "name",
        "model.id": "model_id",
        "model.tokenizer": "model_id",
        "workload.input_len": "input_len",
        "workload.output_len": "output_len",
        "workload.num_prompts": "num_prompts",
        "backends": "backends",
    }

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        self.spec: rs.Spec | None = None
        self._concurrency_sweep: int | None = None
        choices = policy.form_choices()
        self.gpu_types: list[str] = choices["gpu_types"]
        self.node_selector_keys: list[str] = choices["node_selector_keys"]

    # ------------------------------------------------------------------ building

    def _base(self) -> dict[str, Any] | None:
        text = (self.cleaned_data.get("spec_text") or "").strip()
        preset = self.cleaned_data.get("preset") or ""
        if not text:
            if not preset:
                self.add_error("spec_text", "Paste a spec, or choose a preset.")
                return None
            return rs.preset(preset).model_dump(mode="json", exclude_none=True)
        try:
            data = rs.safe_yaml(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            self.add_error("spec_text", f"This is not valid YAML or JSON{where}.")
            return None
        if not isinstance(data, dict):
            self.add_error("spec_text", "A spec is a mapping (model:, workload:, sweeps: ...).")
            return None
        return data

    def _concurrency_values(self) -> list[int] | None:
        raw = (self.cleaned_data.get("concurrency") or "").strip()
        if not raw:
            return None
        values = []
        for part in raw.replace(";", ",").replace(" ", ",").split(","):
            if not part:
                continue
            if not _WHOLE.match(part) or int(part) < 1:
                self.add_error(
                    "concurrency", f"{part!r} is not a positive whole number; use e.g. 1, 4, 16"
                )
                return None
            values.append(int(part))
        return values

    def _apply_overrides(self, data: dict[str, Any]) -> dict[str, Any]:
        data = copy.deepcopy(data)
        cd = self.cleaned_data
        if cd.get("name"):
            data["name"] = cd["name"]
        if cd.get("model_id"):
            model = data.get("model") if isinstance(data.get("model"), dict) else {}
            data["model"] = {**model, "id": cd["model_id"].strip()}
        workload = data.get("workload") if isinstance(data.get("workload"), dict) else {}
        for field in ("input_len", "output_len", "num_prompts"):
            if cd.get(field) is not None:
                workload = {**workload, field: cd[field]}
        if workload:
            data["workload"] = workload
        values = self._concurrency_values()
        if values is not None:
            sweeps = data.get("sweeps") if isinstance(data.get("sweeps"), list) else []
            sweeps = list(sweeps)
            for i, sweep in enumerate(sweeps):
                if isinstance(sweep, dict) and sweep.get("axis") == "max_concurrency":
                    sweeps[i] = {**sweep, "values": values}
                    self._concurrency_sweep = i
                    break
            else:
                sweeps.insert(
                    0, {"name": "concurrency", "axis": "max_concurrency", "values": values}
                )
                self._concurrency_sweep = 0
            data["sweeps"] = sweeps
        kinds = cd.get("backends") or []
        if kinds:
            existing = data.get("backends") if isinstance(data.get("backends"), list) else []
            kept = [b for b in existing if isinstance(b, dict) and b.get("kind", "") in kinds]
            have = {b.get("kind") for b in kept}
            kept += [{"kind": kind} for kind in kinds if kind not in have]
            data["backends"] = kept
        return data

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if self.errors:
            return cleaned
        base = self._base()
        if base is None:
            return cleaned
        data = self._apply_overrides(base)
        if self.errors:
            return cleaned
        try:
            spec = rs.parse_spec(data)
            # The deployment's rules too (remote code, local paths, GPU types, placement),
            # so a refusal shows at its field instead of after submitting.
            from portal.benchmarks.services import check_image

            check_image(spec)
            policy.check(spec, self.user)
            self.spec = spec
        except rs.SpecError as exc:
            for err in exc.errors:
                self.add_error(*self._place(err))
        return cleaned

    def _place(self, err: dict[str, str]) -> tuple[str, str]:
        path, message = err["field"], err["message"]
        if path in self.FIELD_FOR_PATH:
            return self.FIELD_FOR_PATH[path], message
        if self._concurrency_sweep is not None and path.startswith(
            f"sweeps.{self._concurrency_sweep}.values"
        ):
            return "concurrency", message
        return "spec_text", f"{path}: {message}" if path else message

    def initial_from_preset(self, name: str) -> None:
        """Pre-fill the spec text and the common fields from a preset."""
        spec = rs.preset(name)
        sweep = next((s for s in spec.sweeps if s.axis == "max_concurrency"), None)
        self.initial.update(
            {
                "preset": name,
                "spec_text": rs.dump_spec(spec),
                "model_id": spec.model.id,
                "input_len": spec.workload.input_len,
                "output_len": spec.workload.output_len,
                "num_prompts": spec.workload.num_prompts,
                "concurrency": ", ".join(str(int(v)) for v in sweep.values) if sweep else "",
                "backends": sorted({b.kind for b in spec.backends}),
            }
        )


class TokenForm(forms.Form):
    name = forms.CharField(
        max_length=100, help_text="What uses it, e.g. 'github-actions main'.", required=True
    )

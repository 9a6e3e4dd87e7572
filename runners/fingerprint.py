"""What a run measured and what it put under test: two identities, one definition.

A benchmark run answers "how does *this configuration* serve *this workload* on *this
hardware*". Judging a change (a flag in a pull request, a model variant, an engine
upgrade) means holding the workload and the hardware fixed and letting the configuration
differ, so a run has two identities:

- The **measurement** (``measurement()``; its hash is the run's ``fingerprint``): what
  was sent and where.

  - ``workload``: every workload field (dataset and its file, lengths, prompts,
    concurrency, request rate and burstiness, ignore-eos, sampling, warm-ups, seed,
    prefix settings, ramp-up);
  - ``points``: the resolved sweep points in execution order (sweep, axis, value and
    every workload field of the point): the same workload reached through other sweep
    values measures something else;
  - ``gpu``: the GPU type (the model the runner found, else the spec's ``gpu_type``) and
    count (found, else requested).

  Two runs are **comparable** when their measurements are equal. ``differences()`` names
  the facts that differ when they are not.

- The **configuration** (``configuration()``; its hash is ``configuration_fingerprint``):
  what is under test.

  - ``model``: the id, the revision really used where the runner resolved it (a hub
    commit, or ``sha256:`` of a local directory's content; until then the requested
    revision), the tokenizer, dtype, ``max_model_len`` and ``trust_remote_code``;
  - ``backends``: each backend's engine configuration (vLLM: every server flag the spec
    sets; HF: its baseline settings; an endpoint: its target and how it is asked) in a
    canonical order: neither the backends' names, nor ``startup_timeout_s``, nor the order
    in which the spec lists them change it.

  The software the runner found (``software()``: vLLM, PyTorch, Transformers, CUDA,
  driver, image and digest, runner) is configuration too, and ``changes()`` lists it, but
  it is not hashed: runs of one configuration on a new release stay one series, whose
  history is where an upgrade shows (and whose spread, across upgrades, is the
  run-to-run noise a verdict is judged by).

  Between comparable runs, ``changes()`` is the change being judged:
  ``vllm.max_num_seqs: default → 1``, ``vLLM: 0.32.0 → 0.33.1``.

In neither: the run's name, description, repeats, deadline, resources other than the GPU,
the SLO (it only changes how goodput is counted) and an SLA search's settings.

Pure Python: no Django, no torch. ``FINGERPRINT_VERSION`` is hashed into both; bump it
(and recompute stored fingerprints in a migration) whenever a definition changes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runners import envfacts
from runners.spec import Spec

FINGERPRINT_VERSION = 3

_ABSENT = {"", "none", "unknown", "not installed"}

# The software facts a change lists (hardware is in the measurement; the model's revision
# is in the configuration's model).
SOFTWARE_FACTS: tuple[envfacts.Fact, ...] = tuple(
    f
    for f in envfacts.COMPARED
    if not f.path.startswith(("gpu.model", "gpu.count", "gpu.memory", "model."))
)


def _known(value: Any) -> str:
    text = "" if value is None else str(value).strip()
    return "" if text.lower() in _ABSENT else text


def _backend(backend: Any) -> dict[str, Any]:
    """A backend's engine configuration: what needs a server (or a baseline) of its own."""
    if hasattr(backend, "server_config"):
        return {"kind": backend.kind, **backend.server_config()}
    return backend.model_dump(mode="json", exclude={"name", "startup_timeout_s"})


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def measurement(spec: Spec, environment: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a run of ``spec`` measured (module doc), as plain JSON.

    ``environment`` is ``runners.environment.capture()``'s document, or None before the
    runner reported it (then the GPU is the spec's).
    """
    gpu_count = envfacts.lookup(environment, "gpu.count")
    # The correctness check sends its eval prompts within the load: part of what was
    # measured when set (absent otherwise, so earlier fingerprints are unchanged).
    checked = {"correctness": spec.correctness.model_dump(mode="json")} if spec.correctness else {}
    return {
        **checked,
        "workload": spec.workload.model_dump(mode="json"),
        "points": [p.model_dump(mode="json") for p in spec.points()],
        "gpu": {
            "type": _known(envfacts.lookup(environment, "gpu.model"))
            or (spec.resources.gpu_type or ""),
            "count": gpu_count if isinstance(gpu_count, int) else spec.resources.gpu_count,
        },
    }


def configuration(spec: Spec, environment: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a run of ``spec`` put under test (module doc), as plain JSON (without the
    software, which ``software()`` reads from the environment)."""
    m = spec.model
    return {
        "model": {
            "id": m.id,
            "revision": _known(envfacts.lookup(environment, "model.revision")) or m.revision or "",
            "tokenizer": m.tokenizer or "",
            "dtype": m.dtype,
            "max_model_len": m.max_model_len,
            "trust_remote_code": m.trust_remote_code,
        },
        "backends": sorted((_backend(b) for b in spec.backends), key=_canonical),
    }


def software(environment: Mapping[str, Any] | None) -> dict[str, str]:
    """The software the runner found, by label (``SOFTWARE_FACTS``); unknown ones left out."""
    out = {}
    for fact in SOFTWARE_FACTS:
        value = _known(envfacts.lookup(environment, fact.path))
        if value:
            out[fact.label] = value
    return out


def fingerprint_of(parts: Mapping[str, Any]) -> str:
    """sha256 hex of a ``measurement()`` or ``configuration()`` (with the version)."""
    blob = _canonical({"fingerprint_version": FINGERPRINT_VERSION, **parts})
    return hashlib.sha256(blob.encode()).hexdigest()


def fingerprint(spec: Spec, environment: Mapping[str, Any] | None = None) -> str:
    """The run's fingerprint: the hash of what it measured (``measurement()``). Runs with
    equal fingerprints are comparable; a labelled series is runs of one fingerprint."""
    return fingerprint_of(measurement(spec, environment))


def configuration_fingerprint(spec: Spec, environment: Mapping[str, Any] | None = None) -> str:
    """The hash of what the run put under test (``configuration()``)."""
    return fingerprint_of(configuration(spec, environment))


@dataclass(frozen=True)
class Difference:
    """One fact that differs: ``field`` (``model.dtype``, ``gpu.type``,
    ``workload.input_len``, ``points[...]``, ``backends[vllm].max_num_seqs``, ``vLLM``)
    and each side's value as text ("—" where a side has none)."""

    field: str
    base: str
    other: str

    def __str__(self) -> str:
        return f"{self.field}: {self.base} vs {self.other}"

    @property
    def name(self) -> str:
        """The field as a change names it: ``vllm.max_num_seqs``, ``model.id``, ``vLLM``."""
        if self.field.startswith("backends[") and "]." in self.field:
            kind, _, key = self.field.removeprefix("backends[").partition("].")
            return f"{kind}.{key}"
        return self.field

    @property
    def change(self) -> str:
        """As a change reads: ``vllm.max_num_seqs: default → 1`` (a setting the spec left
        out is the engine's default)."""

        def side(value: str) -> str:
            return "default" if value == "—" else value

        if self.base == "present" or self.other == "present":  # a backend added or removed
            return f"{self.name}: {'added' if self.base == '—' else 'removed'}"
        return f"{self.name}: {side(self.base)} → {side(self.other)}"


def _flat(parts: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for group, value in parts.items():
        if isinstance(value, Mapping):
            for key, item in value.items():
                out[f"{group}.{key}"] = item
        else:
            out[group] = value
    return out


def _text(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, str):
        return value
    return _canonical(value)


def _point_key(point: Mapping[str, Any]) -> str:
    value = point.get("value")
    if point.get("axis") is None or value is None:
        return str(point.get("sweep"))
    shown = int(value) if float(value).is_integer() else value
    return f"{point.get('sweep')}:{point.get('axis')}={shown}"


def _by(items: Any, key: Any) -> dict[str, Any] | None:
    """Items keyed by ``key(item)``, or None when the keys are not unique."""
    if not isinstance(items, list):
        return None
    out = {key(item): item for item in items if isinstance(item, Mapping)}
    return out if len(out) == len(items) else None


def _nested(field: str, a: Any, b: Any, key: Any) -> list[Difference] | None:
    """Differences inside two lists of mappings matched by ``key`` (a point's key, a
    backend's kind): one row per differing setting, one per item only one side has."""
    left, right = _by(a, key), _by(b, key)
    if left is None or right is None:
        return None
    out = []
    for name in dict.fromkeys([*left, *right]):
        if name not in right:
            out.append(Difference(f"{field}[{name}]", "present", "—"))
        elif name not in left:
            out.append(Difference(f"{field}[{name}]", "—", "present"))
        else:
            for k in dict.fromkeys([*left[name], *right[name]]):
                x, y = left[name].get(k), right[name].get(k)
                if _canonical(x) != _canonical(y):
                    out.append(Difference(f"{field}[{name}].{k}", _text(x), _text(y)))
    return out


def differences(base: Mapping[str, Any], other: Mapping[str, Any]) -> list[Difference]:
    """The facts of two ``measurement()``s (or two ``configuration()``s) that differ, in
    definition order: ``gpu.type: H100 vs A100``, ``workload.input_len: 1024 vs 512``,
    ``points[concurrency:max_concurrency=64]: present vs —``,
    ``backends[vllm].kv_cache_dtype: auto vs fp8``."""
    a, b = _flat(base), _flat(other)
    out: list[Difference] = []
    for field in dict.fromkeys([*a, *b]):
        x, y = a.get(field), b.get(field)
        if _canonical(x) == _canonical(y):
            continue
        nested = None
        if field == "points":
            nested = _nested(field, x, y, _point_key)
        elif field == "backends":
            nested = _nested(field, x, y, lambda item: str(item.get("kind")))
        out.extend(nested if nested is not None else [Difference(field, _text(x), _text(y))])
    return out


@dataclass(frozen=True)
class Identity:
    """A run's two identities and the software it found (module doc)."""

    measurement: dict[str, Any]
    configuration: dict[str, Any]
    software: dict[str, str]

    @classmethod
    def of(cls, spec: Spec, environment: Mapping[str, Any] | None = None) -> Identity:
        return cls(
            measurement(spec, environment),
            configuration(spec, environment),
            software(environment),
        )

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.measurement)

    @property
    def configuration_fingerprint(self) -> str:
        return fingerprint_of(self.configuration)

    def comparable_with(self, other: Identity) -> bool:
        return self.fingerprint == other.fingerprint

    def differences(self, other: Identity) -> list[Difference]:
        """What makes ``other`` measure something else (empty: comparable)."""
        return differences(self.measurement, other.measurement)

    def changes(self, other: Identity) -> list[Difference]:
        """What ``other`` changed: its configuration's differences, then the software's
        (a version only one side reported is not a change: it was not read)."""
        out = differences(self.configuration, other.configuration)
        for label in dict.fromkeys([*self.software, *other.software]):
            x, y = self.software.get(label), other.software.get(label)
            if x and y and x != y:
                out.append(Difference(label, x, y))
        return out

    @property
    def models(self) -> str:
        return str(self.configuration.get("model", {}).get("id", ""))


# Engine settings that change what a model answers (not only how fast): a change of one
# is judged for speed, and the quality of the answers is not measured by it.
ANSWER_SETTINGS = ("quantization", "kv_cache_dtype", "speculative_config", "lora_adapters")


def quality_note(base: Identity, other: Identity) -> str:
    """What a comparison cannot tell when the model or a setting that changes its answers
    changed (empty when neither did)."""
    a, b = base.configuration.get("model", {}), other.configuration.get("model", {})
    changed = [f"model.{k}" for k in ("id", "revision", "dtype") if a.get(k) != b.get(k)]
    changed += [
        d.name
        for d in differences(base.configuration, other.configuration)
        if d.field.startswith("backends[") and d.field.rsplit(".", 1)[-1] in ANSWER_SETTINGS
    ]
    if not changed:
        return ""
    if base.measurement.get("correctness") and other.measurement.get("correctness"):
        return (
            f"What the model answers may differ ({', '.join(changed)}): both runs checked "
            "their answers under load (greedy agreement, eval accuracy), judged beside speed."
        )
    return (
        f"What the model answers may differ ({', '.join(changed)}): this compares speed; "
        "the quality of the answers is not measured (set correctness in the spec to check it)."
    )

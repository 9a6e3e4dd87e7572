"""What makes two runs comparable: one definition, used by the runner and the portal.

A run's *fingerprint* is a sha256 over the facts that decide what was measured. Two runs
with the same fingerprint measured the same thing on the same kind of hardware, so their
numbers belong to one series (history, baselines, ``latest:<label>``, the compare
verdict); runs whose fingerprints differ are *not comparable*, and ``differences()`` says
which facts differ.

In it (``components()``, in this order):

- ``model``: the id, the revision really used where the runner resolved it (a hub commit,
  or ``sha256:`` of a local directory's content; until then the requested revision), the
  tokenizer, dtype, ``max_model_len`` and ``trust_remote_code``;
- ``workload``: every workload field (dataset and its file, lengths, prompts, concurrency,
  request rate and burstiness, ignore-eos, warm-ups, seed, prefix length);
- ``points``: the resolved sweep points in execution order (sweep, axis, value and every
  workload field of the point): the same workload reached through other sweep values is
  another series;
- ``backends``: each backend's engine configuration (vLLM: every server flag the spec sets;
  HF: its baseline settings) in a canonical order: neither the backends' names, nor
  ``startup_timeout_s``, nor the order in which the spec lists the backends change it;
- ``gpu``: the GPU type (the model the runner found, else the spec's ``gpu_type``) and
  count (found, else requested).

Not in it: the run's name, description, repeats, deadline, resources other than the GPU,
the image, software versions (vLLM, PyTorch, driver, CUDA) and the SLO. A new vLLM release
or image stays in the series, so its history is where an upgrade shows; more repeats
measure the same thing more often; an SLO only changes how goodput is counted.

Pure Python: no Django, no torch. ``FINGERPRINT_VERSION`` is hashed too; bump it (and
recompute stored fingerprints in a migration) whenever this definition changes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runners.spec import Spec

FINGERPRINT_VERSION = 2

_ABSENT = {"", "none", "unknown", "not installed"}


def _env(environment: Mapping[str, Any] | None, dotted: str) -> Any:
    node: Any = environment or {}
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


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


def components(spec: Spec, environment: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The comparable facts of a run of ``spec`` (see the module doc), as plain JSON.

    ``environment`` is ``runners.environment.capture()``'s document, or None before the
    runner reported it (then the revision is the requested one and the GPU the spec's).
    """
    m = spec.model
    gpu_count = _env(environment, "gpu.count")
    backends = sorted((_backend(b) for b in spec.backends), key=_canonical)
    return {
        "model": {
            "id": m.id,
            "revision": _known(_env(environment, "model.revision")) or m.revision or "",
            "tokenizer": m.tokenizer or "",
            "dtype": m.dtype,
            "max_model_len": m.max_model_len,
            "trust_remote_code": m.trust_remote_code,
        },
        "workload": spec.workload.model_dump(mode="json"),
        "points": [p.model_dump(mode="json") for p in spec.points()],
        "backends": backends,
        "gpu": {
            "type": _known(_env(environment, "gpu.model")) or (spec.resources.gpu_type or ""),
            "count": gpu_count if isinstance(gpu_count, int) else spec.resources.gpu_count,
        },
    }


def fingerprint_of(parts: Mapping[str, Any]) -> str:
    """sha256 hex of ``components()``' output (with the definition's version)."""
    blob = _canonical({"fingerprint_version": FINGERPRINT_VERSION, **parts})
    return hashlib.sha256(blob.encode()).hexdigest()


def fingerprint(spec: Spec, environment: Mapping[str, Any] | None = None) -> str:
    """The run's fingerprint: sha256 hex (64 characters) of ``components(spec, environment)``."""
    return fingerprint_of(components(spec, environment))


@dataclass(frozen=True)
class Difference:
    """One comparable fact that differs: ``field`` (``model.dtype``, ``gpu.type``,
    ``workload.input_len``, ``points``, ``backends``) and each side's value as text."""

    field: str
    base: str
    other: str

    def __str__(self) -> str:
        return f"{self.field}: {self.base} vs {self.other}"


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
    """The facts of ``components()`` that differ between two runs, in definition order:
    ``model.dtype: bfloat16 vs float16``, ``backends[vllm].kv_cache_dtype: auto vs fp8``,
    ``points[concurrency:max_concurrency=64]: present vs —``."""
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

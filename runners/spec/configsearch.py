"""Configuration search (``ConfigSearch``): one vLLM backend of the spec, the *base*, run
as several engine configurations, each its own server with a name of its own.

A ``grid`` (every combination of the listed values, in the order written) or a
``configs`` list (one set of overrides each) varies any of ``VLLMBackend``'s fields
(``max_num_seqs``, ``enable_prefix_caching``, ``extra_args`` for chunked prefill,
``speculative_config``...). Each configuration is the base with its overrides, validated
by ``VLLMBackend``'s own rules, named from what it changes (``vllm-seqs4-prefix``).

Expanded once: the spec as executed lists the configurations in ``backends`` where the
base was (the base itself is not measured), so a stored run re-parses to the same
servers; a spec whose ``backends`` no longer hold the base is that executed form and is
not expanded again. With an SLA search each configuration is searched in turn, and the
leader's answer gates the next ones (``runners.sla``: early dropping); ``budget`` decides
whether a configuration starts at all (``runners.configsearch``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError, field_validator, model_validator

from runners.choices import choice_message
from runners.spec.backends.vllm import VLLMBackend
from runners.spec.common import (
    MAX_CONFIGS,
    MAX_POINTS,
    MAX_SWEEP_VALUES,
    FieldError,
    Strict,
    _label,
)
from runners.spec.errors import errors_from

if TYPE_CHECKING:
    from runners.spec.root import Spec

# What a configuration may not change: who it is, and how long it may take to start.
_FIXED_FIELDS = ("kind", "name")
# Short words for the fields configurations usually vary (the rest: the field's name).
_SHORT = {
    "max_num_seqs": "seqs",
    "max_num_batched_tokens": "tokens",
    "tensor_parallel_size": "tp",
    "kv_cache_dtype": "kv",
    "quantization": "q",
    "gpu_memory_utilization": "mem",
    "block_size": "block",
    "enable_prefix_caching": "prefix",
    "enforce_eager": "eager",
    "speculative_config": "spec",
    "extra_args": "",
}


def override_fields() -> list[str]:
    """The VLLMBackend fields a configuration may set."""
    return [f for f in VLLMBackend.model_fields if f not in _FIXED_FIELDS]


class Budget(Strict):
    """How much a configuration search may spend: checked before each configuration
    starts (one that has started finishes); those not started are 'not measured
    (budget)'."""

    points: int | None = Field(
        None, ge=1, le=MAX_POINTS, description="Measurements of the configurations, all told."
    )
    minutes: float | None = Field(
        None, gt=0, le=7 * 24 * 60, description="Minutes since the first configuration began."
    )

    @model_validator(mode="after")
    def _one(self) -> Budget:
        if self.points is None and self.minutes is None:
            raise ValueError("a budget needs points, minutes or both")
        return self


class ConfigSearch(Strict):
    """Run one vLLM backend (``base``) as several engine configurations: a ``grid`` of
    values per field (every combination) or a ``configs`` list of overrides."""

    base: str = Field("vllm", description="The name of the vllm backend the configurations vary.")
    grid: dict[str, list[Any]] = Field(
        default_factory=dict,
        max_length=8,
        description="Field -> the values to try; every combination is a configuration.",
    )
    configs: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=MAX_CONFIGS,
        description="One configuration per entry: the fields it sets (and optionally its name).",
    )
    budget: Budget | None = Field(
        None, description="Points and/or minutes; configurations not started are said so."
    )
    early_drop: bool = Field(
        True,
        description="With an SLA search: measure each later configuration first at the "
        "leader's answer, and drop it when it misses the SLO there.",
    )

    @field_validator("grid")
    @classmethod
    def _grid(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for field, values in v.items():
            _known(field)
            if not values:
                raise FieldError(field, "give at least one value")
            if len(values) > MAX_SWEEP_VALUES:
                raise FieldError(field, f"at most {MAX_SWEEP_VALUES} values")
            seen = [_canon(x) for x in values]
            for i, value in enumerate(seen):
                if value in seen[:i]:
                    raise FieldError(f"{field}.{i}", f"{values[i]!r} is listed twice")
        return v

    @field_validator("configs")
    @classmethod
    def _configs(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, overrides in enumerate(v):
            if not overrides:
                raise FieldError(str(i), "a configuration sets at least one field")
            for field in overrides:
                if field == "name":
                    if not isinstance(overrides[field], str):
                        raise FieldError(f"{i}.name", "a name is a string")
                    try:
                        _label(overrides[field], "configuration name")
                    except ValueError as exc:
                        raise FieldError(f"{i}.name", str(exc)) from None
                    continue
                try:
                    _known(field)
                except FieldError as exc:
                    raise FieldError(f"{i}.{exc.field}", str(exc)) from None
        return v

    @model_validator(mode="after")
    def _shape(self) -> ConfigSearch:
        _label(self.base, "base backend name")
        if bool(self.grid) == bool(self.configs):
            raise ValueError("give either grid (every combination) or configs (a list), not both")
        count = len(self.overrides())
        if count > MAX_CONFIGS:
            raise FieldError("grid", f"the grid has {count} combinations; at most {MAX_CONFIGS}")
        if count < 2 and self.grid:
            raise FieldError("grid", "a search needs at least two configurations")
        return self

    def overrides(self) -> list[dict[str, Any]]:
        """Each configuration's fields, in order (grid: the last field varies fastest)."""
        if self.configs:
            return [dict(c) for c in self.configs]
        fields = list(self.grid)
        combos = itertools.product(*(self.grid[f] for f in fields))
        return [dict(zip(fields, combo, strict=True)) for combo in combos]

    def where(self, index: int, field: str | None) -> str:
        """The spec path of configuration ``index``'s ``field`` (None: the configuration)."""
        if self.configs:
            return f"config_search.configs.{index}" + (f".{field}" if field else "")
        if field is None or field not in self.grid:
            return "config_search.grid"
        combo = self.overrides()[index]
        values = [_canon(x) for x in self.grid[field]]
        return f"config_search.grid.{field}.{values.index(_canon(combo[field]))}"

    def names(self) -> list[str]:
        """The configurations' backend names, in order (unique, stable, readable)."""
        names = []
        for overrides in self.overrides():
            given = overrides.get("name")
            if given:
                names.append(given)
                continue
            parts = [_part(f, x) for f, x in overrides.items() if f != "name"]
            names.append(_fit("-".join([self.base, *[p for p in parts if p]])))
        for i, name in enumerate(names):
            if name in names[:i] or name == self.base:
                names[i] = _fit(f"{name}-{i + 1}")
        return names


def _known(field: str) -> None:
    if field in _FIXED_FIELDS:
        raise FieldError(field, f"a configuration may not change {field!r}")
    allowed = override_fields()
    if field not in allowed:
        raise FieldError(field, choice_message(field, allowed, "vllm backend field"))


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _word(value: Any) -> str:
    text = re.sub(r"[^A-Za-z0-9.]+", "-", str(value)).strip("-.").lower()
    return text[:24] or "x"


def _part(field: str, value: Any) -> str:
    """One field's share of a configuration's name: seqs4, prefix / noprefix, kv-fp8."""
    short = _SHORT.get(field, field.replace("_", "-"))
    if isinstance(value, bool):
        return short if value else f"no{short}"
    if value is None:
        return "nospec" if field == "speculative_config" else f"{short}-default"
    if field == "extra_args":
        flags = [a.split("=", 1)[0].lstrip("-") for a in value if a.startswith("-")]
        words = [
            {"enable-chunked-prefill": "chunked", "no-enable-chunked-prefill": "nochunked"}.get(
                f, f
            )
            for f in flags
        ]
        return _word("-".join(words)) if words else "noextra"
    if field == "speculative_config":
        if isinstance(value, dict):
            return f"spec-{_word(value.get('method') or 'on')}"
        return "spec"
    if field == "image" and isinstance(value, str):
        # The tag (or the digest's start) tells images apart: img-v0.11.0, img-sha256-ab12.
        name, _, digest = value.partition("@")
        tag = name.rsplit("/", 1)[-1].rpartition(":")[2] if ":" in name.rsplit("/", 1)[-1] else ""
        return f"img-{_word(digest[:19] if digest else tag or name.rsplit('/', 1)[-1])}"
    if isinstance(value, int | float):
        return f"{short}{value:g}"
    return f"{short}-{_word(value)}"


def _fit(name: str) -> str:
    """A label (runners.spec.common._LABEL): at most 63 characters."""
    if len(name) <= 63:
        return name
    return name[:55].rstrip("-.") + "-" + hashlib.sha256(name.encode()).hexdigest()[:7]


def expand_configs(spec: Spec) -> None:
    """Replace the base backend by its configurations (see the module doc), or check the
    executed form of a stored spec: every configuration is a vllm backend of it."""
    search = spec.config_search
    if search is None:
        return
    names = [b.name for b in spec.backends]
    wanted = search.names()
    if search.base not in names:
        if all(n in names for n in wanted):
            for name in wanted:  # the executed form: expanded when it was submitted
                if not isinstance(spec.backends[names.index(name)], VLLMBackend):
                    raise FieldError("config_search.base", f"{name!r} is not a vllm backend")
            return
        raise FieldError(
            "config_search.base",
            f"{search.base!r} is not a backend of this spec "
            f"({', '.join(names)}); name the vllm backend the configurations vary",
        )
    at = names.index(search.base)
    base = spec.backends[at]
    if not isinstance(base, VLLMBackend):
        raise FieldError(
            "config_search.base",
            f"{search.base!r} is a {base.kind} backend; the base is a vllm one",
        )
    start = base.model_dump(mode="json")
    configs: list[VLLMBackend] = []
    for i, (overrides, name) in enumerate(zip(search.overrides(), wanted, strict=True)):
        data = {**start, **{k: v for k, v in overrides.items() if k != "name"}, "name": name}
        try:
            configs.append(VLLMBackend.model_validate(data))
        except ValidationError as exc:
            first = errors_from(exc)[0]
            loc = first["field"].split(".") if first["field"] else []
            own = bool(loc) and loc[0] in overrides
            path = search.where(i, loc[0] if own else None)
            raise FieldError(
                ".".join([path, *loc[1:]]) if own else path, first["message"]
            ) from None
    keys = [json.dumps(c.server_key(), sort_keys=True, default=str) for c in configs]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            raise FieldError(
                search.where(i, None),
                f"configuration {wanted[i]!r} starts the same server as "
                f"{wanted[keys.index(key)]!r}; drop one",
            )
    # Bypasses validate_assignment: the caller (Spec's validator) checks what follows.
    spec.__dict__["backends"] = [*spec.backends[:at], *configs, *spec.backends[at + 1 :]]
    if spec.sla_search is not None and search.base in spec.sla_search.backends:
        listed = [n for n in spec.sla_search.backends if n != search.base]
        spec.sla_search.__dict__["backends"] = [*listed, *wanted]

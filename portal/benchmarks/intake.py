"""A run's submission: read the request, check the spec against this portal, store the run.

Views (API and web), management commands and re-runs create runs here, nowhere else.

- ``spec_from_request(data, user)``: a create-run body (``{"spec": ...}`` or
  ``{"preset": ...}``) -> ``RunRequest``, or ``runners.spec.SpecError`` with fields
  prefixed by where they were found (``spec.workload.input_len``).
- ``create_run(owner, spec, name)``: validate with ``runners.spec`` and this portal's
  ``policy``, check fair use (``portal.accounts.quotas``: limits and the run's priority),
  store a queued run, and enqueue its dispatch after commit. Raises ``SpecError`` or
  ``QuotaExceeded`` (nothing stored or queued).
- ``identity(spec, environment)`` and ``backend_labels(spec)``: the run's columns
  that a spec decides.

Which images, paths, hosts and GPU types a spec may name is ``policy``'s; what the
executor can give is ``preflight``'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from portal.accounts import quotas
from portal.accounts.models import ApiToken
from portal.benchmarks import policy, preflight, presets
from portal.benchmarks.lifecycle import enqueue_dispatch
from portal.benchmarks.models import Run
from runners import fingerprint as rf
from runners import spec as rs
from runners.choices import choice_message

log = logging.getLogger(__name__)


def coerce_spec(spec: rs.Spec | dict[str, Any] | str) -> rs.Spec:
    """A validated Spec from a Spec, a mapping, or YAML/JSON text. Raises SpecError."""
    if isinstance(spec, rs.Spec):
        return spec
    if isinstance(spec, str):
        return rs.loads_spec(spec)
    return rs.parse_spec(spec)


@dataclass(frozen=True)
class RunRequest:
    """A validated create-run body."""

    spec: rs.Spec
    name: str | None = None
    is_public: bool = False
    # What this portal's executor may not give the run (``preflight``), as {field, message}
    # with the body's field names: the run is created, and the answer carries them.
    warnings: tuple[dict[str, str], ...] = ()


def spec_from_request(data: Any, user: Any = None) -> RunRequest:
    """Read a create-run body: ``{"spec": {...}}`` or ``{"preset": "seed"}``, with optional
    ``"name"`` and ``"is_public"``, and check it against this portal's policy for ``user``.

    Raises SpecError (``policy.SpecForbidden`` for what the user may not do) with fields
    prefixed by where they were found (``spec.workload.input_len``), so a client can point
    at them. What the executor cannot give (``preflight``) is refused the same way, or
    returned as ``warnings``.
    """
    if not isinstance(data, dict):
        raise rs.SpecError([{"field": "", "message": "the body must be a JSON object"}])
    unknown = sorted(set(data) - {"spec", "preset", "name", "is_public"})
    if unknown:
        raise rs.SpecError([{"field": str(key), "message": "unknown field"} for key in unknown])
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > 200):
        raise rs.SpecError(
            [{"field": "name", "message": "name must be a string of at most 200 characters"}]
        )
    if name is not None and rs.json_problem(name):
        raise rs.SpecError([{"field": "name", "message": rs.json_problem(name)[1]}])
    is_public = data.get("is_public", False)
    if not isinstance(is_public, bool):
        raise rs.SpecError([{"field": "is_public", "message": "is_public must be true or false"}])
    if ("spec" in data) == ("preset" in data):
        raise rs.SpecError(
            [{"field": "spec", "message": "give exactly one of 'spec' (a spec object) or 'preset'"}]
        )
    if "preset" in data:
        preset = data["preset"]
        offered = presets.available()
        if not isinstance(preset, str) or preset not in offered:
            message = choice_message(preset if isinstance(preset, str) else "", sorted(offered))
            raise rs.SpecError([{"field": "preset", "message": message}])
        spec = presets.build(preset)
        try:
            warnings = preflight.check(spec)
        except rs.SpecError as exc:
            raise rs.SpecError(
                [
                    {"field": "preset", "message": f"the {preset!r} preset {e['message']}"}
                    for e in exc.errors
                ]
            ) from None
        notes = tuple({"field": "spec." + w["field"], "message": w["message"]} for w in warnings)
        return RunRequest(spec, name, is_public, notes)
    if not isinstance(data["spec"], dict):
        raise rs.SpecError([{"field": "spec", "message": "spec must be an object (a mapping)"}])
    try:
        spec = rs.parse_spec(data["spec"])
        policy.check_image(spec)
        policy.check(spec, user)
        warnings = preflight.check(spec)
        notes = tuple({"field": "spec." + w["field"], "message": w["message"]} for w in warnings)
        return RunRequest(spec, name, is_public, notes)
    except rs.SpecError as exc:
        raise type(exc)(
            [
                {"field": "spec." + e["field"] if e["field"] else "spec", "message": e["message"]}
                for e in exc.errors
            ]
        ) from None


def identity(spec: rs.Spec, environment: dict[str, Any] | None = None) -> rf.Identity:
    """A run's two identities (``runners.fingerprint``): ``Run.fingerprint`` is what it
    measured (workload, points, GPU type and count: the one definition of "comparable"),
    ``Run.config_fingerprint`` what it put under test (model and its revision, every
    backend's engine and flags). Before the runner reported its environment, the
    requested revision and the spec's GPU stand in for the found ones."""
    return rf.Identity.of(spec, environment)


def backend_labels(spec: rs.Spec) -> list[str]:
    """``Run.backends``: every backend's kind and name, sorted (what the run list filters)."""
    return sorted({b.kind for b in spec.backends} | {b.name for b in spec.backends})


def create_run(
    owner: AbstractBaseUser,
    spec: rs.Spec | dict[str, Any] | str,
    name: str | None = None,
    *,
    is_public: bool = False,
    token: ApiToken | None = None,
) -> Run:
    """Validate ``spec`` (raises SpecError: nothing stored), check fair use (raises
    ``quotas.QuotaExceeded``: nothing stored; ``token``: the CI token it came with), store
    a queued run, and enqueue its dispatch once the transaction commits."""
    parsed = coerce_spec(spec)
    policy.check_image(parsed)
    policy.check(parsed, owner)
    run_name = (name or parsed.name or f"{parsed.model.id}").strip()[:200]
    gpu_type = parsed.resources.gpu_type or ""
    token = token if isinstance(token, ApiToken) and token.kind == ApiToken.Kind.CI else None
    with transaction.atomic():
        priority = quotas.admit(owner, parsed, token)
        found = identity(parsed)
        run = Run.objects.create(
            priority=priority,
            api_token=token,
            owner=owner,
            name=run_name,
            spec=parsed.model_dump(mode="json"),
            spec_version=parsed.version,
            model_id=parsed.model.id[:256],
            gpu_name=gpu_type,
            gpu_count=parsed.resources.gpu_count,
            backends=backend_labels(parsed),
            progress_total=parsed.total_measurements(),
            fingerprint=found.fingerprint,
            config_fingerprint=found.configuration_fingerprint,
            is_public=is_public,
        )
        transaction.on_commit(lambda: enqueue_dispatch(run.pk), robust=True)
    log.info("run %s created by %s: %s", run.short_id, owner, run.name)
    return run

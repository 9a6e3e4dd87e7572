"""What this portal lets a user's spec ask of a runner, beyond what a spec may say at all.

``runners.spec`` decides what a valid spec is anywhere; this module adds the deployment's
rules, from settings an admin sets (``portal/settings.py``):

- ``model.trust_remote_code`` runs Python code from the model's repository on the runner:
  only for users holding the permission ``accounts.trust_remote_code`` (403 otherwise).
- A local directory as ``model.id`` / ``model.tokenizer`` only under
  SERVEBENCH_MODEL_ROOTS, a ``workload.dataset_path`` only under SERVEBENCH_DATASET_ROOTS:
  a runner reads whatever it is pointed at (``/`` as a model would hash the whole host).
- ``resources.image`` only the deployment's runner image or one listed in
  SERVEBENCH_ALLOWED_RUNNER_IMAGES (``check_image``): the runner Pod gets the HF token and
  the shared model cache.
- ``resources.gpu_type`` one of SERVEBENCH_GPU_TYPES (the cluster's node label values).
- ``resources.node_selector`` keys among SERVEBENCH_K8S_ALLOWED_NODE_SELECTOR_KEYS, and
  never one the admin's SERVEBENCH_K8S_NODE_SELECTOR sets (the admin's placement wins).
- ``resources.queue`` (Kueue), ``resources.priority_class`` and ``resources.gpu_resource``
  among the values the admin allows (``placement_errors``); the Job builder
  (``portal.dispatch.kubejob``) picks each one with the same ``admin_choice``.
- An endpoint backend's ``base_url`` host among SERVEBENCH_ENDPOINT_HOSTS (a runner sends
  load, and maybe a key, there); its ``api_key`` only from a variable in
  SERVEBENCH_ENDPOINT_KEY_ENVS (local executor) or a Secret in
  SERVEBENCH_ENDPOINT_KEY_SECRETS (Kubernetes): a spec must never send another credential
  (the HF token, a run token) to a host, so a variable holding one of the portal's or the
  runner's own credentials (``runners.credentials``) is refused whatever the list says. A
  LoRA adapter's local path under SERVEBENCH_MODEL_ROOTS.

``check_image(spec)`` then ``check(spec, user)`` raise ``runners.spec.SpecError`` (400) or
``SpecForbidden`` (403), each naming the field (without the ``spec.`` prefix the API adds)
and what to do next.
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any

from django.conf import settings

from portal.accounts.models import TRUST_REMOTE_CODE
from runners import credentials
from runners import spec as rs

# A Hugging Face hub id: 'name' or 'org/name' (what is not one is a path).
_HUB_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._\-]*(/[A-Za-z0-9][A-Za-z0-9._\-]*)?\Z")


class SpecForbidden(rs.SpecError):
    """The spec is valid but asks for something this user may not do (HTTP 403)."""


def _error(field: str, message: str) -> rs.SpecError:
    return rs.SpecError([{"field": field, "message": message}])


def is_local_path(value: str) -> bool:
    """Whether a model id names a directory rather than a hub repository.

    Absolute and ./ ~/ paths are paths; so is anything a hub id cannot be. 'org/name' is a
    hub id (a runner also tries it as a relative directory, but its working directory is
    a fresh, empty one).
    """
    return value.startswith(("/", ".", "~")) or not _HUB_ID.match(value)


def _under(path: str, roots: list[str]) -> bool:
    """``path`` (absolute, normalised) lies in one of ``roots``, also after resolving
    symbolic links where the path exists on this machine (the local executor's)."""
    candidates = {posixpath.normpath(path)}
    if os.path.exists(path):
        candidates.add(os.path.realpath(path))
    allowed = []
    for root in roots:
        if not root.startswith("/"):
            continue
        allowed.append(posixpath.normpath(root))
        if os.path.exists(root):
            allowed.append(os.path.realpath(root))
    return bool(allowed) and all(
        any(c == r or c.startswith(r.rstrip("/") + "/") for r in allowed) for c in candidates
    )


def _check_path(field: str, value: str, roots: list[str], what: str, setting: str) -> None:
    if not value.startswith("/"):
        raise _error(
            field,
            f"{what} {value!r} is neither a hub id (org/name) nor an absolute path; "
            + (f"use an absolute path under {', '.join(roots)}" if roots else "use a hub id"),
        )
    if not roots:
        raise _error(
            field,
            f"{what} {value!r} is a local path, and this portal allows none ({setting} is "
            "empty); use a hub id, or ask an admin to set " + setting,
        )
    if not _under(value, roots):
        raise _error(
            field,
            f"{what} {value!r} is not under the directories this portal allows "
            f"({', '.join(roots)}; {setting}); move it there or use a hub id",
        )


def image_allowed(image: str) -> bool:
    """May a spec name this runner image? The runner Pod gets the HF token and the shared
    model cache, so only the deployment's runner image and the images an admin listed in
    SERVEBENCH_ALLOWED_RUNNER_IMAGES (exact, or a prefix ending in '*') are accepted."""
    allowed = [settings.SERVEBENCH_K8S_RUNNER_IMAGE, *settings.SERVEBENCH_ALLOWED_RUNNER_IMAGES]
    return any(
        image.startswith(entry[:-1]) if entry.endswith("*") else image == entry
        for entry in allowed
        if entry
    )


SEPARATE, SAME_POD = "separate", "same-pod"


def server_placement(spec: dict[str, Any], setting: str) -> tuple[str, str]:
    """Where a run's vLLM servers go on Kubernetes: (``separate`` or ``same-pod``, why).
    Separate where the setting (SERVEBENCH_K8S_SERVER_PLACEMENT) asks for it and every
    model the runner loads is a vLLM server's. An HF baseline or ``transformers serve``
    runs inside the runner, so such a run keeps its GPUs, and its servers, in the
    runner's Pod; a run of endpoints only starts no server at all."""
    if setting != SEPARATE:
        return SAME_POD, f"SERVEBENCH_K8S_SERVER_PLACEMENT={setting}"
    kinds = {str(b.get("kind")) for b in spec.get("backends") or [] if isinstance(b, dict)}
    if "vllm" not in kinds:
        return SAME_POD, "no vLLM server to start"
    inside = sorted(kinds - {"vllm", "endpoint"})
    if inside:
        return SAME_POD, f"{', '.join(inside)} runs inside the runner, on its GPUs"
    return SEPARATE, "each vLLM server in a Pod of its own, with the GPUs"


def client_pods(spec: dict[str, Any], setting: str) -> bool:
    """Does each load generator of a point with ``workload.clients`` above one (or
    ``auto``) run in a Pod of its own on Kubernetes? Where servers may run apart (the
    setting) and no model runs inside the runner: then the runner needs no core of its
    own for the load and may create Pods (its Role). Otherwise the clients share the
    runner's cores, as on one machine."""
    clients = (spec.get("workload") or {}).get("clients", 1)
    if setting != SEPARATE or clients in (None, 1):
        return False
    kinds = {str(b.get("kind")) for b in spec.get("backends") or [] if isinstance(b, dict)}
    return bool(kinds) and kinds <= {"vllm", "endpoint"}


def check_image(spec: rs.Spec) -> None:
    """SpecError naming resources.image when the spec picks an image not allowed here, or
    ``backends.N.image`` when a vLLM server's own image is not allowed, or cannot run here
    (it needs the Kubernetes executor with that server in a Pod of its own)."""
    image = spec.resources.image
    if image and not image_allowed(image):
        raise _error(
            "resources.image",
            f"image {image!r} is not allowed on this portal; leave it out to use the default "
            "runner image, or ask an admin to add it to SERVEBENCH_ALLOWED_RUNNER_IMAGES",
        )
    for i, backend in enumerate(spec.backends):
        if not isinstance(backend, rs.VLLMBackend) or not backend.image:
            continue
        field, who = f"backends.{i}.image", f"backend {backend.name!r}"
        if not image_allowed(backend.image):
            raise _error(
                field,
                f"{who}: image {backend.image!r} is not allowed on this portal; ask an admin "
                "to add it to SERVEBENCH_ALLOWED_RUNNER_IMAGES, or remove image to use the "
                "runner image",
            )
        if settings.SERVEBENCH_EXECUTOR != "kubernetes":
            raise _error(
                field,
                f"{who} names an image, which only a server in a Pod of its own can run; "
                "this portal runs benchmarks as local processes (SERVEBENCH_EXECUTOR="
                f"{settings.SERVEBENCH_EXECUTOR}): remove image, or submit to a portal "
                "with the Kubernetes executor",
            )
        where, why = server_placement(
            spec.model_dump(mode="json"), settings.SERVEBENCH_K8S_SERVER_PLACEMENT
        )
        if where != SEPARATE:
            raise _error(
                field,
                f"{who} names an image, which only a server in a Pod of its own can run, "
                f"but this run keeps its servers in the runner's Pod ({why}): remove image, "
                "or the backends that run inside the runner",
            )


def check(spec: rs.Spec, user: Any) -> None:
    """Raise SpecForbidden / SpecError when ``user`` may not submit ``spec`` here, with
    every field's problem at once (one per field): SpecForbidden (403) when any of them
    is a permission, SpecError (400) otherwise."""
    forbidden: list[dict[str, str]] = []
    errors: list[dict[str, str]] = []

    def attempt(rule: Any, *args: Any) -> None:
        try:
            rule(*args)
        except SpecForbidden as exc:
            forbidden.extend(exc.errors)
        except rs.SpecError as exc:
            errors.extend(exc.errors)

    attempt(_check_permissions, spec, user)
    roots = list(settings.SERVEBENCH_MODEL_ROOTS)
    for field in ("id", "tokenizer"):
        value = getattr(spec.model, field)
        if value and is_local_path(value):
            attempt(
                _check_path,
                f"model.{field}",
                value,
                roots,
                "a local model directory",
                "SERVEBENCH_MODEL_ROOTS",
            )
    for field, path in spec.data_files():  # prompts, trace, sessions, eval file
        attempt(
            _check_path,
            field,
            path,
            list(settings.SERVEBENCH_DATASET_ROOTS),
            "the dataset file",
            "SERVEBENCH_DATASET_ROOTS",
        )
    for i, backend in enumerate(spec.backends):
        if isinstance(backend, rs.VLLMBackend):
            for j, adapter in enumerate(backend.lora_adapters):
                if is_local_path(adapter.path):
                    attempt(
                        _check_path,
                        f"backends.{i}.lora_adapters.{j}.path",
                        adapter.path,
                        roots,
                        "a local LoRA adapter directory",
                        "SERVEBENCH_MODEL_ROOTS",
                    )
        elif isinstance(backend, rs.EndpointBackend):
            attempt(_check_endpoint, i, backend)
    attempt(_check_gpu_type, spec.resources)
    for key in spec.resources.node_selector:
        attempt(_check_node_selector_key, key)
    errors.extend(placement_errors(spec.resources, user))
    if forbidden:
        raise SpecForbidden(forbidden + errors)
    if errors:
        raise rs.SpecError(errors)


def _check_permissions(spec: rs.Spec, user: Any) -> None:
    if spec.model.trust_remote_code and not (
        user is not None and getattr(user, "is_active", False) and user.has_perm(TRUST_REMOTE_CODE)
    ):
        raise SpecForbidden(
            [
                {
                    "field": "model.trust_remote_code",
                    "message": (
                        "model.trust_remote_code runs the model repository's own Python code "
                        "on the runner; your account may not (an admin grants the permission "
                        f"{TRUST_REMOTE_CODE!r}). Remove it, or pick a model transformers "
                        "supports natively"
                    ),
                }
            ]
        )


def _split_host_entry(entry: str) -> tuple[str, str | None]:
    """'host', '*.domain', '[::1]', each with an optional ':port' -> (host, port)."""
    if entry.startswith("["):
        host, _, rest = entry.partition("]")
        return host + "]", rest[1:] if rest.startswith(":") else None
    host, colon, port = entry.rpartition(":")
    return (host, port) if colon else (entry, None)


def host_allowed(host: str, port: str, allowed: list[str]) -> bool:
    """Whether ``host``:``port`` matches an entry of SERVEBENCH_ENDPOINT_HOSTS: the exact
    name or address, or '*.domain' for names under the domain; a ':port' limits it."""
    host = host.lower()
    for entry in allowed:
        want, want_port = _split_host_entry(entry.lower())
        if want_port is not None and want_port != port:
            continue
        if want.startswith("*."):
            if host.endswith(want[1:]) and len(host) > len(want) - 1:
                return True
        elif host == want:
            return True
    return False


def _check_endpoint(i: int, backend: rs.EndpointBackend) -> None:
    parts = rs.endpoint_url_parts(backend.base_url)
    assert parts is not None  # the spec validated it
    allowed = list(settings.SERVEBENCH_ENDPOINT_HOSTS)
    if not host_allowed(parts["host"], parts["port"], allowed):
        hosts = ", ".join(allowed) if allowed else "none"
        raise _error(
            f"backends.{i}.base_url",
            f"endpoint host {parts['host']!r} (port {parts['port']}) is not one endpoint "
            f"backends may reach on this portal (allowed: {hosts}; SERVEBENCH_ENDPOINT_HOSTS); "
            "ask an admin to add it",
        )
    key = backend.api_key
    if key is None:
        return
    kubernetes = settings.SERVEBENCH_EXECUTOR == "kubernetes"
    if key.env is not None:
        refusal = credentials.refusal(key.env)
        if refusal is not None:
            raise _error(f"backends.{i}.api_key.env", refusal)
        if kubernetes:
            raise _error(
                f"backends.{i}.api_key.env",
                "runners here are Kubernetes Jobs, which get an endpoint's key from a Secret: "
                "use api_key.secret (and api_key.key) instead of api_key.env",
            )
        names = list(settings.SERVEBENCH_ENDPOINT_KEY_ENVS)
        if key.env not in names:
            raise _error(
                f"backends.{i}.api_key.env",
                f"{key.env!r} is not a variable endpoint keys may come from here (allowed: "
                f"{', '.join(names) or 'none'}; SERVEBENCH_ENDPOINT_KEY_ENVS); ask an admin",
            )
    else:
        if not kubernetes:
            raise _error(
                f"backends.{i}.api_key.secret",
                "runners here are local processes without Kubernetes Secrets: use api_key.env "
                "(a variable an admin listed in SERVEBENCH_ENDPOINT_KEY_ENVS)",
            )
        names = list(settings.SERVEBENCH_ENDPOINT_KEY_SECRETS)
        if key.secret not in names:
            raise _error(
                f"backends.{i}.api_key.secret",
                f"Secret {key.secret!r} is not one endpoint keys may come from here (allowed: "
                f"{', '.join(names) or 'none'}; SERVEBENCH_ENDPOINT_KEY_SECRETS); ask an admin",
            )


def _check_gpu_type(resources: rs.Resources) -> None:
    types = list(settings.SERVEBENCH_GPU_TYPES)
    if resources.gpu_type is not None and resources.gpu_type not in types:
        known = (
            f"one of: {', '.join(types)}"
            if types
            else "left out: this portal lists no GPU types (SERVEBENCH_GPU_TYPES)"
        )
        raise _error(
            "resources.gpu_type",
            f"GPU type {resources.gpu_type!r} is not one this portal schedules on; it must be "
            f"{known}",
        )
    admin = dict(settings.SERVEBENCH_K8S_NODE_SELECTOR)
    gpu_label = settings.SERVEBENCH_K8S_GPU_TYPE_LABEL
    if resources.gpu_type is not None and admin.get(gpu_label, resources.gpu_type) != (
        resources.gpu_type
    ):
        raise _error(
            "resources.gpu_type",
            f"runners here are placed on {gpu_label}={admin[gpu_label]} "
            "(SERVEBENCH_K8S_NODE_SELECTOR); leave gpu_type out or use that type",
        )


def _check_node_selector_key(key: str) -> None:
    allowed = set(settings.SERVEBENCH_K8S_ALLOWED_NODE_SELECTOR_KEYS)
    admin = dict(settings.SERVEBENCH_K8S_NODE_SELECTOR)
    gpu_label = settings.SERVEBENCH_K8S_GPU_TYPE_LABEL
    where = f"resources.node_selector.{key}"
    if key in admin or key == gpu_label:
        raise _error(
            where,
            f"node label {key!r} is set by this portal's placement "
            + ("(resources.gpu_type sets the GPU label)" if key == gpu_label else "")
            + "; leave it out",
        )
    if key not in allowed:
        keys = ", ".join(sorted(allowed)) or "none"
        raise _error(
            where,
            f"node label {key!r} is not one a spec may select on here (allowed: {keys}; "
            "SERVEBENCH_K8S_ALLOWED_NODE_SELECTOR_KEYS)",
        )


def form_choices() -> dict[str, list[str]]:
    """What the submission form shows: the GPU types and node label keys allowed here."""
    return {
        "gpu_types": list(settings.SERVEBENCH_GPU_TYPES),
        "node_selector_keys": sorted(settings.SERVEBENCH_K8S_ALLOWED_NODE_SELECTOR_KEYS),
    }


# --------------------------------------------------------------------------- placement
# What a spec may choose of its Job's cluster placement (issue 28): the Kueue queue, the
# PriorityClass and the GPU's extended resource name. The admin sets a default, may allow
# more (a spec then picks one), and may pin a user's queue (SERVEBENCH_K8S_KUEUE_USER_QUEUES).


def admin_choice(asked: str | None, default: str, allowed: list[str], pinned: str = "") -> str:
    """The value a run gets: ``pinned`` when the admin pinned one; else what the spec
    ``asked`` for when it is the ``default`` or ``allowed``; else the ``default`` ("" =
    none). Submission refuses a spec whose ask this overrides (``placement_errors``); the
    Job builder calls it too, so runs stored before a setting changed follow the admin."""
    if pinned:
        return pinned
    if asked and (asked == default or asked in allowed):
        return asked
    return default


def user_queue(user: Any) -> str:
    """The Kueue queue the admin pinned for ``user`` (SERVEBENCH_K8S_KUEUE_USER_QUEUES)."""
    name = getattr(user, "username", "") or ""
    return dict(settings.SERVEBENCH_K8S_KUEUE_USER_QUEUES).get(name, "")


def _placement_refusal(
    field: str, asked: str, default: str, allowed: list[str], pinned: str, what: str, names: str
) -> dict[str, str] | None:
    if admin_choice(asked, default, allowed, pinned) == asked:
        return None
    if pinned:
        message = (
            f"your runs go to the {what} {pinned!r} here ({names}); leave {field} out or "
            "name that one"
        )
    else:
        choices = [v for v in [default, *allowed] if v]
        listed = ", ".join(dict.fromkeys(choices)) or "none"
        message = f"{what} {asked!r} is not one a spec may choose here (allowed: {listed}; {names})"
        if not choices:
            message += f"; leave {field} out"
    return {"field": field, "message": message}


def placement_errors(resources: rs.Resources, user: Any) -> list[dict[str, str]]:
    """One error per placement field the spec sets to a value the admin does not allow,
    each naming the field, the allowed values and the settings that allow them."""
    s = settings
    checks = [
        (
            "resources.queue",
            resources.queue,
            s.SERVEBENCH_K8S_KUEUE_QUEUE,
            list(s.SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES),
            user_queue(user),
            "Kueue queue",
            "SERVEBENCH_K8S_KUEUE_QUEUE, SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES"
            + (", SERVEBENCH_K8S_KUEUE_USER_QUEUES" if user_queue(user) else ""),
        ),
        (
            "resources.priority_class",
            resources.priority_class,
            s.SERVEBENCH_K8S_PRIORITY_CLASS,
            list(s.SERVEBENCH_K8S_ALLOWED_PRIORITY_CLASSES),
            "",
            "PriorityClass",
            "SERVEBENCH_K8S_PRIORITY_CLASS, SERVEBENCH_K8S_ALLOWED_PRIORITY_CLASSES",
        ),
        (
            "resources.gpu_resource",
            resources.gpu_resource,
            s.SERVEBENCH_K8S_GPU_RESOURCE,
            list(s.SERVEBENCH_K8S_ALLOWED_GPU_RESOURCES),
            "",
            "GPU resource",
            "SERVEBENCH_K8S_GPU_RESOURCE, SERVEBENCH_K8S_ALLOWED_GPU_RESOURCES",
        ),
    ]
    errors = []
    for field, asked, default, allowed, pinned, what, names in checks:
        if asked is not None:
            refusal = _placement_refusal(field, asked, default, allowed, pinned, what, names)
            if refusal is not None:
                errors.append(refusal)
    return errors

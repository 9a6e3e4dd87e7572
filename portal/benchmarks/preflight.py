"""Can this portal's executor give a spec what it asks for? Checked before anything runs.

``runners.spec`` says what a valid spec is anywhere and ``policy`` what a user may ask of
this deployment; this module says what its executor can actually provide, so a run that
is bound to fail (or to measure something else than asked) is refused or warned about at
submission instead of minutes later. The API (``intake.spec_from_request``) and the
form (``portal.web.forms``) both call ``check``.

Refused (SpecError, HTTP 400 naming the field; every refusal at once):

- ``resources.gpu_count`` above the GPUs the local executor's machine has
  (SERVEBENCH_LOCAL_GPUS, by default the GPUs seen here as CUDA_VISIBLE_DEVICES scopes
  them: ``local_gpus``): on a machine without a GPU the runner would silently measure
  the CPU instead. ``gpu_count: 0`` runs on the CPU on purpose (the tiny demo preset
  does).
- a local model directory or dataset file that does not exist on this machine (local
  executor: the runner runs here, so the run could only fail when it loads them).
- ``resources.gpu_count`` above SERVEBENCH_K8S_MAX_GPUS on Kubernetes (no node has that
  many: the Job would fail at dispatch).

Warned about (returned with the created run; the form shows them before it is submitted):

- a hub model or tokenizer that is not in this machine's Hugging Face cache while hub
  downloads are off (HF_HUB_OFFLINE=1), on the local executor: the runner would fail when
  it loads the model. A warning, not a refusal: the worker's cache may differ from the web
  server's, and a model can be put there before the run starts.

Field names are spec paths without the ``spec.`` prefix the API adds (``resources.gpu_count``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from portal.benchmarks import policy
from runners import gpu_scope, nvml
from runners import spec as rs

_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Finding:
    """One thing the executor cannot give: ``blocking`` ones refuse the spec."""

    field: str
    message: str
    blocking: bool

    def as_error(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


# --------------------------------------------------------------------------- this machine


def local_gpus(lib: Any = None) -> int:
    """GPUs a local runner gets: SERVEBENCH_LOCAL_GPUS, else its slot's share of the
    devices this machine's GPUs give a process under its CUDA_VISIBLE_DEVICES, by CUDA's
    rules (``runners.gpu_scope``: what a run's environment records and its telemetry
    reads; ``runners.placement``: each of SERVEBENCH_LOCAL_SLOTS slots gets the same
    number of GPUs, none shared). The machine's GPUs are NVML's (``lib``, default
    pynvml), else the NVIDIA device files in /dev (``nvidia0``, ``nvidia1``...; known by
    index only, so a ``GPU-`` UUID names none of them)."""
    if settings.SERVEBENCH_LOCAL_GPUS is not None:
        return int(settings.SERVEBENCH_LOCAL_GPUS)
    return visible_gpus(lib) // max(settings.SERVEBENCH_LOCAL_SLOTS, 1)


def visible_gpus(lib: Any = None) -> int:
    """Every device the local executor's slots share out (``local_gpus``' machine)."""
    host = nvml.read_host_gpus(lib)
    if host is None:
        count = sum(1 for p in Path("/dev").glob("nvidia*") if p.name[6:].isdigit())
        host = [gpu_scope.HostGPU(i, "") for i in range(count)]
    return len(gpu_scope.scope(os.environ.get("CUDA_VISIBLE_DEVICES"), host).devices)


def hub_offline() -> bool:
    """Whether runners here may not download from the Hugging Face hub."""
    return any(
        os.environ.get(name, "").strip().lower() in _TRUE
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_cache() -> Path:
    """The Hugging Face hub cache directory, resolved as huggingface_hub does."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def in_hub_cache(repo_id: str, revision: str | None = None, file: str = "config.json") -> bool:
    """Whether the cache holds a snapshot of ``repo_id`` (at ``revision``: a branch, tag or
    commit; default: any) that contains ``file``."""
    repo = hub_cache() / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if revision:
        ref = repo / "refs" / revision
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else revision
        return (snapshots / commit / file).exists()
    return snapshots.is_dir() and any((snap / file).exists() for snap in snapshots.iterdir())


# --------------------------------------------------------------------------- the checks


def _gpus(spec: rs.Spec) -> list[Finding]:
    asked = spec.resources.gpu_count
    if asked < 1 or not spec.loads_model:
        return []
    if settings.SERVEBENCH_EXECUTOR == "kubernetes":
        most = settings.SERVEBENCH_K8S_MAX_GPUS
        if most and asked > most:
            return [
                Finding(
                    "resources.gpu_count",
                    f"asks for {asked} GPUs, but runner Jobs here may ask for at most {most} "
                    "(SERVEBENCH_K8S_MAX_GPUS, the largest node's count); lower gpu_count "
                    "(and tensor_parallel_size with it)",
                    True,
                )
            ]
        return []
    have = local_gpus()
    if asked <= have:
        return []
    slots = settings.SERVEBENCH_LOCAL_SLOTS
    shared = visible_gpus() if have == 0 and slots > 1 else 0
    if shared and settings.SERVEBENCH_LOCAL_GPUS is None:
        message = (
            f"asks for {asked} GPU{'s' * (asked != 1)}, but this portal's machine has "
            f"{shared} for {slots} concurrent runs (SERVEBENCH_LOCAL_SLOTS): two "
            "runs would share a GPU. The administrator sets SERVEBENCH_LOCAL_SLOTS to at "
            "most the number of GPUs"
        )
    elif have == 0:
        message = (
            f"asks for {asked} GPU{'s' * (asked != 1)}, but this portal runs benchmarks on its "
            "own machine (the local executor), which has none: the run would measure the CPU "
            "instead. Set resources.gpu_count: 0 to benchmark on the CPU (the tiny demo "
            "preset does), or submit to a portal with GPUs"
        )
    else:
        per_run = f" per run ({slots} runs at once divide its GPUs)" if slots > 1 else ""
        message = (
            f"asks for {asked} GPUs, but this portal's machine (the local executor) has "
            f"{have}{per_run}; ask for at most {have}"
        )
    return [Finding("resources.gpu_count", message, True)]


def _hub(spec: rs.Spec) -> list[Finding]:
    if settings.SERVEBENCH_EXECUTOR != "local" or not spec.loads_model or not hub_offline():
        return []
    out = []
    model = spec.model
    wanted = [("model.id", model.id, model.revision, "config.json")]
    if model.tokenizer:
        wanted.append(("model.tokenizer", model.tokenizer, None, "tokenizer_config.json"))
    for field, repo, revision, file in wanted:
        if policy.is_local_path(repo) or in_hub_cache(repo, revision, file):
            continue
        at = f" at revision {revision!r}" if revision else ""
        out.append(
            Finding(
                field,
                f"{repo!r}{at} is not in this machine's Hugging Face cache ({hub_cache()}) and "
                "hub downloads are off here (HF_HUB_OFFLINE=1): the run will fail when it "
                f"loads the model. Download it first (huggingface-cli download {repo}) where "
                "the runner runs, or use a local model directory",
                False,
            )
        )
    return out


def _paths(spec: rs.Spec) -> list[Finding]:
    if settings.SERVEBENCH_EXECUTOR != "local":
        return []
    out = []
    model = spec.model
    for field, value in (("model.id", model.id), ("model.tokenizer", model.tokenizer)):
        if value and value.startswith("/") and spec.loads_model and not Path(value).is_dir():
            out.append(
                Finding(
                    field,
                    f"there is no directory {value!r} on this machine, where the run would "
                    "load it; check the path (or put the model there first)",
                    True,
                )
            )
    for field, path in spec.data_files():
        if path.startswith("/") and not Path(path).is_file():
            out.append(
                Finding(
                    field,
                    f"there is no file {path!r} on this machine, where the run would read "
                    "it; check the path (or put the file there first)",
                    True,
                )
            )
    return out


def findings(spec: rs.Spec) -> list[Finding]:
    """Every refusal and warning for ``spec`` on this portal's executor, in field order."""
    return [*_gpus(spec), *_hub(spec), *_paths(spec)]


def check(spec: rs.Spec) -> list[dict[str, str]]:
    """Raise SpecError listing every refusal; return the warnings ({field, message})."""
    found = findings(spec)
    errors = [f.as_error() for f in found if f.blocking]
    if errors:
        raise rs.SpecError(errors)
    return [f.as_error() for f in found if not f.blocking]

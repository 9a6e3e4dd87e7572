"""Turn stored runs, measurements and environments into what the pages display."""

from __future__ import annotations

import re
import shlex
from typing import Any

from portal.benchmarks import commands
from portal.benchmarks import points as pts
from portal.benchmarks.models import Measurement, Run
from portal.benchmarks.points import PointStats, RunResults
from portal.benchmarks.policy import image_allowed
from portal.benchmarks.runview import LoadedRun
from runners import envfacts
from runners import spec as rs
from servebench import verdict


def summary(results: RunResults) -> dict[str, Any]:
    """Headline numbers: best vLLM output tok/s (where, and its p99 TTFT), the reference
    (``results.reference_name``: an HF baseline by default, or the reader's choice, which
    a vLLM configuration may be: then compared at the best point), and their ratio."""
    points = results.points
    out: dict[str, Any] = {
        "points": len(points),
        "failed": sum(p.failed for p in points),
    }
    name = results.reference_name
    vllm = [
        p
        for p in points
        if p.backend_kind == "vllm"
        and p.get("output_throughput") is not None
        and p.backend != name  # never "1.0x itself"
    ]
    if vllm:
        best = max(vllm, key=lambda p: p.get("output_throughput") or 0.0)
        out["best"] = {
            "output_throughput": best.get("output_throughput"),
            "where": best.short,
            "backend": best.backend,
            "p99_ttft_ms": best.get("p99_ttft_ms"),
            "point": best,
        }
    base = results.reference_at(out["best"]["point"]) if "best" in out else results.reference
    out["reference"] = name  # what every speedup on this page is over
    out["reference_kind"] = dict(results.reference_choices()).get(name or "", "")
    out["reference_is_baseline"] = results.reference_is_baseline
    out["reference_choices"] = results.reference_choices()
    if base is not None and base.get("output_throughput"):
        out["hf_output_throughput"] = base.get("output_throughput")
        out["reference_where"] = "" if results.reference_is_baseline else base.short
    if "best" in out and out.get("hf_output_throughput"):
        out["speedup"] = out["best"]["output_throughput"] / out["hf_output_throughput"]
    if "best" in out:  # "vLLM at c=64: 41x hf-sequential, 3.2x hf-batched"
        out["speedups"] = results.speedups(out["best"]["point"])
    out.update(headline_noise(out, vllm, base))
    return out


def headline_noise(
    headline: dict[str, Any], vllm: list[PointStats], base: PointStats | None
) -> dict[str, Any]:
    """How well the headline numbers are known: each one's 95% interval (over repeats, or
    request-level for one repeat), the speedup's range, and plain warnings where the sample
    is too small to trust a difference of the size the page shows (wider than the
    threshold a CI gate judges changes by)."""
    out: dict[str, Any] = {"noise_warnings": []}
    warn = out["noise_warnings"].append
    limit = verdict.DEFAULT_THRESHOLD
    best = headline.get("best")
    best_noise = best["point"].uncertainty("output_throughput") if best else None
    hf_noise = base.uncertainty("output_throughput") if base is not None else None
    if best:
        best["noise"] = best_noise
        best["ttft_noise"] = best["point"].uncertainty("p99_ttft_ms")
    out["hf_noise"] = hf_noise
    rough, remedies = [], []
    for label, found, point in (
        ("the best output tok/s", best_noise, best["point"] if best else None),
        (f"the {base.backend} baseline's output tok/s" if base else "", hf_noise, base),
    ):
        if point is None:
            continue
        if found is None:
            warn(
                f"{label[:1].upper()}{label[1:]} was measured once without per-request "
                "samples: its noise is unknown."
            )
        elif found.relative > limit:
            rough.append(f"{label} {found.describe()}")
            remedy = "num_prompts" if found.request_level else "repeats"
            remedies += [remedy] if remedy not in remedies else []
    if rough:
        warn(
            f"Known only roughly: {'; '.join(rough)}. A difference smaller than that, between "
            f"points, backends or runs, cannot be trusted; raise {' or '.join(remedies)} "
            "to narrow it."
        )
    if best_noise and hf_noise and hf_noise.low > 0:
        low, high = best_noise.low / hf_noise.high, best_noise.high / hf_noise.low
        out["speedup_range"] = (low, high)
        if high / low > (1 + limit) ** 2:
            warn(
                f"The speedup over {base.backend} could be anywhere from "
                f"{low:.1f}x to "
                f"{high:.1f}x (the 95% intervals of both throughputs)."
            )
    if best and best_noise:
        rivals = [
            p.short
            for p in vllm
            if p is not best["point"]
            and p.backend == best["backend"]
            and best_noise.low <= (p.get("output_throughput") or 0.0)
        ]
        if rivals:
            warn(
                f"The best point ({best['where']}) is not distinguishable from "
                f"{', '.join(rivals[:3])}: their output tok/s lie within its 95% interval."
            )
    if (best_noise and best_noise.request_level) or (hf_noise and hf_noise.request_level):
        out["one_repeat"] = True
    return out


def slo_text(slo: dict[str, float]) -> str:
    """{'ttft_ms': 600} -> 'TTFT ≤ 600 ms' (the SLO as the pages and charts say it)."""
    return ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in slo.items())


def contention(run: Run, results: RunResults, headline: dict[str, Any]) -> dict[str, Any]:
    """Measurements the runner took while something else competed for their cores
    (``conditions.contended``, with its reasons; one query), and which sides of the
    headline speedup rest on one. Numbers measured so are shown with a warning, never
    as if they were clean."""
    rows = (
        Measurement.objects.filter(run=run, conditions__contended=True)
        .order_by("backend", "sweep", "value", "repeat")
        .values_list("backend", "backend_kind", "point_key", "repeat", "conditions")
    )
    points = [
        {
            "backend": backend,
            "hf": kind in pts.BASELINE_KINDS,
            "point_key": point_key,
            "repeat": repeat,
            # Runner-supplied text, scrubbed of credentials when it was stored.
            "reasons": [str(r) for r in (cond or {}).get("reasons") or []],
        }
        for backend, kind, point_key, repeat, cond in rows
    ]
    flagged = {(p["backend"], p["point_key"]) for p in points}
    best = (headline.get("best") or {}).get("point")
    base = results.reference_at(best) if best is not None else results.reference
    return {
        "points": points,
        "hf": base is not None and (base.backend, base.point_key) in flagged,
        "best": best is not None and (best.backend, best.point_key) in flagged,
    }


# Facts about the model as the runner loads it: of an endpoint-only run they would describe
# nothing that ran (the endpoint's server chose its own dtype, revision and length).
_LOADED_MODEL_FACTS = {
    "model.revision",
    "model.revision_source",
    "benchmark.dtype",
    "benchmark.max_model_len",
}
# Relabelled for an endpoint-only run: the runner's machine ran only the bench client.
_RUNNER_LABELS = {
    "software.vllm": "vLLM (the runner's bench client)",
    "gpu.model": "GPU (the runner's machine)",
    "gpu.count": "GPU count (the runner's machine)",
}


def environment_facts(
    snapshot: dict[str, Any], spec: rs.Spec | None = None
) -> list[tuple[str, str]]:
    """(label, value) rows of the facts a reader checks first; the rest is in the JSON.
    For a run that only measured deployed endpoints these are the runner's machine's: the
    model-loading facts are left out and the software says whose it is (the endpoints'
    own facts are in their section)."""
    if spec is None or spec.loads_model:
        return envfacts.facts(snapshot, envfacts.SHOWN)
    shown = tuple(f for f in envfacts.SHOWN if f.path not in _LOADED_MODEL_FACTS)
    labels = {f.label: _RUNNER_LABELS.get(f.path, f.label) for f in shown}
    return [(labels[label], value) for label, value in envfacts.facts(snapshot, shown)]


def environment_note(spec: rs.Spec | None) -> str:
    """What the environment section describes when the run measured endpoints."""
    if spec is None or not spec.endpoint_backends:
        return ""
    if not spec.loads_model:
        return (
            "The machine the runner measured from, not the endpoint's: the endpoint reports "
            "its own engine and version under Endpoints; its GPU, dtype and model revision "
            "are not known here."
        )
    return (
        "The runner's machine, where its own backends ran; each endpoint reports its own "
        "engine and version under Endpoints."
    )


_ABSENT = {"", "none", "unknown"}
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _known(value: Any) -> str:
    text = "" if value is None else str(value)
    return "" if text.strip().lower() in _ABSENT else text


def reproduce_commands(view: LoadedRun, snapshot: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything needed to run it again: the runner command for the whole spec (and in
    the image it ran in), per point the exact vLLM commands, the HF baseline command, the
    image and digest, and the package list. One query (the commands of repeat 0)."""
    snapshot = snapshot or {}
    per_point: dict[str, dict[str, str]] = {}
    hf: dict[str, str] = {}
    replaced: list[str] = []
    run, spec = view.run, view.spec
    if spec is None:
        raise rs.SpecError([{"field": "spec", "message": "the stored spec no longer parses"}])
    rows = (
        Measurement.objects.filter(run=run, repeat=0)
        .order_by("backend", "sweep", "value")
        .values_list("backend", "backend_kind", "point_key", "commands")
    )
    for backend, kind, point_key, reported in rows:
        # Shown under Copy buttons: the runner's command only where it is the one the
        # spec implies (portal.benchmarks.commands), else the implied one.
        found = commands.shown(spec, backend, point_key, reported or {})
        if not found["commands"]:
            continue
        replaced += [f"{backend} {point_key} ({k})" for k in found["replaced"]]
        if kind in pts.BASELINE_KINDS:
            hf[backend] = found["commands"].get("hf", "")
        else:
            per_point[f"{backend} {point_key}"] = found["commands"]
    spec_file = f"servebench-{run.short_id}-spec.yaml"
    runner = f"python -m runners run {spec_file} --out result.json"
    image = _known(envfacts.lookup(snapshot, "container.image"))
    digest = _known(envfacts.lookup(snapshot, "container.image_digest"))
    container = ""
    if digest and not _DIGEST.fullmatch(digest):
        digest = ""
    # A runner-reported image goes under a Copy button only when this portal allows it.
    if image and image_allowed(image.split("@")[0]):
        ref = f"{image.split('@')[0]}@{digest}" if digest else image
        # The runner image's ENTRYPOINT is `python -m runners`; --init reaps vLLM's engine
        # processes. The reference is runner-reported text: quoted, since people paste it.
        container = (
            'docker run --rm --init --gpus all -v "$PWD:/work" -w /work '
            f"{shlex.quote(ref)} run {spec_file} --out result.json"
        )
    packages = envfacts.lookup(snapshot, "packages")
    package_list = (
        "\n".join(f"{name}=={version}" for name, version in sorted(packages.items()))
        if isinstance(packages, dict)
        else ""
    )
    return {
        "runner": runner,
        "container": container,
        "image": image,
        "digest": digest,
        "points": per_point,
        "hf": hf,
        "packages": package_list,
        "replaced": replaced,
        "package_count": len(packages) if isinstance(packages, dict) else 0,
    }

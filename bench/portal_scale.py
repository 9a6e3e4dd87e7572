"""How the portal's pages scale: 10,000 runs and 200,000 measurements.

    python bench/portal_scale.py [--runs 10000] [--measurements 200000] [--repeat 20]

Fills a throwaway database (``test_<your db>_scale``, dropped at the end) with generated
runs of realistic shape (models, GPUs, statuses, sweeps, metrics and per-request JSON),
then times pages in this process through Django's test client against a trivial view
that goes through the same middleware, and counts SQL queries per page. Query counts are
taken twice, at 1% of the data and at all of it: they must not grow with the data.

Target (issue 3): each page within 5x the trivial view; query counts independent of the
number of runs and measurements. This prints; it asserts nothing.

Issue 5 adds the results pages: a compare page of 8 runs x 20 points (at 1%: 2 runs x 5
points) and a history chart over 1,000 runs of one fingerprint (at 1%: 10 runs), through
the web page and the API; the query counts must not grow with the history's length, and
the compare page's chart data (its embedded ``figures-data`` JSON) must stay under 200 kB.

Issue 12 adds what a reader waits for: the run, compare and history pages against the
trivial web view, served warm (finished runs' pages come from ``portal.web.pagecache``,
which is what a reader gets after the first visit) and cold (that cache emptied before
every request: the first visit); and the bytes the run page transfers on a first load
(the HTML and every static file it references, gzip-compressed as served, headers
included) and on a repeat load (a browser refetches the HTML; static files with
``immutable`` and a max-age of a year or more come from its cache without a request,
others are revalidated: a 304). Static files are collected with the production storage
(hashed names, pre-compressed) into a temporary directory first. Goal: each results page
within 5x the trivial view; under 1.5 MB first, under 100 kB repeat. Issue 29: a third
timing, "build", deletes the finished run pages kept in Postgres (``web.StoredPage``)
too, so the run page is built from its measurements (what "cold" measured before pages
were stored); ``--keep`` then ``--reuse`` time a 100,000-run database again without
filling it anew. The pages are timed after ``portal.lib.startup.settle()``, as a served
web process runs them (``portal.wsgi``: the views imported, the startup heap frozen).

Uses DATABASE_URL when set, else the embedded dev PostgreSQL (portal.devservices).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import random
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODELS = [
    "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-8B",
    "meta-llama/Llama-3.1-8B-Instruct",
    "mistralai/Mistral-7B-Instruct-v0.3",
    "google/gemma-3-4b-it",
    "microsoft/Phi-4-mini-instruct",
]
GPUS = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L4", "NVIDIA A10G", "CPU"]
STATUSES = ["succeeded"] * 80 + ["failed"] * 12 + ["cancelled"] * 5 + ["running"] * 2 + ["queued"]
SWEEPS = [
    ("concurrency", "max_concurrency", [1, 2, 4, 8, 16, 32, 64, 128]),
    ("prompt-length", "input_len", [128, 512, 1024, 2048, 4096]),
    ("output-length", "output_len", [32, 128, 512, 1024]),
]


def setup_django() -> None:
    if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
        from portal.devservices import ensure

        os.environ.update(ensure().env())
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
    os.environ.setdefault("SERVEBENCH_PUBLIC_URL", "http://testserver")
    # Static files as production serves them: hashed names, pre-compressed (collected below).
    os.environ["SERVEBENCH_STATIC_MANIFEST"] = "1"
    static_root = tempfile.mkdtemp(prefix="servebench-static-")
    atexit.register(shutil.rmtree, static_root, ignore_errors=True)
    os.environ["SERVEBENCH_STATIC_ROOT"] = static_root
    os.environ.setdefault("SERVEBENCH_LOG_LEVEL", "WARNING")
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("collectstatic", interactive=False, verbosity=0)


def trivial_urlconf() -> str:
    """The portal's URLs plus three trivial views, one per stack a page runs through:

    - /__trivial__: a bare view (middleware only) returning "ok";
    - /__trivial_api__: a DRF view with the API's authentication, one small query, JSON;
    - /__trivial_web__: a session-authenticated view, one small query, a tiny template.
    """
    from django.contrib.auth.decorators import login_required
    from django.http import HttpResponse
    from django.template import engines
    from django.urls import path
    from rest_framework.response import Response
    from rest_framework.views import APIView

    import portal.urls
    from portal.benchmarks.models import Run

    def trivial(request: Any) -> HttpResponse:
        return HttpResponse("ok")

    class TrivialApi(APIView):
        def get(self, request: Any) -> Response:
            return Response({"user": str(request.user), "any": Run.objects.exists()})

    template = engines["django"].from_string("<p>{{ user.username }}: {{ any }}</p>")

    @login_required
    def trivial_web(request: Any) -> HttpResponse:
        return HttpResponse(template.render({"user": request.user, "any": Run.objects.exists()}))

    module = types.ModuleType("bench_portal_scale_urls")
    module.urlpatterns = [
        path("__trivial__", trivial),
        path("__trivial_api__", TrivialApi.as_view()),
        path("__trivial_web__", trivial_web),
        *portal.urls.urlpatterns,
    ]
    sys.modules[module.__name__] = module
    return module.__name__


# --------------------------------------------------------------------------- data


def spec_for(rng: random.Random, model: str, gpu: str) -> dict[str, Any]:
    from runners import spec as rs

    sweeps = [
        {"name": name, "axis": axis, "values": values}
        for name, axis, values in rng.sample(SWEEPS, rng.randint(1, 3))
    ]
    spec = rs.Spec.model_validate(
        {
            "name": f"{model.split('/')[-1]} on {gpu}",
            "model": {"id": model, "max_model_len": 8192},
            "workload": {"input_len": 1024, "output_len": 128, "num_prompts": 256},
            "sweeps": sweeps,
            "backends": [{"kind": "hf-sequential"}, {"kind": "vllm"}],
            "resources": {"gpu_count": 0 if gpu == "CPU" else 1},
        }
    )
    return spec.model_dump(mode="json")


def metrics_for(
    rng: random.Random, concurrency: int, output_len: int, hf: bool
) -> dict[str, float]:
    per_seq = rng.uniform(40, 120) if not hf else rng.uniform(15, 40)
    out_tps = per_seq * (concurrency ** (0.8 if not hf else 0))
    metrics = {
        "duration": 256 * output_len / out_tps,
        "completed": 256.0,
        "failed": 0.0,
        "request_throughput": out_tps / output_len,
        "output_throughput": out_tps,
        "total_token_throughput": out_tps * 9,
    }
    for name, base in (("ttft", 30.0), ("tpot", 1000 / per_seq), ("itl", 1000 / per_seq)):
        mean = base * (1 + concurrency / 32)
        metrics.update(
            {
                f"mean_{name}_ms": mean,
                f"median_{name}_ms": mean * 0.95,
                f"std_{name}_ms": mean * 0.2,
                f"p90_{name}_ms": mean * 1.4,
                f"p99_{name}_ms": mean * 2.1,
            }
        )
    e2el = metrics["mean_ttft_ms"] + metrics["mean_tpot_ms"] * output_len
    metrics.update({"mean_e2el_ms": e2el, "median_e2el_ms": e2el, "p90_e2el_ms": e2el * 1.3})
    metrics["p99_e2el_ms"] = e2el * 1.8
    return metrics


def generate(n_runs: int, n_measurements: int, seed: int = 1) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from portal.benchmarks.intake import backend_labels
    from portal.benchmarks.models import Environment, Measurement, Run, new_public_id
    from portal.benchmarks.queries import refresh_best_throughput
    from runners import spec as rs

    rng = random.Random(seed)
    User = get_user_model()
    users = [User(username=f"user{i}") for i in range(20)]
    for u in users:
        u.set_unusable_password()
    User.objects.bulk_create(users)
    users = list(User.objects.order_by("id"))
    now = timezone.now()
    per_run = n_measurements / n_runs
    specs = {}
    runs = []
    for i in range(n_runs):
        model, gpu = rng.choice(MODELS), rng.choice(GPUS)
        key = (model, gpu, rng.randint(0, 5))
        if key not in specs:
            specs[key] = spec_for(rng, model, gpu)
        spec = specs[key]
        status = rng.choice(STATUSES)
        created = now - timedelta(minutes=i * 25 + rng.randint(0, 20))
        runs.append(
            Run(
                public_id=new_public_id(),
                owner=rng.choice(users),
                name=spec["name"],
                spec=spec,
                spec_version=1,
                status=status,
                failure_reason="vLLM server did not start: CUDA out of memory"
                if status == "failed"
                else "",
                created_at=created,
                updated_at=created,
                dispatched_at=created + timedelta(seconds=2),
                started_at=created + timedelta(seconds=30),
                finished_at=created + timedelta(minutes=40)
                if status in ("succeeded", "failed", "cancelled")
                else None,
                progress_done=int(per_run),
                progress_total=int(per_run),
                executor="kubernetes",
                model_id=spec["model"]["id"],
                gpu_name=gpu,
                gpu_count=spec["resources"]["gpu_count"],
                backends=backend_labels(rs.Spec.model_validate(spec)),
                fingerprint=f"{hash(key) & (2**64 - 1):064x}",
                is_public=rng.random() < 0.3,
            )
        )
    Run.objects.bulk_create(runs, batch_size=2000)
    runs = list(Run.objects.order_by("id").only("id", "created_at", "gpu_name", "spec"))
    Environment.objects.bulk_create(
        [
            Environment(
                run_id=r.id,
                snapshot={
                    "gpu": {"model": r.gpu_name, "count": 1},
                    "software": {"vllm": "0.32.0", "torch": "2.13.0"},
                },
                fingerprint="e" * 64,
                gpu_name=r.gpu_name,
                gpu_count=1,
                vllm_version="0.32.0",
                torch_version="2.13.0",
                transformers_version="5.19.0",
            )
            for r in runs
        ],
        batch_size=2000,
    )
    detail_n = 16  # per-request arrays, shortened from num_prompts to keep the fill quick
    batch: list[Measurement] = []
    made = 0
    for index, run in enumerate(runs):
        # Spread n_measurements over the runs: some have more points or repeats than others.
        target = int((index + 1) * per_run) - int(index * per_run)
        points = [("baseline", None, None, "hf-sequential")]
        for sweep in run.spec["sweeps"]:
            for value in sweep["values"]:
                points.append((sweep["name"], sweep["axis"], value, "vllm"))
        for j in range(target):
            sweep, axis, value, kind = points[j % len(points)]
            repeat = j // len(points)
            concurrency = int(value) if axis == "max_concurrency" else (1 if kind != "vllm" else 64)
            output_len = int(value) if axis == "output_len" else 128
            m = metrics_for(rng, concurrency, output_len, kind != "vllm")
            key = sweep if axis is None else f"{sweep}:{axis}={value}"
            batch.append(
                Measurement(
                    run_id=run.id,
                    backend=kind,
                    backend_kind=kind,
                    point_key=key,
                    sweep=sweep,
                    axis=axis or "",
                    value=value,
                    repeat=repeat,
                    status="succeeded",
                    input_len=int(value) if axis == "input_len" else 1024,
                    output_len=output_len,
                    concurrency=concurrency,
                    num_prompts=256,
                    request_throughput=m["request_throughput"],
                    output_throughput=m["output_throughput"],
                    total_token_throughput=m["total_token_throughput"],
                    mean_ttft_ms=m["mean_ttft_ms"],
                    p50_ttft_ms=m["median_ttft_ms"],
                    p90_ttft_ms=m["p90_ttft_ms"],
                    p99_ttft_ms=m["p99_ttft_ms"],
                    mean_tpot_ms=m["mean_tpot_ms"],
                    p50_tpot_ms=m["median_tpot_ms"],
                    p90_tpot_ms=m["p90_tpot_ms"],
                    p99_tpot_ms=m["p99_tpot_ms"],
                    mean_itl_ms=m["mean_itl_ms"],
                    p50_itl_ms=m["median_itl_ms"],
                    p90_itl_ms=m["p90_itl_ms"],
                    p99_itl_ms=m["p99_itl_ms"],
                    mean_e2el_ms=m["mean_e2el_ms"],
                    p50_e2el_ms=m["median_e2el_ms"],
                    p90_e2el_ms=m["p90_e2el_ms"],
                    p99_e2el_ms=m["p99_e2el_ms"],
                    preemptions=0.0 if concurrency < 64 else float(rng.randint(0, 40)),
                    kv_cache_usage_peak=min(1.0, concurrency / 80),
                    prefix_cache_hit_rate=0.0,
                    gpu_memory_peak_bytes=rng.randint(20, 75) * 2**30,
                    metrics=m,
                    server_metrics={
                        "preemptions": 0.0,
                        "kv_cache_usage_peak": min(1.0, concurrency / 80),
                        "samples": 40,
                    },
                    raw={k: v for k, v in m.items()} | {"backend": "vllm", "model_id": "x"},
                    detail={
                        k: [round(rng.uniform(0.01, 0.2), 4) for _ in range(detail_n)]
                        for k in ("ttfts", "latencies", "input_lens", "output_lens")
                    },
                    commands={"serve": "vllm serve ...", "bench": "vllm bench serve ..."},
                    duration_s=m["duration"],
                    started_at=run.created_at,
                    finished_at=run.created_at,
                )
            )
            made += 1
        if len(batch) >= 5000:
            Measurement.objects.bulk_create(batch)
            batch = []
    Measurement.objects.bulk_create(batch)
    refresh_best_throughput(Run.objects.values("pk"))  # as ingestion keeps it, run by run
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")  # what autovacuum does in production


# --------------------------------------------------------------------------- timing


def query_count(client: Any, url: str) -> tuple[int, int]:
    """(SQL queries, HTTP status) of one GET url, after a warm-up request."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(url)  # warm: caches, first-request costs
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    return len(ctx.captured_queries), response.status_code  # now: later requests reset it


def pages(
    user: Any, run_id: str, extra: list[tuple[str, str, str]] | None = None
) -> list[tuple[str, str, str]]:
    """(label, client kind, url); ``extra`` targets are appended (results pages)."""
    from django.urls import NoReverseMatch, reverse

    out = [
        ("trivial: bare view", "api", "/__trivial__"),
        ("trivial: API view (auth, 1 query)", "api", "/__trivial_api__"),
        ("API runs list", "api", "/api/v1/runs/"),
        (
            "API runs list ?model=&status=",
            "api",
            f"/api/v1/runs/?model={MODELS[1]}&status=succeeded",
        ),
        ("API runs list ?backend=vllm&gpu=", "api", f"/api/v1/runs/?backend=vllm&gpu={GPUS[2]}"),
        ("API runs list ?owner=me", "api", "/api/v1/runs/?owner=me"),
        ("API run detail", "api", f"/api/v1/runs/{run_id}/"),
        ("API result document", "api", f"/api/v1/runs/{run_id}/result"),
    ]
    with contextlib.suppress(NoReverseMatch):  # the web pages, when portal.web has them
        out += [
            ("trivial: web view (session, 1 query)", "web", "/__trivial_web__"),
            ("web runs list", "web", reverse("web:run-list")),
            ("web runs list ?model=", "web", reverse("web:run-list") + f"?model={MODELS[1]}"),
            ("web run page", "web", reverse("web:run-detail", args=[run_id])),
        ]
    return out + list(extra or [])


def run_pages(
    user: Any, run_id: str, repeat: int, extra: list[tuple[str, str, str]] | None = None
) -> dict[str, tuple[float, int, int]]:
    """label -> (median seconds, queries, status). Pages are timed round-robin, one request
    each per round, so a load spike on this shared machine hits all of them alike."""
    from django.test import Client

    from portal.accounts.tokens import create_user_token

    token = create_user_token(user, "bench").plaintext
    clients = {"api": Client(headers={"Authorization": f"Bearer {token}"}), "web": Client()}
    clients["web"].force_login(user)
    targets = pages(user, run_id, extra)
    counts = {label: query_count(clients[kind], url) for label, kind, url in targets}
    times: dict[str, list[float]] = {label: [] for label, _, _ in targets}
    for _ in range(repeat):
        for label, kind, url in targets:
            t0 = time.perf_counter()
            clients[kind].get(url)
            times[label].append(time.perf_counter() - t0)
    return {label: (statistics.median(times[label]), *counts[label]) for label in times}


# --------------------------------------------------------------------------- results pages

COMPARE_VALUES = [1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256]


class ResultsFixtures:
    """Runs for the compare and history pages, owned by the benchmark's user."""

    def __init__(self, compare_ids: list[str], fingerprint: str, point: str) -> None:
        self.compare_ids = compare_ids
        self.fingerprint = fingerprint
        self.point = point

    @property
    def targets(self) -> list[tuple[str, str, str]]:
        ids = ",".join(self.compare_ids)
        compare = f"runs={ids}&reference={self.compare_ids[0]}"
        history = f"metric=output_throughput&point={self.point}&backend=vllm"
        return [
            ("web compare page", "web", f"/compare/?{compare}"),
            ("API compare", "api", f"/api/v1/compare/?{compare}"),
            ("web history page", "web", f"/history/{self.fingerprint}/?{history}"),
            ("API history", "api", f"/api/v1/history/?fingerprint={self.fingerprint}&{history}"),
        ]

    def compare_payload(self, user: Any) -> dict[str, int]:
        """Bytes of the compare page's embedded chart JSON, of the page, of the API answer."""

        from django.test import Client

        client = Client()
        client.force_login(user)
        label_url = {label: url for label, _, url in self.targets}
        html = client.get(label_url["web compare page"]).content
        match = re.search(
            rb'<script id="figures-data" type="application/json">(.*?)</script>', html, re.S
        )
        api = client.get(label_url["API compare"]).content
        return {"figures": len(match.group(1)) if match else 0, "html": len(html), "api": len(api)}


def results_fixtures(
    user: Any, compare_runs: int, points: int, history_runs: int, seed: int = 5
) -> ResultsFixtures:
    """``compare_runs`` runs of one concurrency sweep of ``points`` points (+ the HF
    baseline), and ``history_runs`` runs of one fingerprint (3 points each), a day
    apart, with the vLLM version changing every 100 runs. Bulk-created."""
    from django.utils import timezone

    from portal.benchmarks.intake import backend_labels
    from portal.benchmarks.models import Environment, Measurement, Run, new_public_id
    from portal.benchmarks.queries import refresh_best_throughput
    from runners import spec as rs

    rng = random.Random(seed)
    now = timezone.now()

    def spec(values: list[int], name: str) -> dict[str, Any]:
        parsed = rs.Spec.model_validate(
            {
                "name": name,
                "model": {"id": MODELS[2], "max_model_len": 8192},
                "workload": {"input_len": 1024, "output_len": 128, "num_prompts": 256},
                "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": values}],
                "backends": [{"kind": "hf-sequential"}, {"kind": "vllm"}],
            }
        )
        return parsed.model_dump(mode="json")

    def make_runs(count: int, values: list[int], fingerprint: str, name: str) -> list[Any]:
        body = spec(values, name)
        runs = [
            Run(
                public_id=new_public_id(),
                owner=user,
                name=f"{name} {i}",
                spec=body,
                spec_version=1,
                status="succeeded",
                created_at=now - timedelta(days=count - i),
                updated_at=now,
                progress_done=len(values) + 1,
                progress_total=len(values) + 1,
                model_id=MODELS[2],
                gpu_name=GPUS[0],
                gpu_count=1,
                backends=backend_labels(rs.Spec.model_validate(body)),
                fingerprint=fingerprint,
            )
            for i in range(count)
        ]
        Run.objects.bulk_create(runs, batch_size=1000)
        runs = list(Run.objects.filter(fingerprint=fingerprint).order_by("created_at"))
        Environment.objects.bulk_create(
            [
                Environment(
                    run_id=r.id,
                    snapshot={
                        "gpu": {"model": GPUS[0], "count": 1, "memory_total_mib": 81559},
                        "software": {"vllm": f"0.{20 + i // 100}.0", "torch": "2.13.0"},
                        "container": {"image": "ghcr.io/servebench/runner:0.1.0"},
                    },
                    gpu_name=GPUS[0],
                    gpu_count=1,
                    vllm_version=f"0.{20 + i // 100}.0",
                    torch_version="2.13.0",
                )
                for i, r in enumerate(runs)
            ],
            batch_size=1000,
        )
        rows = []
        for r in runs:
            for kind, value in [("hf-sequential", None), *(("vllm", v) for v in values)]:
                m = metrics_for(rng, value or 1, 128, kind != "vllm")
                rows.append(
                    Measurement(
                        run_id=r.id,
                        backend=kind,
                        backend_kind=kind,
                        point_key="baseline"
                        if value is None
                        else f"concurrency:max_concurrency={value}",
                        sweep="baseline" if value is None else "concurrency",
                        axis="" if value is None else "max_concurrency",
                        value=value,
                        status="succeeded",
                        input_len=1024,
                        output_len=128,
                        concurrency=value or 1,
                        num_prompts=256,
                        request_throughput=m["request_throughput"],
                        output_throughput=m["output_throughput"],
                        total_token_throughput=m["total_token_throughput"],
                        p99_ttft_ms=m["p99_ttft_ms"],
                        p99_tpot_ms=m["p99_tpot_ms"],
                        mean_tpot_ms=m["mean_tpot_ms"],
                        preemptions=0.0,
                        kv_cache_usage_peak=min(1.0, (value or 1) / 300),
                        metrics=m,
                        server_metrics={"preemptions": 0.0, "samples": 10},
                        commands={"serve": "vllm serve ...", "bench": "vllm bench serve ..."},
                    )
                )
        Measurement.objects.bulk_create(rows, batch_size=5000)
        refresh_best_throughput([r.pk for r in runs])
        return runs

    compared = make_runs(compare_runs, COMPARE_VALUES[:points], COMPARE_FINGERPRINT, "compare")
    make_runs(history_runs, [1, 16, 64], HISTORY_FINGERPRINT, "nightly")
    return ResultsFixtures(
        [r.public_id for r in compared], HISTORY_FINGERPRINT, "concurrency:max_concurrency=16"
    )


# --------------------------------------------------------------------------- waiting

RESULTS_PAGES = (
    "web run page",
    "web compare page",
    "web history page",
    "API compare",
    "API history",
)


def cold_and_warm(user: Any, targets: dict[str, str], repeat: int) -> dict[str, tuple[float, ...]]:
    """label -> (median seconds warm, cold, first build) for the results pages and the
    trivial views (labels with "API" go through the API with a token). Cold empties the
    pages cache before each request (a finished page is then read from Postgres,
    ``web.StoredPage``); build also deletes the stored pages: the page computed from the
    measurements, as for a selection nobody opened before. Round-robin, like
    ``run_pages``."""
    from django.core.cache import caches
    from django.test import Client

    from portal.accounts.tokens import create_user_token
    from portal.web import pagecache
    from portal.web.models import StoredPage

    token = create_user_token(user, "bench-cold").plaintext
    web, api = Client(), Client(headers={"Authorization": f"Bearer {token}"})
    web.force_login(user)
    kinds = ("warm", "cold", "build")
    found: dict[str, dict[str, list[float]]] = {k: {label: [] for label in targets} for k in kinds}
    for _ in range(repeat):
        for label, url in targets.items():
            client = api if "API" in label else web
            client.get(url)  # fills the cache (another page's cold request emptied it)
            for kind in kinds:
                if kind != "warm":
                    caches[pagecache.ALIAS].clear()
                if kind == "build":
                    StoredPage.objects.all().delete()
                t0 = time.perf_counter()
                client.get(url)
                found[kind][label].append(time.perf_counter() - t0)
    return {
        label: tuple(statistics.median(found[kind][label]) for kind in kinds) for label in targets
    }


def warmed_first_visit(
    user: Any, run_id: int, urls: dict[str, str], repeat: int
) -> tuple[float, dict[str, tuple[float, float]], list[str]]:
    """(median seconds of ``portal.web.warm.ended``, which the runner's "finished" report
    pays; label -> median seconds of a reader's first visit after it and of the next;
    what it built)
    with the pages
    cache in Redis as SERVEBENCH_PAGE_CACHE=redis has it (shared by every web process),
    under a key prefix of its own, emptied before each round and at the end."""
    from django.conf import settings
    from django.core.cache import caches
    from django.test import Client, override_settings

    from portal.lib import env
    from portal.web import pagecache, warm

    shared = {
        "BACKEND": "portal.web.pagecache.SharedPages",
        "LOCATION": env.cache_location(settings.REDIS_URL),
        "KEY_PREFIX": f"servebench-pages-bench-{secrets.token_hex(4)}",
    }
    warming: list[float] = []
    built: list[str] = []
    first: dict[str, list[float]] = {label: [] for label in urls}
    again: dict[str, list[float]] = {label: [] for label in urls}
    client = Client()  # one reader, signed in and past its first request, as in cold_and_warm
    client.force_login(user)
    client.get("/__trivial_web__")
    with override_settings(CACHES={**settings.CACHES, pagecache.ALIAS: shared}):
        assert pagecache.shared()
        for _ in range(repeat):
            caches[pagecache.ALIAS].clear()
            t0 = time.perf_counter()
            built = warm.ended(run_id)
            warming.append(time.perf_counter() - t0)
            for label, url in urls.items():
                t0 = time.perf_counter()
                client.get(url)
                first[label].append(time.perf_counter() - t0)
            for label, url in urls.items():
                t0 = time.perf_counter()
                client.get(url)
                again[label].append(time.perf_counter() - t0)
        caches[pagecache.ALIAS].clear()
    medians = {k: (statistics.median(first[k]), statistics.median(again[k])) for k in urls}
    return statistics.median(warming), medians, built


def timings(names: tuple[str, ...], rows: dict[str, tuple[float, ...]], trivial: float) -> None:
    """A table of timings per page, in ms and against the trivial view."""
    head = f"{'page':24}" + "".join(f" {name + ' ms':>8} {'x trivial':>9}" for name in names)
    print(head)
    print("-" * len(head))
    for label, values in rows.items():
        cells = "".join(f" {x * 1000:8.2f} {x / trivial:9.1f}" for x in values)
        print(f"{label:24}{cells}")


COMPARE_FINGERPRINT = "c" * 64
HISTORY_FINGERPRINT = "d" * 64


def small_pages(args: argparse.Namespace) -> dict[str, tuple[float, int, int]]:
    """The pages at 1% of the data (their query counts are compared with the full size's),
    then that data deleted."""
    from django.contrib.auth import get_user_model

    from portal.benchmarks.models import Measurement, Run

    generate(max(1, args.runs // 100), args.measurements // 100)
    user = get_user_model().objects.order_by("id").first()
    sample = Run.objects.filter(owner=user).order_by("-created_at").first() or Run.objects.first()
    small_results = results_fixtures(user, compare_runs=2, points=5, history_runs=10)
    small = run_pages(user, sample.public_id, max(3, args.repeat // 4), small_results.targets)
    Measurement.objects.all().delete()
    Run.objects.all().delete()
    get_user_model().objects.all().delete()
    return small


def reuse_database(name: str) -> str:
    """Point the connection at the database an earlier ``--keep`` left, migrated to this
    checkout (a new index is built on the kept rows); the old name, as create_test_db
    returns it."""
    from django.core.management import call_command
    from django.db import connection

    old_name = connection.settings_dict["NAME"]
    connection.close()
    connection.settings_dict["NAME"] = name
    call_command("migrate", verbosity=0, interactive=False)
    return old_name


def kept_results_fixtures() -> ResultsFixtures:
    """The compare and history runs an earlier full-size fill made (``results_fixtures``)."""
    from portal.benchmarks.models import Run

    ids = Run.objects.filter(fingerprint=COMPARE_FINGERPRINT).order_by("created_at")
    return ResultsFixtures(
        list(ids.values_list("public_id", flat=True)),
        HISTORY_FINGERPRINT,
        "concurrency:max_concurrency=16",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--measurements", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=30, help="timed requests per page")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="time the pages on the database an earlier --keep left (migrated to this "
        "checkout first; no fill, no 1%% query counts): a 100,000-run fill takes ~20 minutes",
    )
    args = parser.parse_args()
    args.keep = args.keep or args.reuse

    setup_django()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import override_settings, setup_test_environment

    from portal.benchmarks.models import Measurement, Run

    setup_test_environment()
    test_settings = connection.settings_dict["TEST"]
    test_settings["NAME"] = f"test_{connection.settings_dict['NAME']}_scale"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    t0 = time.perf_counter()
    if args.reuse:
        old_name = reuse_database(test_settings["NAME"])
    else:
        old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    print(
        f"database {connection.settings_dict['NAME']} migrated in {time.perf_counter() - t0:.1f} s"
    )
    try:
        with override_settings(ROOT_URLCONF=trivial_urlconf()):
            small: dict[str, tuple[float, int, int]] = {}
            t0 = time.perf_counter()
            if not args.reuse:
                small = small_pages(args)
                generate(args.runs, args.measurements)
            print(
                f"generated {Run.objects.count():,} runs and {Measurement.objects.count():,} "
                f"measurements in {time.perf_counter() - t0:.0f} s"
            )
            from portal.lib import startup

            startup.settle()  # as portal.wsgi does in each web process before serving
            user = get_user_model().objects.order_by("id").first()
            sample = (
                Run.objects.filter(owner=user, status="succeeded")
                .exclude(fingerprint__in=[COMPARE_FINGERPRINT, HISTORY_FINGERPRINT])
                .order_by("-created_at")
                .first()
            )
            n_meas = Measurement.objects.filter(run=sample).count()
            from portal.benchmarks.queries import visible_runs

            visible = visible_runs(user).count()
            if args.reuse:
                big_results = kept_results_fixtures()
            else:
                big_results = results_fixtures(user, compare_runs=8, points=20, history_runs=1000)
            big = run_pages(user, sample.public_id, args.repeat, big_results.targets)
            payload = big_results.compare_payload(user)
            from django.urls import reverse

            results_urls = {
                "trivial: web view (session, 1 query)": "/__trivial_web__",
                "trivial: API view (auth, 1 query)": "/__trivial_api__",
            }
            results_urls["web run page"] = reverse("web:run-detail", args=[sample.public_id])
            results_urls.update(
                {label: url for label, _, url in big_results.targets if label in RESULTS_PAGES}
            )
            waits = cold_and_warm(user, results_urls, max(5, args.repeat // 2))
            # The newest run of the 1,000-run series, as if it had just ended: its page
            # and the history its page links to.
            from django.test import Client

            ended = (
                Run.objects.filter(fingerprint=big_results.fingerprint, status="succeeded")
                .order_by("-created_at")
                .first()
            )
            reader = Client()
            reader.force_login(ended.owner)
            ended_url = reverse("web:run-detail", args=[ended.public_id])
            linked = {"its run page": ended_url}
            if history_link := reader.get(ended_url).context.get("history_url"):
                linked["its history page"] = history_link
            warming, first_visit, built = warmed_first_visit(
                ended.owner, ended.pk, linked, max(5, args.repeat // 2)
            )
            from page_weight import page_weight  # bench/page_weight.py, beside this file

            weight = page_weight(user, results_urls["web run page"])
    finally:
        if not args.keep:
            connection.creation.destroy_test_db(old_name, verbosity=0)

    bare = big["trivial: bare view"][0]
    baseline = {
        "api": big["trivial: API view (auth, 1 query)"][0],
        "web": big.get("trivial: web view (session, 1 query)", (bare,))[0],
    }
    print(
        f"\nas {user.username} ({visible:,} runs visible: own + public); run page of a run "
        f"with {n_meas} measurements; median of {args.repeat} requests per page.\n"
        "x trivial: against the trivial view of the same stack (API or web);"
        " x bare: against a view that does nothing\n"
    )
    header = (
        f"{'page':38} {'median ms':>9} {'x trivial':>9} {'x bare':>7} "
        f"{'queries @1%':>11} {'queries @100%':>13}"
    )
    print(header)
    print("-" * len(header))
    for label, (seconds, queries, status) in big.items():
        kind = "web" if label.startswith(("web", "trivial: web")) else "api"
        small_q = small.get(label, (0, "-", 0))[1]
        flag = "" if status == 200 else f"  (HTTP {status})"
        print(
            f"{label:38} {seconds * 1000:9.2f} {seconds / baseline[kind]:9.1f} "
            f"{seconds / bare:7.1f} {small_q!s:>11} {queries:>13}{flag}"
        )
    print(
        "\nresults pages: @1% = compare 2 runs x 5 points, history over 10 runs; "
        "@100% = compare 8 runs x 20 points, history over 1,000 runs"
    )
    print(
        f"compare page chart data (8 runs x 20 points): {payload['figures']:,} bytes "
        f"({payload['figures'] / 1000:.0f} kB; target < 200 kB); whole HTML page "
        f"{payload['html']:,} bytes; API answer {payload['api']:,} bytes"
    )

    print(
        "\nresults pages against the trivial view of their stack (goal: within 5x). warm: a "
        "finished page as a reader gets it after the first visit (portal.web.pagecache); "
        "cold: that cache emptied before each request (the page read from Postgres, kept "
        "when its run ended or when first read); build: the kept pages deleted too (computed "
        "from the measurements: a selection nobody opened before)"
    )
    web_rows = {k: v for k, v in waits.items() if "API" not in k}
    timings(("warm", "cold", "build"), web_rows, waits["trivial: web view (session, 1 query)"][0])
    api_rows = {k: v for k, v in waits.items() if "API" in k}
    timings(("warm", "cold", "build"), api_rows, waits["trivial: API view (auth, 1 query)"][0])
    print(
        "\nwith SERVEBENCH_PAGE_CACHE=redis (one cache in Redis that every web process "
        "shares), a run of the 1,000-run series as it ends: the runner's report builds "
        f"{' and '.join(built) or 'nothing'} ({warming * 1000:.1f} ms); its owner's visits"
    )
    timings(("first", "next"), first_visit, waits["trivial: web view (session, 1 query)"][0])
    print(
        f"\nrun page transfer (gzip as served, headers included): first load "
        f"{weight['first']:,} bytes ({weight['first'] / 1e6:.2f} MB; goal < 1.5 MB), "
        f"repeat load {weight['repeat']:,} bytes ({weight['repeat'] / 1e3:.1f} kB; goal "
        f"< 100 kB); the HTML uncompressed: {weight['html']:,} bytes"
    )
    for asset, status, size, encoding, control, again in weight["assets"]:
        print(f"  {asset:60} {status} {size:>9,} B  {encoding:5} {control:38} repeat {again:,} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())

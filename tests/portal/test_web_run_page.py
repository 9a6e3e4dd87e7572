"""The run page's results: charts per sweep, capacity, goodput, warnings, the summary table
and its downloads, the log tail, sharing and re-runs; a fixed number of queries."""

from __future__ import annotations

import csv
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
import webdata
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from portal.benchmarks import documents, environment, ingestion, samples
from portal.benchmarks.models import Measurement, Run, RunStatus
from runners import result as rr

pytestmark = pytest.mark.django_db


def signed_in(user: Any, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def page_queries(client: Client, url: str) -> tuple[Any, int]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return response, len(ctx.captured_queries)


def test_the_run_page_runs_the_same_number_of_queries_for_2_or_20_points(
    make_user: Any,
) -> None:
    owner = make_user("alice")
    small = webdata.make_sweep_run(owner, [1, 4], slo={"ttft_ms": 400})
    large = webdata.make_sweep_run(
        owner,
        [1, 2, 4, 8, 12, 16, 24, 32, 48, 64],
        slo={"ttft_ms": 400},
        prompt_lengths=[128, 512, 1024, 2048, 3000],
        output_lengths=[32, 128, 256, 512],
    )
    repeated = webdata.make_sweep_run(owner, [1, 2, 4, 8], repeats=2, slo={"ttft_ms": 400})
    client = signed_in(owner)
    _, n_small = page_queries(client, small.get_absolute_url())
    response, n_large = page_queries(client, large.get_absolute_url())
    _, n_repeated = page_queries(client, repeated.get_absolute_url())
    assert n_small == n_large
    # +1: the samples of points measured once (request-level noise); +4: a finished run's
    # first build looks for its stored page, then stores it (a statement in a savepoint)
    assert n_large <= 15
    assert n_repeated <= n_large  # repeats give their spread without reading samples
    assert len(response.context["results"].points) == 1 + 10 + 5 + 4


def test_each_sweep_gets_its_charts_with_every_point(make_user: Any) -> None:
    run = webdata.make_sweep_run(
        make_user(),
        [1, 2, 4, 8, 16, 32, 64],
        repeats=2,
        prompt_lengths=[128, 1024, 2048],
        output_lengths=[32, 128, 512],
        preempt_from=32,
    )
    page = signed_in(run.owner).get(run.get_absolute_url())
    figures = {f["id"]: f["figure"] for f in page.context["figures"]}
    kinds = ["output", "rates", "pareto", "ttft", "tpot", "itl", "e2el", "server"]
    assert [k for k in kinds if f"concurrency-{k}" in figures] == kinds
    # Prompt- and output-length sweeps on their own axes (no Pareto: not a load sweep).
    assert "prompt-length-output" in figures and "prompt-length-pareto" not in figures
    assert figures["prompt-length-output"]["layout"]["xaxis"]["title"]["text"].startswith(
        "Prompt length"
    )
    assert figures["output-length-ttft"]["layout"]["xaxis"]["title"]["text"].startswith(
        "Output length"
    )
    output = figures["concurrency-output"]
    names = [t["name"] for t in output["data"]]
    assert names[0] == "vllm" and names[1].startswith("hf-sequential (baseline")
    assert names[2].startswith("preemptions")
    assert output["data"][0]["x"] == [1, 2, 4, 8, 16, 32, 64]
    assert output["data"][2]["x"] == [32, 64]  # the preempting points, circled
    assert all(e > 0 for e in output["data"][0]["error_y"]["array"])  # 2 repeats: spread
    assert len(output["layout"]["annotations"]) >= 7  # a speedup label per point + markers
    ttft = [t["name"] for t in figures["concurrency-ttft"]["data"]]
    assert ttft == ["vllm p50", "vllm p90", "vllm p99"]
    pareto = figures["concurrency-pareto"]["data"]
    assert [t["name"] for t in pareto] == ["vllm", "vllm Pareto front"]
    assert len(pareto[0]["x"]) == 7 and 1 <= len(pareto[1]["x"]) <= 7
    rates = figures["concurrency-rates"]["data"]
    assert [t.get("yaxis", "y") for t in rates] == ["y", "y2"]


def test_preemptions_show_a_warning_and_mark_the_capacity_chart(make_user: Any) -> None:
    run = webdata.make_sweep_run(make_user(), [1, 4, 16, 32, 64], preempt_from=32)
    page = signed_in(run.owner).get(run.get_absolute_url())
    html = page.content.decode()
    assert 'id="preemption-warning"' in html
    assert "the cache was driven past its efficient point" in html
    plan = page.context["capacity"]
    assert plan.preemptions_from == 32
    assert plan.flattened_at is not None
    texts = [a["text"] for a in page.context["figures"][0]["figure"]["layout"]["annotations"]]
    assert "preemptions from 32" in texts
    assert any(t.startswith("flattened at") for t in texts)


def test_capacity_panel_does_the_kv_arithmetic_from_the_captured_config(make_user: Any) -> None:
    run = webdata.make_sweep_run(make_user(), [1, 4, 16])
    page = signed_in(run.owner).get(run.get_absolute_url())
    plan = page.context["capacity"]
    assert plan.kv_bytes_per_token == 131_072  # Llama-8B shape, bf16
    assert plan.request_tokens == 128 + 32
    assert plan.kv_bytes_per_request == 131_072 * 160
    assert plan.cache.estimated and "gpu_memory_utilization 0.9" in plan.cache.source
    assert plan.cache_limited_concurrency == plan.cache.bytes // (131_072 * 160)
    assert plan.gpu.key == "H100-SXM"
    assert plan.roofline and 0 < plan.best_roofline.fraction < 1
    html = page.content.decode()
    assert "131,072 bytes" in html
    assert 'id="roofline"' in html and "of NVIDIA H100 SXM" in html


def test_the_roofline_is_an_estimate_from_the_batch_the_server_ran(make_user: Any) -> None:
    run = webdata.make_sweep_run(make_user(), [1, 4, 16], running=0.75)
    page = signed_in(run.owner).get(run.get_absolute_url())
    plan = page.context["capacity"]
    assert [(r.batch, r.batch_source) for r in plan.roofline] == [
        (1.0, "measured"),  # 0.75 running on average: at least the one in flight
        (3.0, "measured"),
        (12.0, "measured"),
    ]
    html = page.content.decode()
    assert "Decode vs HBM roofline (estimate)" in html and "estimate: up to" in html
    assert "batch 12 measured" in html or "batch 3 measured" in html or "batch 1 measured" in html
    assert "measured (mean requests running)" in html
    plain = webdata.make_sweep_run(make_user("other"), [1, 4, 16])
    page = signed_in(plain.owner).get(plain.get_absolute_url())
    assert [r.batch_source for r in page.context["capacity"].roofline] == ["assumed"] * 3
    assert "assumed (min of concurrency, prompts)" in page.content.decode()


def test_on_cpu_the_roofline_says_not_applicable(make_user: Any) -> None:
    config = {
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "hidden_size": 128,
        "intermediate_size": 256,
        "vocab_size": 512,
        "tie_word_embeddings": True,
    }
    env = webdata.snapshot(gpu="CPU", config=config)
    run = webdata.make_sweep_run(make_user(), [1, 4], env=env)
    plan = signed_in(run.owner).get(run.get_absolute_url()).context["capacity"]
    assert plan.kv_bytes_per_token == 2 * 2 * 1 * 64 * 2
    assert plan.cache.source.startswith("VLLM_CPU_KVCACHE_SPACE=1 GiB")
    assert plan.cache_limited_concurrency == 2**30 // (512 * 160)
    assert plan.roofline == [] and plan.roofline_note.startswith("n/a on CPU")


def test_with_an_slo_goodput_is_computed_and_the_best_point_named(make_user: Any) -> None:
    run = webdata.make_sweep_run(make_user(), [1, 4, 16, 64], slo={"ttft_ms": 500})
    page = signed_in(run.owner).get(run.get_absolute_url())
    results = page.context["results"]
    conc = results.series()[0]
    attainment = [p.get("slo_attainment") for p in conc.points]
    assert all(a is not None for a in attainment)
    assert attainment[0] == 1.0 and attainment[-1] < attainment[0]  # latency grows with load
    goodputs = [p.get("request_goodput") for p in conc.points]
    assert goodputs[0] == pytest.approx(conc.points[0].get("request_throughput"), rel=0.05)
    best = page.context["slo_best"][0]["best"]
    assert best.get("request_goodput") == max(g for g in goodputs if g)
    assert "concurrency-goodput" in [f["id"] for f in page.context["figures"]]
    html = page.content.decode()
    assert 'id="slo-best"' in html and 'id="budget-tool"' in html


def test_the_client_reported_goodput_is_used_when_present() -> None:
    from portal.benchmarks import goodput

    assert goodput.from_metrics({"request_goodput": 5.0, "request_throughput": 10.0}) == {
        "request_goodput": 5.0,
        "slo_attainment": 0.5,
    }
    detail = {
        "ttfts": [0.1, 0.3, 0.2],
        "latencies": [0.5, 0.9, 0.0],
        "output_lens": [5, 5, 0],
        "errors": ["", "", "boom"],
        "duration": 2.0,
    }
    # TPOT of request 1: (0.5 - 0.1) / 4 = 100 ms; request 2: 150 ms; the third failed.
    assert goodput.from_detail(detail, {"ttft_ms": 250, "tpot_ms": 120}) == {
        "request_goodput": 0.5,
        "slo_attainment": 0.5,
    }


def test_the_summary_table_has_every_metric_and_downloads(make_user: Any) -> None:
    run = webdata.make_sweep_run(make_user(), [1, 4, 16], repeats=2, slo={"e2el_ms": 900})
    client = signed_in(run.owner)
    page = client.get(run.get_absolute_url())
    keys = [m.key for m in page.context["metric_columns"]]
    for key in (
        "request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
        "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms",
        "preemptions", "kv_cache_usage_peak", "gpu_memory_peak_bytes",
    ):  # fmt: skip
        assert key in keys, key
    html = page.content.decode()
    assert 'id="summary-table" class="sortable"' in html
    table = client.get(f"/runs/{run.public_id}/points.csv")
    assert table["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(table.content.decode())))
    assert [r["point"] for r in rows] == [
        "baseline",
        "concurrency:max_concurrency=1",
        "concurrency:max_concurrency=4",
        "concurrency:max_concurrency=16",
    ]
    assert rows[1]["repeats"] == "2" and float(rows[1]["output_throughput_std"]) > 0
    doc = json.loads(client.get(f"/runs/{run.public_id}/points.json").content)
    assert doc["run"] == run.public_id and len(doc["points"]) == 4
    assert doc["points"][3]["speedup_vs_hf"] > 1
    assert Client().get(f"/runs/{run.public_id}/points.csv").status_code == 404


def test_the_runner_log_tail_is_shown_to_the_owner_only(make_user: Any, tmp_path: Path) -> None:
    run = webdata.make_sweep_run(make_user(), [1, 4], finish=False)
    (tmp_path / "runner.log").write_text(
        "".join(f"line {i}\n" for i in range(500)) + "<b>not bold</b>\n"
    )
    Run.objects.filter(pk=run.pk).update(
        executor="local", executor_handle={"workdir": str(tmp_path), "pid": 1, "pgid": 1}
    )
    owner = signed_in(run.owner)
    html = owner.get(run.get_absolute_url()).content.decode()
    assert 'id="run-log"' in html
    assert "line 499" in html and "line 250" not in html  # the last 200 lines
    assert "&lt;b&gt;not bold&lt;/b&gt;" in html
    text = owner.get(f"/runs/{run.public_id}/log.txt")
    assert text.status_code == 200 and text.content.decode().rstrip().endswith("<b>not bold</b>")
    Run.objects.filter(pk=run.pk).update(is_public=True)
    other = signed_in(make_user("mallory"))
    assert 'id="run-log"' not in other.get(run.get_absolute_url()).content.decode()
    assert other.get(f"/runs/{run.public_id}/log.txt").status_code == 404


def test_an_executor_error_is_shown_instead_of_the_log(make_user: Any) -> None:
    run = webdata.make_sweep_run(make_user(), [1], finish=False)
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.FAILED, executor="nonexistent", executor_handle={"x": 1}
    )
    html = signed_in(run.owner).get(run.get_absolute_url()).content.decode()
    assert 'id="log-error"' in html and "unknown executor" in html


def test_the_owner_makes_a_run_public_and_private_again(make_user: Any) -> None:
    run = webdata.make_sweep_run(make_user(), [1, 4])
    url = f"/runs/{run.public_id}/visibility/"
    # CSRF is enforced: a cross-site form post without the token is refused.
    strict = signed_in(run.owner, enforce_csrf_checks=True)
    assert strict.post(url, {"is_public": "1"}).status_code == 403
    page = strict.get(run.get_absolute_url())
    token = page.cookies["csrftoken"].value
    response = strict.post(url, {"is_public": "1", "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert Run.objects.get(pk=run.pk).is_public
    assert Client().get(run.get_absolute_url()).status_code == 200
    assert signed_in(make_user("mallory")).post(url, {"is_public": "0"}).status_code == 404
    strict.post(url, {"is_public": "0", "csrfmiddlewaretoken": token})
    assert not Run.objects.get(pk=run.pk).is_public
    assert Client().get(run.get_absolute_url()).status_code == 404


def test_a_rerun_submits_the_same_spec_and_says_whether_it_reproduced(
    make_user: Any,
) -> None:
    owner = make_user("alice")
    original = webdata.make_sweep_run(owner, [1, 4, 16], repeats=3, seed=1)
    client = signed_in(owner)
    assert signed_in(make_user("bob")).post(f"/runs/{original.public_id}/rerun/").status_code == 404
    response = client.post(f"/runs/{original.public_id}/rerun/")
    rerun = Run.objects.exclude(pk=original.pk).get(owner=owner, name__startswith="Re-run")
    assert response["Location"] == rerun.get_absolute_url()
    assert rerun.spec == original.spec and rerun.name == f"Re-run of {original.public_id}"
    # The runner reports on the same GPU (same fingerprint) and measures what the
    # original's first repeat did: within the original's spread.
    Run.objects.filter(pk=rerun.pk).update(status=RunStatus.RUNNING)
    environment.store_environment(rerun, webdata.snapshot(), "f" * 64)
    first = Measurement.objects.filter(run=original, repeat=0, backend_kind="vllm")
    arrays = samples.details(first)  # the per-request arrays, wherever they are stored
    for row in first:
        doc = documents.measurement_document(row, arrays[row.pk])
        ingestion.ingest_measurement(rerun, rr.Measurement.model_validate(doc))
    page = client.get(rerun.get_absolute_url())
    verdict = page.context["verdict"]
    assert verdict.comparable and verdict.reproduced is True, verdict.summary
    assert "Reproduced" in page.content.decode() and 'id="rerun-checks"' in page.content.decode()
    assert rerun in client.get(original.get_absolute_url()).context["reruns"]
    # A second re-run, twice as slow at concurrency 4, is called out with the engine's words.
    client.post(f"/runs/{original.public_id}/rerun/")
    slow = Run.objects.filter(owner=owner).latest("created_at", "id")
    Run.objects.filter(pk=slow.pk).update(status=RunStatus.RUNNING)
    environment.store_environment(slow, webdata.snapshot(), "f" * 64)
    for row in first:
        doc = documents.measurement_document(row, arrays[row.pk])
        if row.point_key.endswith("=4"):
            _scale(doc, 2.0)
        ingestion.ingest_measurement(slow, rr.Measurement.model_validate(doc))
    verdict = client.get(slow.get_absolute_url()).context["verdict"]
    assert verdict.reproduced is False, verdict.summary
    assert "vllm concurrency 4" in verdict.summary and "worse" in verdict.summary
    assert all(c.point_key.endswith("=4") for c in verdict.checks if c.verdict == "worse")


def _scale(doc: dict[str, Any], factor: float) -> None:
    """A measurement document made ``factor`` times slower: latencies up, throughput down."""
    for key, value in list(doc["metrics"].items()):
        if key.endswith("_ms"):
            doc["metrics"][key] = value * factor
        elif key.endswith("throughput"):
            doc["metrics"][key] = value / factor
    for key in ("ttfts", "latencies"):
        doc["detail"][key] = [x * factor for x in doc["detail"][key]]
    doc["detail"]["itls"] = [[x * factor for x in row] for row in doc["detail"]["itls"]]


def test_user_text_in_charts_is_escaped(make_user: Any) -> None:
    from portal.web.figures import esc

    assert esc("<img src=x onerror=alert(1)>") == "&lt;img src=x onerror=alert(1)&gt;"
    run = webdata.make_sweep_run(make_user(), [1, 4], name='<script>alert("x")</script>')
    html = signed_in(run.owner).get(run.get_absolute_url()).content.decode()
    assert '<script>alert("x")</script>' not in html


def test_open_graph_tags_describe_the_run(make_user: Any) -> None:
    run = webdata.make_sweep_run(make_user(), [1, 4, 16], public=True)
    html = Client().get(run.get_absolute_url()).content.decode()
    assert '<meta property="og:title" content="synthetic sweep · servebench">' in html
    assert 'property="og:description"' in html and "output tok/s" in html
    assert f'content="http://testserver/runs/{run.public_id}/"' in html


def test_a_finished_runs_page_is_computed_once_and_a_sharing_change_shows(
    make_user: Any,
) -> None:
    run = webdata.make_sweep_run(make_user("alice"), [1, 4, 16], slo={"ttft_ms": 500})
    client = signed_in(run.owner)
    first, built = page_queries(client, run.get_absolute_url())
    again, cached = page_queries(client, run.get_absolute_url())
    # Measurements, samples, contention, environment and commands are not read again.
    assert cached <= built - 4, (built, cached)
    assert again.context["fragments"] == first.context["fragments"]
    # The kept part is what the page renders (run_page.KEPT), not the objects behind it.
    assert [f["id"] for f in first.context["figures"]] and "figures" not in again.context
    # Making it public moves its updated_at: the next page is built afresh, and says so.
    client.post(f"/runs/{run.public_id}/visibility/", {"is_public": "1"})
    shared, rebuilt = page_queries(client, run.get_absolute_url())
    assert rebuilt == built
    assert '<span id="visibility">public</span>' in shared.content.decode()
    # Who manages a run reads whole error texts; a reader does not: separate entries.
    reader, _ = page_queries(Client(), run.get_absolute_url())
    assert reader.context["can_manage"] is False


def test_an_unfinished_run_is_rebuilt_on_every_request(make_user: Any) -> None:
    spec = webdata.sweep_spec([1, 4, 16])
    run = webdata.make_sweep_run(make_user("alice"), [1, 4], finish=False, spec=spec)
    client = signed_in(run.owner)
    before, _ = page_queries(client, run.get_absolute_url())
    data = webdata.scaled_point(webdata.recording(), 16, random.Random(3))
    ingestion.ingest_measurement(
        run, webdata.vllm_measurement("concurrency", "max_concurrency", 16, data)
    )
    after, _ = page_queries(client, run.get_absolute_url())
    assert len(after.context["results"].points) == len(before.context["results"].points) + 1


def test_the_budget_box_starts_from_the_slo_or_the_median(make_user: Any) -> None:
    owner = make_user("alice")
    with_slo = webdata.make_sweep_run(owner, [1, 4, 16, 64], slo={"ttft_ms": 500})
    page = signed_in(owner).get(with_slo.get_absolute_url())
    html = page.content.decode()
    assert 'id="budget-ms" type="number" min="1" step="any" value="500"' in html
    assert "(from the spec&#x27;s SLO)" in html
    assert "tok/s at c=" in page.context["budget_best"][0]
    plain = webdata.make_sweep_run(owner, [1, 4, 16, 64], seed=2)
    page = signed_in(owner).get(plain.get_absolute_url())
    assert page.context["budget_source"] == "the median p99 TTFT of the measured load points"
    assert page.context["budget_ms"] and page.context["budget_best"]


@pytest.fixture
def shared_pages(settings: Any) -> Any:
    """The pages cache in Redis (SERVEBENCH_PAGE_CACHE=redis), under a prefix of this
    test's own, emptied afterwards (only its keys: the broker shares the database)."""
    import uuid

    from django.core.cache import caches

    from portal.lib import env

    settings.CACHES = {
        **settings.CACHES,
        "pages": {
            "BACKEND": "portal.web.pagecache.SharedPages",
            "LOCATION": env.cache_location(settings.REDIS_URL),
            "KEY_PREFIX": f"servebench-pages-test-{uuid.uuid4().hex[:12]}",
        },
    }
    yield caches["pages"]
    caches["pages"].clear()


def test_with_a_shared_cache_the_first_reader_gets_the_page_the_runner_warmed(
    make_user: Any, shared_pages: Any, bearer_client: Any
) -> None:
    """The runner's "finished" report builds the page, and the history it links to, into
    Redis, where every web process reads them: the owner's and a visitor's first visits
    read neither measurements nor samples, and show what a page built on the spot shows."""
    import redis

    from portal.accounts.models import ApiToken
    from portal.accounts.tokens import issue_token
    from portal.web import pagecache
    from portal.web.models import StoredPage

    assert pagecache.shared()
    run = webdata.make_sweep_run(make_user("alice"), [1, 4, 16], public=True, finish=False)
    token = issue_token(run.owner, kind=ApiToken.Kind.RUN, run=run).plaintext
    finished = {"type": "finished", "status": "succeeded", "errors": []}
    response = bearer_client(token).post(
        f"/api/v1/runner/runs/{run.public_id}/events", finished, content_type="application/json"
    )
    assert response.json()["run_status"] == "succeeded"
    client = redis.Redis.from_url(shared_pages._servers[0])
    # The page as its managers and as everyone else see it; the history, as its owner and
    # (a public run) as a visitor see it.
    assert len(list(client.scan_iter(match=f"{shared_pages.key_prefix}:*"))) == 4

    owner = signed_in(run.owner)
    warm, warm_queries = page_queries(owner, run.get_absolute_url())
    history_url = warm.context["history_url"]
    _, reader_queries = page_queries(Client(), run.get_absolute_url())
    warm_history, warm_history_queries = page_queries(owner, history_url)
    _, visitor_history_queries = page_queries(Client(), history_url)
    shared_pages.clear()
    assert list(client.scan_iter(match=f"{shared_pages.key_prefix}:*")) == []
    StoredPage.objects.filter(run=run).delete()  # and the page kept in Postgres: built anew
    cold, cold_queries = page_queries(owner, run.get_absolute_url())
    cold_history, cold_history_queries = page_queries(owner, history_url)
    assert warm_queries <= cold_queries - 4 and reader_queries <= cold_queries - 4
    assert max(warm_history_queries, visitor_history_queries) < cold_history_queries
    assert warm_history.context["body"] == cold_history.context["body"]
    assert warm.context["fragments"] == cold.context["fragments"]
    assert [f["id"] for f in cold.context["figures"]] and "figures" not in warm.context


def test_a_finished_run_page_the_cache_forgot_is_read_back_from_postgres(
    make_user: Any,
) -> None:
    """The pages cache forgets (a day's timeout, a restart, another web process): a
    finished run's page is kept in Postgres when first built and read back from there,
    the same page without reading a measurement; a change to the run (sharing) makes a
    new page and deletes the stale one."""
    from django.core.cache import caches

    from portal.benchmarks import sharing
    from portal.web.models import StoredPage

    run = webdata.make_sweep_run(make_user("alice"), [1, 4, 16])
    client = signed_in(run.owner)
    built, _ = page_queries(client, run.get_absolute_url())
    first = list(StoredPage.objects.filter(run=run).values_list("key", flat=True))
    assert len(first) == 1
    caches["pages"].clear()
    with CaptureQueriesContext(connection) as ctx:
        again = client.get(run.get_absolute_url())
    assert "benchmarks_measurement" not in " ".join(q["sql"] for q in ctx.captured_queries)
    assert again.context["fragments"] == built.context["fragments"]
    assert [f["id"] for f in built.context["figures"]] and "figures" not in again.context
    sharing.set_public(run, run.owner, True)
    run.refresh_from_db()
    caches["pages"].clear()
    shared, _ = page_queries(client, run.get_absolute_url())
    assert shared.context["fragments"] == built.context["fragments"]
    now = list(StoredPage.objects.filter(run=run).values_list("key", flat=True))
    assert len(now) == 1 and now != first


def test_a_page_that_cannot_be_warmed_costs_the_runner_nothing(
    make_user: Any, shared_pages: Any, bearer_client: Any, monkeypatch: Any, caplog: Any
) -> None:
    from portal.accounts.models import ApiToken
    from portal.accounts.tokens import issue_token
    from portal.web import run_page

    def broken(run: Run, manager: bool) -> dict[str, Any]:
        raise RuntimeError("a figure could not be built")

    monkeypatch.setattr(run_page, "results_part", broken)
    run = webdata.make_sweep_run(make_user("alice"), [1, 4], finish=False)
    token = issue_token(run.owner, kind=ApiToken.Kind.RUN, run=run).plaintext
    finished = {"type": "finished", "status": "succeeded", "errors": []}
    response = bearer_client(token).post(
        f"/api/v1/runner/runs/{run.public_id}/events", finished, content_type="application/json"
    )
    assert response.status_code == 200 and response.json()["run_status"] == "succeeded"
    assert "could not build the pages of run" in caplog.text


def test_a_shared_cache_out_of_reach_costs_a_cold_page_not_an_error(
    make_user: Any, settings: Any, caplog: Any
) -> None:
    """Redis down (or full): finished runs' pages are built as if cold, never a 500."""
    settings.CACHES = {
        **settings.CACHES,
        "pages": {
            "BACKEND": "portal.web.pagecache.SharedPages",
            "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens on port 1
            "OPTIONS": {"socket_connect_timeout": 0.5},
        },
    }
    run = webdata.make_sweep_run(make_user("alice"), [1, 4], public=True)
    response = Client().get(run.get_absolute_url())
    assert response.status_code == 200 and response.context["figures"]
    assert "pages cache unreadable" in caplog.text

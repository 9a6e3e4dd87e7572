"""HTML pages through Django's test client: who sees what, the form, the run page, tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import webdata
from django.test import Client

from portal.accounts.models import ApiToken
from portal.benchmarks import ingestion
from portal.benchmarks.models import Run, RunStatus
from runners import result as rr

pytestmark = pytest.mark.django_db


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def finished_run(make_run: Any, make_user: Any, spec_dict: Any) -> Run:
    owner = make_user("alice")
    sweeps = [{"name": "concurrency", "axis": "max_concurrency", "values": [4, 8]}]
    workload = {"input_len": 128, "output_len": 32, "num_prompts": 32, "num_warmups": 0}
    spec = spec_dict(sweeps=sweeps, workload=workload, model={"id": "org/tiny-model"})
    run = make_run(owner=owner, spec=spec, status=RunStatus.RUNNING)
    ingestion.ingest_measurement(run, webdata.hf_measurement())
    for value, recording in ((4, webdata.RECORDED_C4), (8, webdata.RECORDED_C8)):
        data = webdata.recording(recording)
        ingestion.ingest_measurement(
            run, webdata.vllm_measurement("concurrency", "max_concurrency", value, data)
        )
    ingestion.ingest_event(run, rr.Event(type="finished", status="succeeded", errors=[]))
    run.refresh_from_db()
    return run


def test_the_run_page_shows_numbers_charts_and_downloads_to_its_owner(finished_run: Run) -> None:
    page = signed_in(finished_run.owner).get(finished_run.get_absolute_url())
    assert page.status_code == 200
    html = page.content.decode()
    assert "Succeeded" in html
    assert 'id="figures-data"' in html
    figures = page.context["figures"]
    assert [f["id"] for f in figures] == [
        "concurrency-output", "concurrency-rates", "concurrency-pareto", "concurrency-ttft",
        "concurrency-tpot", "concurrency-itl", "concurrency-e2el", "concurrency-server",
    ]  # fmt: skip
    # The throughput chart: the vLLM series at 4 and 8 plus the HF reference line.
    traces = figures[0]["figure"]["data"]
    assert traces[0]["x"] == [4.0, 8.0]
    assert traces[1]["name"] == "hf-sequential (baseline, 128 in / 32 out)"
    summary = page.context["summary"]
    assert summary["hf_output_throughput"] == 40.0
    assert summary["speedup"] == pytest.approx(summary["best"]["output_throughput"] / 40.0)
    assert "/static/web/vendor/plotly-basic.min.js" in html  # served by us, never a CDN
    assert "cdn" not in html.lower()
    assert "vllm serve org/tiny-model" in html  # reproduce commands


def test_run_downloads_give_the_spec_and_the_result_document(finished_run: Run) -> None:
    client = signed_in(finished_run.owner)
    spec = client.get(f"/runs/{finished_run.public_id}/spec.yaml")
    assert spec.status_code == 200
    assert b"model:" in spec.content and b"org/tiny-model" in spec.content
    result = client.get(f"/runs/{finished_run.public_id}/result.json")
    doc = json.loads(result.content)
    rr.ResultDocument.model_validate(doc)
    assert len(doc["measurements"]) == 3
    assert doc["status"] == "succeeded"


@pytest.mark.parametrize("who", ["other", "anon"])
def test_a_private_run_is_a_404_for_everyone_but_its_owner(
    finished_run: Run, make_user: Any, who: str
) -> None:
    client = signed_in(make_user("mallory")) if who == "other" else Client()
    for suffix in ("", "status.json", "spec.yaml", "result.json"):
        response = client.get(f"/runs/{finished_run.public_id}/{suffix}")
        assert response.status_code == 404, suffix


def test_a_public_run_is_readable_without_signing_in(finished_run: Run) -> None:
    Run.objects.filter(pk=finished_run.pk).update(is_public=True)
    assert Client().get(finished_run.get_absolute_url()).status_code == 200


def test_the_status_endpoint_reports_progress(make_run: Any) -> None:
    run = make_run(status=RunStatus.RUNNING, progress_done=2)
    state = signed_in(run.owner).get(f"/runs/{run.public_id}/status.json").json()
    assert state["status"] == "running"
    assert state["done"] == 2 and state["total"] == run.progress_total == 3
    assert state["final"] is False


def test_the_list_filters_and_shows_only_visible_runs(make_run: Any, make_user: Any) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    mine = make_run(owner=alice, status=RunStatus.FAILED)
    make_run(owner=alice)
    theirs = make_run(owner=bob)
    client = signed_in(alice)
    listed = client.get("/runs/").context["runs"]
    assert theirs not in listed and len(listed) == 2
    failed = client.get("/runs/?status=failed").context["runs"]
    assert failed == [mine]
    bad = client.get("/runs/?status=exploded")
    assert bad.status_code == 200 and "unknown status" in bad.content.decode()


def test_the_list_counts_up_to_a_cap_and_pages_past_it(
    make_run: Any, make_user: Any, monkeypatch: Any
) -> None:
    """Counting every visible run grows with the table: the list counts up to COUNT_CAP,
    says "More than N" past it and pages on without a last page; under it, the exact
    count and "page X of Y"; a page past the end is the last one."""
    import re

    from portal.web.views import runs as run_views

    alice = make_user("alice")
    made = [make_run(owner=alice) for _ in range(7)]
    make_run(owner=make_user("bob"))  # private to bob: never counted
    client = signed_in(alice)
    monkeypatch.setattr(run_views, "PAGE_SIZE", 3)

    def shown(url: str) -> tuple[str, str, list[Run]]:
        page = client.get(url)
        html = page.content.decode()
        count = re.search(r'id="run-count">([^<]*)', html).group(1)
        pager = re.search(r"<span>(page [^<]*)</span>", html)
        return count, pager.group(1) if pager else "", page.context["runs"]

    monkeypatch.setattr(run_views, "COUNT_CAP", 100)
    assert shown("/runs/")[:2] == ("7 runs you can see.", "page 1 of 3")
    assert shown("/runs/?page=9")[1:] == ("page 3 of 3", made[:1])  # the last page
    monkeypatch.setattr(run_views, "COUNT_CAP", 5)
    count, pager, first = shown("/runs/")
    assert (count, pager) == ("More than 5 runs you can see.", "page 1")
    assert first == made[::-1][:3]
    count, pager, third = shown("/runs/?page=3")
    assert pager == "page 3" and third == made[:1]  # past the cap, every run is reachable
    assert shown("/runs/?page=x")[1] == "page 1"


def test_a_list_row_shows_labels_progress_gpu_backends_and_escapes_names(
    make_run: Any,
) -> None:
    """The rows are rendered in Python (portal.web.run_rows): every cell, escaped."""
    from portal.benchmarks.models import Baseline

    run = make_run(
        name='<b>"x"</b>',
        status=RunStatus.RUNNING,
        progress_done=2,
        gpu_name="NVIDIA L4",
        gpu_count=2,
    )
    Baseline.objects.create(run=run, label="main")
    html = signed_in(run.owner).get("/runs/").content.decode()
    row = html[html.index(f'value="{run.public_id}"') :].split("</tr>")[0]
    assert "&lt;b&gt;&quot;x&quot;&lt;/b&gt;" in row and '<b>"x"</b>' not in row
    assert f'href="{run.get_absolute_url()}"' in row and run.short_id in row
    assert 'title="label: latest:main finds it">main</span>' in row
    assert '<span class="badge running">Running</span>' in row
    assert f"2/{run.progress_total}</span>" in row
    assert "NVIDIA L4 \N{MULTIPLICATION SIGN}2" in row
    assert f"<td>{', '.join(run.backend_display)}</td>" in row
    assert f"<td>{run.owner.get_username()}</td>" in row and " ago</td>" in row
    assert '<td class="num">—</td>' in row  # nothing measured yet


def test_the_form_needs_a_signed_in_user() -> None:
    response = Client().get("/runs/new/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_the_form_starts_from_the_seed_preset(make_user: Any) -> None:
    page = signed_in(make_user()).get("/runs/new/")
    assert page.status_code == 200
    form = page.context["form"]
    assert form.initial["model_id"] == "Qwen/Qwen3-0.6B"
    assert form.initial["concurrency"] == "1, 4, 16, 64"
    assert "Qwen/Qwen3-0.6B" in form.initial["spec_text"]


@pytest.mark.parametrize(
    ("fields", "form_field", "message"),
    [
        ({"model_id": "org/model;rm -rf /"}, "model_id", "not allowed"),
        ({"input_len": "-5"}, "input_len", "greater than or equal to 1"),
        ({"concurrency": "1, four"}, "concurrency", "not a positive whole number"),
        ({"concurrency": "4, 4"}, "concurrency", "unique"),
        ({"spec_text": "model: [unclosed"}, "spec_text", "not valid YAML"),
        (
            {"spec_text": "a: &a [x, x]\nb: [*a, *a]\nmodel: {id: a/b}"},
            "spec_text",
            "not valid YAML",
        ),
        ({"spec_text": "model: {id: a/b}\nbogus: 1"}, "spec_text", "bogus: unknown field"),
        ({"preset": "", "spec_text": ""}, "spec_text", "choose a preset"),
    ],
)
def test_bad_input_is_shown_next_to_its_field_and_nothing_is_queued(
    make_user: Any, fields: dict[str, str], form_field: str, message: str
) -> None:
    data = {"preset": "seed", "backends": ["hf-sequential", "vllm"], **fields}
    response = signed_in(make_user()).post("/runs/new/", data)
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert form_field in errors, errors
    assert any(message.lower() in e.lower() for e in errors[form_field]), errors[form_field]
    assert f'id="{form_field}-errors"' in response.content.decode()
    assert Run.objects.count() == 0


def test_a_valid_form_creates_the_run_and_opens_its_page(make_user: Any, settings: Any) -> None:
    settings.SERVEBENCH_LOCAL_GPUS = 1  # the seed asks for a GPU (preflight refuses it without)
    user = make_user()
    response = signed_in(user).post(
        "/runs/new/",
        {
            "preset": "seed",
            "name": "my sweep",
            "model_id": "Qwen/Qwen3-1.7B",
            "input_len": "512",
            "output_len": "64",
            "num_prompts": "100",
            "concurrency": "2, 8",
            "backends": ["vllm"],
        },
    )
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == run.get_absolute_url()
    assert run.owner == user and run.name == "my sweep"
    spec = run.spec
    assert spec["model"]["id"] == "Qwen/Qwen3-1.7B"
    assert spec["workload"]["input_len"] == 512 and spec["workload"]["num_prompts"] == 100
    assert spec["sweeps"][0]["values"] == [2, 8]
    assert [b["kind"] for b in spec["backends"]] == ["vllm"]
    # The seed's other sweeps are kept.
    assert [s["name"] for s in spec["sweeps"]] == ["concurrency", "prompt-length", "output-length"]


def test_the_owner_cancels_from_the_run_page(make_run: Any, make_user: Any) -> None:
    run = make_run(status=RunStatus.QUEUED)
    assert signed_in(make_user()).post(f"/runs/{run.public_id}/cancel/").status_code == 404
    response = signed_in(run.owner).post(f"/runs/{run.public_id}/cancel/")
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_tokens_are_shown_once_and_can_be_revoked(make_user: Any) -> None:
    user = make_user()
    client = signed_in(user)
    page = client.post("/tokens/", {"name": "github-actions"})
    plaintext = page.context["new_plaintext"]
    assert plaintext.startswith("sb_ci_")
    token = ApiToken.objects.get(user=user)
    assert plaintext not in (token.digest, token.lookup)
    assert plaintext not in client.get("/tokens/").content.decode()
    api = Client(headers={"Authorization": f"Bearer {plaintext}"})
    assert api.get("/api/v1/runs/").status_code == 200
    assert client.post("/tokens/", {"revoke": "not-a-number"}).status_code == 302
    client.post("/tokens/", {"revoke": token.pk})
    assert api.get("/api/v1/runs/").status_code == 401


def test_names_with_html_are_shown_as_text(make_run: Any) -> None:
    run = make_run(name='<script>alert("x")</script>')
    html = signed_in(run.owner).get(run.get_absolute_url()).content.decode()
    assert '<script>alert("x")</script>' not in html
    assert "&lt;script&gt;" in html


def test_plotly_js_is_served_from_our_static_files() -> None:
    from django.contrib.staticfiles import finders

    path = finders.find("web/vendor/plotly-basic.min.js")
    assert path and Path(path).stat().st_size > 1_000_000
    response = Client().get("/static/web/vendor/plotly-basic.min.js")
    assert response.status_code == 200


def test_the_runs_list_shows_each_runs_best_as_its_measurements_arrive(
    make_run: Any, settings: Any
) -> None:
    """The best output tok/s the runs list shows is kept by ingestion, measurement by
    measurement, as the list used to aggregate it on every read (``queries.current``):
    an SLA search's load that its confirmation superseded does not count, even when it
    was the fastest."""
    from portal.benchmarks import queries
    from runners import sla
    from runners import spec as rs
    from runners.vllm_bench import point_info

    settings.SERVEBENCH_ENDPOINT_HOSTS = ["*.svc.cluster.local"]
    run = make_run(spec=webdata.SEARCH_SPEC, status="running")
    spec = rs.parse_spec(run.spec)

    def kept_and_live() -> tuple[float | None, float | None]:
        row = Run.objects.annotate(live=queries.best_throughput()).get(pk=run.pk)
        return row.best_output_throughput, row.live

    assert kept_and_live() == (None, None)
    steps: list[sla.Step] = []
    rows: list[rr.Measurement] = []
    while (value := sla.next_value(spec.sla_search, steps)) is not None:
        repeat = sla.next_repeat(steps, value)
        stalled = (value, repeat) == (1, 0)  # missed, then measured again: superseded
        rows.append(
            rr.Measurement(
                backend="prod",
                backend_kind="endpoint",
                point=point_info(rs.search_point(spec, value)),
                repeat=repeat,
                status="succeeded",
                metrics={
                    "output_throughput": 9000.0 if stalled else 40.0 * value,
                    "p99_ttft_ms": 3100.0 if stalled or value > 12 else 150.0,
                },
                started_at="2026-11-30T06:00:00.000+00:00",
                finished_at="2026-11-30T06:00:05.000+00:00",
                duration_s=5.0,
            )
        )
        ingestion.ingest_measurement(run, rows[-1])
        steps = sla.steps_of(spec, "prod", rows)
        kept, live = kept_and_live()
        assert kept == live and kept is not None, (value, repeat)
    counted = [m.metrics["output_throughput"] for m in rows if m.metrics["output_throughput"] < 9e3]
    assert len(counted) == len(rows) - 1 > 3  # the stalled load was stored, then superseded
    assert kept_and_live()[0] == max(counted)
    html = signed_in(run.owner).get("/runs/").content.decode()
    assert f'<td class="num">{max(counted):.1f}</td>' in html and "9000" not in html

    # The migration that added the column computes the same for the runs stored before it.
    import importlib

    from django.db import connection

    swept = webdata.make_sweep_run(run.owner, [1, 4], repeats=2, seed=3)
    nothing = make_run(owner=run.owner)
    expected = {
        r.pk: r.live for r in Run.objects.annotate(live=queries.best_throughput()).order_by()
    }
    assert expected[swept.pk] and expected[nothing.pk] is None and len(expected) == 3
    Run.objects.update(best_output_throughput=None)
    migration = importlib.import_module(
        "portal.benchmarks.migrations.0014_run_best_output_throughput"
    )
    with connection.cursor() as cursor:
        cursor.execute(migration.BACKFILL)
    assert dict(Run.objects.values_list("pk", "best_output_throughput")) == expected


def store_in_thread(run: Run, measurement: rr.Measurement) -> tuple[Any, list[Any]]:
    """Store ``measurement`` through ingestion in a thread of its own (its own database
    connection), started: (the thread, [its backend's pid, then any exception])."""
    import threading

    from django.db import connection, connections

    told: list[Any] = []

    def store() -> None:
        try:
            connection.ensure_connection()
            told.append(connection.connection.info.backend_pid)
            ingestion.ingest_measurement(Run.objects.get(pk=run.pk), measurement)
        except BaseException as exc:  # reported by the caller
            told.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=store)
    thread.start()
    return thread, told


@pytest.mark.django_db(transaction=True)
def test_two_measurements_stored_at_once_both_count_for_the_best(make_run: Any) -> None:
    """Two measurements of one run stored in overlapping transactions: the second waits
    for the first's commit, then its refresh sees both (an UPDATE that had waited on the
    row would have computed in its own older snapshot and kept only its own)."""
    import time

    from django.db import connection, transaction

    from portal.benchmarks import queries

    run = make_run(spec=webdata.sweep_spec([4, 8]), status=RunStatus.RUNNING)
    data = webdata.recording(webdata.RECORDED_C8)
    fast = webdata.vllm_measurement("concurrency", "max_concurrency", 8, data)
    slow = webdata.vllm_measurement("concurrency", "max_concurrency", 4, data)
    fast.metrics["output_throughput"], slow.metrics["output_throughput"] = 900.0, 100.0
    with transaction.atomic():
        ingestion.ingest_measurement(run, fast)  # holds the run's row until this commits
        other, told = store_in_thread(run, slow)
        # pg_locks is read live (pg_stat_activity is a snapshot per transaction).
        waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = %s"
        deadline = time.monotonic() + 60
        while True:  # until the second one waits on the run's row
            with connection.cursor() as cursor:
                cursor.execute(waiting, [told[0] if told else 0])
                if cursor.fetchone()[0]:
                    break
            assert other.is_alive() and time.monotonic() < deadline, (
                f"the second store never waited for the first: {told}"
            )
            other.join(0.05)
    other.join(30)
    assert not other.is_alive() and len(told) == 1, told
    connection.close()
    kept = Run.objects.annotate(live=queries.best_throughput()).get(pk=run.pk)
    assert kept.live == 900.0 and kept.best_output_throughput == 900.0


@pytest.mark.django_db(transaction=True)
def test_stores_that_overlap_inside_their_inserts_do_not_deadlock(make_run: Any) -> None:
    """Storing a measurement holds its run's row FOR KEY SHARE (the foreign key) until it
    commits. Another store's refresh of the best must not wait on that (FOR UPDATE would,
    and the first store's own refresh would then wait on the second's: a deadlock)."""
    from django.db import connection, transaction

    from portal.benchmarks import queries

    run = make_run(spec=webdata.sweep_spec([4, 8]), status=RunStatus.RUNNING)
    data = webdata.recording(webdata.RECORDED_C8)
    second = webdata.vllm_measurement("concurrency", "max_concurrency", 4, data)
    with transaction.atomic():
        with connection.cursor() as cursor:  # what inserting a measurement holds
            cursor.execute("SELECT 1 FROM benchmarks_run WHERE id = %s FOR KEY SHARE", [run.pk])
        other, told = store_in_thread(run, second)
        other.join(30)
        assert not other.is_alive(), "the store waited on another store's foreign key"
        queries.refresh_best_throughput([run.pk])  # the first store's own refresh
    assert len(told) == 1, told
    connection.close()
    kept = Run.objects.get(pk=run.pk).best_output_throughput
    assert kept == second.metrics["output_throughput"]

"""Per-request samples in object storage: nothing lost, nothing bloating PostgreSQL.

The S3 path runs against a real S3-compatible server that the tests start (moto's server
mode, on a local port) through django-storages, exactly as a deployment talks to a bucket.
Bodies are sent as the runner sends them (``runners.report.encode``: gzip above 64 kB).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from django.test import Client

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token
from portal.benchmarks import samples, samplestore
from portal.benchmarks.models import Measurement, Run, RunStatus
from runners.report import Reporter, ReportRejected, encode
from runners.result import Measurement as RunnerMeasurement

pytestmark = pytest.mark.django_db

BUCKET = "servebench-samples"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto's S3-compatible server in a process of its own (stop/start: an outage)."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                requests.get(self.url, timeout=1)
                return
            except requests.RequestException:
                time.sleep(0.2)
        raise AssertionError("moto's S3 server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
            self.proc = None

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        )


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    server = S3Server()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server: S3Server, settings) -> S3Server:
    """The ``samples`` storage pointed at a fresh bucket of the S3 server."""
    if s3_server.proc is None:
        s3_server.start()
    client = s3_server.client()
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    settings.STORAGES = {
        **settings.STORAGES,
        "samples": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": BUCKET,
                "endpoint_url": s3_server.url,
                "region_name": "us-east-1",
                "access_key": "test",
                "secret_key": "test",
                "default_acl": None,
                "file_overwrite": True,
            },
        },
    }
    return s3_server


@pytest.fixture
def runner(make_run, personas, bearer_client):
    """A running run of the owner's with ``prompts`` requests per point, and a client with
    its run token."""

    def make(prompts: int = 8, output_len: int = 16):
        spec = {
            "name": "samples",
            "model": {"id": "org/tiny-model", "max_model_len": 4096},
            "workload": {"input_len": 64, "output_len": output_len, "num_prompts": prompts},
            "backends": [{"kind": "vllm"}],
            "resources": {"gpu_count": 0, "timeout_minutes": 10},
        }
        run = make_run(owner=personas["owner"].user, spec=spec, status=RunStatus.RUNNING)
        token = issue_token(run.owner, kind=ApiToken.Kind.RUN, run=run).plaintext
        return run, token, bearer_client(token)

    return make


def point_measurement(prompts: int, output_len: int, seed: int = 0) -> dict:
    """A measurement as the runner posts it, with every request's samples (vLLM's
    ``--save-detailed`` arrays: ``itls`` has output_len - 1 gaps per request)."""
    rng = random.Random(seed)
    ttfts = [0.05 + rng.random() * 0.02 for _ in range(prompts)]
    itls = [[0.004 + rng.random() * 0.001 for _ in range(output_len - 1)] for _ in range(prompts)]
    latencies = [t + sum(g) for t, g in zip(ttfts, itls, strict=True)]
    duration = sum(latencies) / 64
    return {
        "backend": "vllm",
        "backend_kind": "vllm",
        "point": {
            "key": "single",
            "sweep": "single",
            "input_len": 64,
            "output_len": output_len,
            "max_concurrency": 1,
            "num_prompts": prompts,
        },
        "repeat": 0,
        "status": "succeeded",
        "metrics": {
            "completed": prompts,
            "duration": duration,
            "output_throughput": prompts * output_len / duration,
            "mean_ttft_ms": 1000 * sum(ttfts) / prompts,
        },
        "raw": {"completed": prompts},
        "detail": {
            "input_lens": [64] * prompts,
            "output_lens": [output_len] * prompts,
            "ttfts": ttfts,
            "itls": itls,
            "latencies": latencies,
            "errors": [""] * prompts,
        },
        "started_at": "2026-11-30T06:00:00.000+00:00",
        "finished_at": "2026-11-30T06:10:00.000+00:00",
        "duration_s": 600.0,
    }


def post_measurement(client, run, body: dict):
    data, headers = encode(body)
    return client.generic(
        "POST",
        f"/api/v1/runner/runs/{run.public_id}/measurements",
        data,
        content_type=headers["Content-Type"],
        headers={k: v for k, v in headers.items() if k != "Content-Type"},
    )


def test_the_default_storage_is_a_directory(runner, settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "samples": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "samples")},
        },
    }
    run, _token, client = runner()
    assert post_measurement(client, run, point_measurement(8, 16)).status_code == 201
    row = Measurement.objects.get(run=run)
    path = tmp_path / "samples" / row.samples
    assert path.is_file() and path.stat().st_size == row.samples_bytes
    assert samples.details([row])[row.pk]["output_lens"] == [16] * 8


def test_a_storage_outage_is_a_503_the_runner_retries_and_nothing_half_stored(s3, runner):
    run, _token, client = runner()
    s3.stop()
    try:
        response = post_measurement(client, run, point_measurement(8, 16))
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "storage_unavailable"
        assert not Measurement.objects.filter(run=run).exists()
    finally:
        s3.start()
    s3.client().create_bucket(Bucket=BUCKET)
    assert post_measurement(client, run, point_measurement(8, 16)).status_code == 201
    assert samples.details(Measurement.objects.filter(run=run))


@pytest.mark.django_db(transaction=True)
def test_an_oversized_measurement_is_refused_and_the_run_cannot_succeed(
    runner, settings, live_server
):
    settings.SERVEBENCH_MAX_MEASUREMENT_BYTES = 100_000
    run, token, _client = runner(prompts=200, output_len=64)
    reporter = Reporter(f"{live_server.url}/api/v1/runner/runs/{run.public_id}", token)
    body = RunnerMeasurement.model_validate(point_measurement(200, 64))
    with pytest.raises(ReportRejected) as refused:
        reporter.measurement(body)
    assert refused.value.status == 413
    assert "SERVEBENCH_MAX_MEASUREMENT_BYTES" in str(refused.value)
    # The runner then says it finished; the portal does not have the measurement.
    from runners.result import Event

    reporter.event(Event(type="finished", status="succeeded"))
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "only 0 of 1 measurements reached the portal" in run.failure_reason


def test_a_gzip_bomb_is_refused_before_it_inflates(runner, settings):
    settings.SERVEBENCH_MAX_MEASUREMENT_BYTES = 1_000_000
    run, _token, client = runner()
    bomb = gzip.compress(b"{" + b" " * 50_000_000 + b"}")
    assert len(bomb) < 100_000
    response = client.generic(
        "POST",
        f"/api/v1/runner/runs/{run.public_id}/measurements",
        bomb,
        content_type="application/json",
        headers={"Content-Encoding": "gzip"},
    )
    assert response.status_code == 413
    not_gzip = client.generic(
        "POST",
        f"/api/v1/runner/runs/{run.public_id}/measurements",
        b"not gzip",
        content_type="application/json",
        headers={"Content-Encoding": "gzip"},
    )
    assert not_gzip.status_code == 400
    assert "not valid gzip" in not_gzip.json()["error"]["message"]


def test_the_result_document_carries_the_samples(s3, runner, personas):
    run, _token, client = runner()
    body = point_measurement(8, 16)
    assert post_measurement(client, run, body).status_code == 201
    document = personas["owner"].client.get(f"/api/v1/runs/{run.public_id}/result").json()
    assert document["measurements"][0]["detail"]["itls"] == body["detail"]["itls"]


def test_old_rows_with_samples_in_postgresql_still_read(make_run, personas):
    run = make_run(owner=personas["owner"].user, status=RunStatus.RUNNING)
    from portal.benchmarks import ingestion

    body = RunnerMeasurement.model_validate(
        {**point_measurement(8, 16), "point": {**point_measurement(8, 16)["point"]}}
    )
    columns = ingestion.measurement_columns(body)
    row = Measurement.objects.create(
        run=run, backend="legacy", point_key="single", repeat=0, **columns
    )
    assert row.samples == "" and row.detail["ttfts"]
    assert samples.details([row])[row.pk]["ttfts"] == body.detail["ttfts"]
    assert Path(samplestore.object_name(run.public_id, "vllm", "single", 0)).suffixes == [
        ".json",
        ".gz",
    ]


def _metrics_from(detail: dict) -> dict:
    """The latency summaries vLLM's client reports, from the samples (ms)."""
    from servebench.stats import percentile

    gaps = sorted(1000 * g for row in detail["itls"] for g in row)
    ttfts = sorted(1000 * t for t in detail["ttfts"])
    return {
        "median_itl_ms": percentile(gaps, 50),
        "p99_itl_ms": percentile(gaps, 99),
        "median_ttft_ms": percentile(ttfts, 50),
    }


def test_a_2000_by_1024_point_goes_to_s3_and_the_compare_verdict_reads_it_back(
    s3, runner, make_run, personas
):
    """Two 2,000 x 1,024 points through the real API into the bucket (~45 MB of samples
    each, gzip on the wire), the candidate's token gaps 25% longer, and a baseline series
    with history: the compare API's verdict on the token gaps bounds the change with a
    bootstrap over the per-request samples it reads back from S3."""
    owner = personas["owner"].user

    def poster(run):
        token = issue_token(owner, kind=ApiToken.Kind.RUN, run=run).plaintext
        return Client(headers={"Authorization": f"Bearer {token}"})

    base, _token, base_client = runner(prompts=2000, output_len=1024)
    body = point_measurement(2000, 1024)
    summary = _metrics_from(body["detail"])
    # Three earlier runs of the series: their summaries are the run-to-run history.
    for n in range(3):
        earlier = make_run(owner=owner, spec=base.spec, status=RunStatus.RUNNING)
        small = {**point_measurement(8, 16), "point": body["point"], "detail": {}}
        small["metrics"] |= {k: v * (1 + 0.01 * n) for k, v in summary.items()}
        assert post_measurement(poster(earlier), earlier, small).status_code == 201
    body["metrics"] |= summary
    raw = len(json.dumps(body, separators=(",", ":")))
    assert raw > 40_000_000 and encode(body)[1]["Content-Encoding"] == "gzip"
    assert post_measurement(base_client, base, body).status_code == 201
    row = Measurement.objects.get(run=base)
    assert row.detail == {}  # not in PostgreSQL
    assert row.samples and 0 < row.samples_bytes < raw / 2
    # The object is in the bucket, compressed, with every request's samples...
    stored = s3.client().get_object(Bucket=BUCKET, Key=row.samples)["Body"].read()
    assert len(stored) == row.samples_bytes
    assert json.loads(gzip.decompress(stored))["itls"] == body["detail"]["itls"]
    # ...and a retry of the same measurement stores nothing twice.
    assert post_measurement(base_client, base, body).status_code == 200
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"samples/{base.public_id}/")
    assert listed["KeyCount"] == 1
    slower = point_measurement(2000, 1024)
    slower["detail"]["itls"] = [[g * 1.25 for g in row] for row in slower["detail"]["itls"]]
    slower["metrics"] |= _metrics_from(slower["detail"])
    candidate = make_run(owner=owner, spec=base.spec, status=RunStatus.RUNNING)
    assert post_measurement(poster(candidate), candidate, slower).status_code == 201
    Run.objects.filter(owner=owner).update(status=RunStatus.SUCCEEDED)

    answer = (
        personas["owner"]
        .client.get(
            f"/api/v1/compare/?runs={base.public_id},{candidate.public_id}&baseline={base.public_id}"
        )
        .json()
    )
    row = next(r for r in answer["rows"] if r["metric"] == "p99_itl_ms")
    verdict = row["verdicts"][1]
    assert verdict["verdict"] == "worse"
    assert verdict["noise"] == "history" and verdict["history_runs"] >= 3
    assert "bootstrap" in verdict["method"]  # over the samples read back from the bucket
    assert verdict["interval"][0] < 0.25 < verdict["interval"][1]


def test_a_storage_outage_shows_on_the_run_page_with_what_to_do(s3, runner, personas):
    run, _token, client = runner()
    Run.objects.filter(pk=run.pk).update(is_public=True, progress_total=1)
    page, status = f"/runs/{run.public_id}/", f"/runs/{run.public_id}/status.json"
    s3.stop()
    try:
        assert post_measurement(client, run, point_measurement(8, 16)).status_code == 503
        assert post_measurement(client, run, point_measurement(8, 16)).status_code == 503
    finally:
        s3.start()
    run.refresh_from_db()
    since = run.storage_problem_since
    assert since is not None  # kept from the first failure, not moved by the retry
    owner = Client()
    owner.force_login(personas["owner"].user)
    html = owner.get(page).content.decode()
    assert 'id="storage-problem"' in html and "cannot store this run&#x27;s measurements" in html
    assert f"S3 bucket {BUCKET} at {s3.url}" in html  # what failed, for who can act on it
    assert "nothing is lost" in html and "Next: whoever runs the portal checks" in html
    assert f"Since {since:%H:%M:%S} UTC" in html
    live = owner.get(status).json()["storage_problem"]
    assert live.startswith(f"Since {since:%H:%M:%S} UTC: The portal cannot store")
    api = personas["owner"].client.get(f"/api/v1/runs/{run.public_id}/").json()
    assert api["storage_problem"] == live  # the CLI and CI see it too
    # Someone else sees that nothing is lost, not the storage's address or its error.
    someone = Client()
    someone.force_login(personas["other"].user)
    other = someone.get(status).json()["storage_problem"]
    assert "nothing is lost" in other and BUCKET not in other
    # The storage answers again: the next try stores it and the notice is gone.
    s3.client().create_bucket(Bucket=BUCKET)
    assert post_measurement(client, run, point_measurement(8, 16)).status_code == 201
    assert owner.get(status).json()["storage_problem"] == ""
    assert 'id="storage-problem" role="status" hidden' in owner.get(page).content.decode()


# --------------------------------------------------------------------------- large points
# A point past runners.samplesfile.inline_values() numbers: the runner streams its full
# arrays (PUT .../samples) and the measurement carries a reading sample of them.


@pytest.fixture
def dir_storage(settings, tmp_path) -> Path:
    settings.STORAGES = {
        **settings.STORAGES,
        "samples": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "samples")},
        },
    }
    return tmp_path / "samples"


@pytest.mark.django_db(transaction=True)
def test_a_point_too_large_to_travel_inline_streams_its_samples_and_pages_read_a_sample(
    runner, dir_storage, live_server, monkeypatch, personas
):
    from portal.benchmarks import documents, goodput
    from runners import samplesfile

    monkeypatch.setenv(samplesfile.INLINE_VALUES_ENV, "20000")
    run, token, _client = runner(prompts=600, output_len=64)
    body = point_measurement(600, 64)
    full = body["detail"]
    assert samplesfile.values_in(full) > 20000
    reporter = Reporter(f"{live_server.url}/api/v1/runner/runs/{run.public_id}", token)
    assert reporter.measurement(RunnerMeasurement.model_validate(body))["created"] is True
    # A retry (the runner did not hear the answer) uploads again and changes nothing.
    assert reporter.measurement(RunnerMeasurement.model_validate(body))["created"] is False

    row = Measurement.objects.get(run=run)
    info = row.samples_full
    assert info["requests"] == 600 and 200 <= info["kept"] <= 400
    stored = dir_storage / samplestore.full_name(row.samples)
    blob = stored.read_bytes()
    assert len(blob) == info["bytes"] and hashlib.sha256(blob).hexdigest() == info["sha256"]
    assert json.loads(gzip.decompress(blob)) == full  # every request, exactly

    read = samples.details([row])[row.pk]
    assert read["sample_of"] == 600 and len(read["ttfts"]) == info["kept"]
    pairs = set(zip(full["ttfts"], full["latencies"], strict=True))
    assert set(zip(read["ttfts"], read["latencies"], strict=True)) <= pairs
    # Goodput from the sample counts for the whole point: every request meets this SLO.
    read["duration"] = body["metrics"]["duration"]
    got = goodput.from_detail(read, {"ttft_ms": 1000.0})
    assert got["slo_attainment"] == 1.0
    assert got["request_goodput"] == pytest.approx(600 / body["metrics"]["duration"])

    # The run page's request-level intervals say they come from a random subset.
    from portal.benchmarks import points, runview

    results = runview.load(run).results
    points.attach_request_intervals(results)
    interval = results.points[0].uncertainty("mean_ttft_ms")
    assert f"a random {info['kept']:,} of its 600 requests" in interval.describe()

    doc = documents.result_document(run)["measurements"][0]
    assert doc["samples_full"] == info and len(doc["detail"]["ttfts"]) == info["kept"]
    RunnerMeasurement.model_validate(doc)  # the document's measurement reads back

    owner = personas["owner"].client
    query = "backend=vllm&point=single&repeat=0"
    download = owner.get(f"/api/v1/runs/{run.public_id}/samples?{query}")
    assert download.status_code == 200, download.content[:300]
    got_bytes = b"".join(download.streaming_content)
    assert hashlib.sha256(got_bytes).hexdigest() == info["sha256"]
    assert (
        personas["other"].client.get(f"/api/v1/runs/{run.public_id}/samples?{query}").status_code
        == 404
    )
    assert (
        owner.get(f"/api/v1/runs/{run.public_id}/samples?backend=vllm&point=x").status_code == 404
    )
    assert owner.get(f"/api/v1/runs/{run.public_id}/samples?{query}9999999999").status_code == 400


@pytest.mark.django_db(transaction=True)
def test_a_merge_that_spilled_uploads_the_samples_file_it_wrote(
    runner, dir_storage, live_server, tmp_path
):
    """A multi-client merge too large to hold wrote the full union to a file and put a
    reading sample in the measurement (runners.spilled): the reporter uploads that file."""
    from runners import samplesfile
    from runners.result import FullSamples

    run, token, _client = runner(prompts=600, output_len=64)
    body = point_measurement(600, 64)
    size, digest = samplesfile.write_file(body["detail"], tmp_path / "samples.json.gz")
    sample, kept = samplesfile.reading_sample(body["detail"], 5000, "s")
    m = RunnerMeasurement.model_validate(body | {"detail": sample}).model_copy(
        update={"samples_full": FullSamples(requests=600, kept=kept, bytes=size, sha256=digest)}
    )
    m.keep_samples_file(tmp_path / "samples.json.gz")
    reporter = Reporter(f"{live_server.url}/api/v1/runner/runs/{run.public_id}", token)
    assert reporter.measurement(m)["created"] is True
    row = Measurement.objects.get(run=run)
    stored = (dir_storage / samplestore.full_name(row.samples)).read_bytes()
    assert stored == (tmp_path / "samples.json.gz").read_bytes()
    assert samples.details([row])[row.pk]["ttfts"] == sample["ttfts"]
    assert "samples_file" not in json.dumps(m.model_dump(mode="json"))


def put_samples(
    client, run, blob: bytes, query: str = "backend=vllm&point=single&repeat=0", sha=None
):
    return client.generic(
        "PUT",
        f"/api/v1/runner/runs/{run.public_id}/samples?{query}",
        blob,
        content_type="application/gzip",
        headers={"X-Content-SHA256": sha or hashlib.sha256(blob).hexdigest()},
    )


def test_a_samples_upload_that_is_not_what_it_claims_is_refused_naming_why(
    runner, dir_storage, settings
):
    run, _token, client = runner()
    good = gzip.compress(json.dumps({"ttfts": [0.1]}).encode())

    def refused(response, status: int, words: str) -> None:
        assert response.status_code == status, response.content[:300]
        assert words in response.json()["error"]["message"], response.json()

    refused(put_samples(client, run, good, sha="0" * 64), 400, "X-Content-SHA256")
    refused(put_samples(client, run, good, sha="nothex"), 400, "X-Content-SHA256")
    refused(put_samples(client, run, b"not gzip at all"), 400, "not valid gzip")
    refused(put_samples(client, run, good[:-6]), 400, "truncated")
    refused(put_samples(client, run, gzip.compress(b"[1, 2]")), 400, "not a JSON object")
    refused(put_samples(client, run, good, "backend=nope&point=single&repeat=0"), 400, "backend")
    refused(put_samples(client, run, good, "backend=vllm&point=nope&repeat=0"), 400, "point")
    refused(put_samples(client, run, good, "backend=vllm&point=single&repeat=x"), 400, "repeat")
    refused(put_samples(client, run, good, "backend=vllm&point=single&repeat=5"), 400, "repeat")
    settings.SERVEBENCH_MAX_SAMPLES_BYTES = 10_000
    bomb = gzip.compress(b"{" + b" " * 5_000_000 + b"}")
    refused(put_samples(client, run, bomb), 413, "SERVEBENCH_MAX_SAMPLES_BYTES")
    assert not list(dir_storage.rglob("*.full.json.gz"))  # nothing half-stored

    # A measurement that names full samples nobody uploaded, or other ones, is refused.
    body = point_measurement(8, 16)
    body["samples_full"] = {"requests": 8, "kept": 8, "bytes": 100, "sha256": "a" * 64}
    refused(post_measurement(client, run, body), 400, "samples_full")
    assert put_samples(client, run, good).status_code == 201
    refused(post_measurement(client, run, body), 400, f"are {len(good)} bytes, not 100")
    assert not Measurement.objects.filter(run=run).exists()
    body["samples_full"]["bytes"] = len(good)
    assert post_measurement(client, run, body).status_code == 201

    _other, _t, other_client = runner()
    assert put_samples(other_client, run, good).status_code == 403  # another run's token
    run.status = RunStatus.SUCCEEDED
    run.save(update_fields=["status"])
    refused(put_samples(client, run, good), 409, "")

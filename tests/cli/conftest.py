"""Fixtures for the CLI tests: the portal's (PostgreSQL, Redis, factories, ``personas``,
``celery_worker``) loaded from ``tests/portal/conftest.py`` under a name of its own, plus:

- ``cli(*argv, token=..., url=...)``: run ``servebench.cli.main`` in this process against
  the live test server; returns exit code, stdout and stderr.
- ``measured_run(owner, shift=..., seed=...)``: a succeeded run whose measurements carry
  per-request arrays drawn from a seeded distribution (latencies scaled by ``1 + shift``),
  stored through the real ingestion service. Compare tests use these where a real
  benchmark would only add minutes; ``test_cli_real_runs.py`` uses real ones.
"""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_portal_conftest() -> Any:
    path = REPO / "tests" / "portal" / "conftest.py"
    spec = importlib.util.spec_from_file_location("servebench_tests_cli_portal_conftest", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while loading
    spec.loader.exec_module(module)
    return module


_portal = _load_portal_conftest()
for _name in dir(_portal):
    _value = getattr(_portal, _name)
    if type(_value).__name__ == "FixtureFunctionDefinition":
        globals()[_name] = _value
wait_for = _portal.wait_for
tiny_spec = _portal.tiny_spec
measurement_body = _portal.measurement_body
database_url_for_tests = _portal.database_url_for_tests
SESSION = _portal._SESSION


def pytest_configure(config: pytest.Config) -> None:
    _portal.pytest_configure(config)


@pytest.fixture(scope="module")
def module_worker() -> Iterator[Callable[[str, Path], subprocess.Popen[bytes]]]:
    """``start(public_url, log)``: a real Celery worker with beat, as ``celery_worker``
    starts one, but living for the whole module (call it with database access unblocked:
    it points the worker at the test database). Stopped when the module ends."""
    started: list[subprocess.Popen[bytes]] = []

    def start(public_url: str, log: Path) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "DATABASE_URL": database_url_for_tests(),
            "SERVEBENCH_PUBLIC_URL": public_url,
            "SERVEBENCH_RECONCILE_SECONDS": "5",
            "SERVEBENCH_DB_CONN_MAX_AGE": "0",
            "PYTHONUNBUFFERED": "1",
        }
        cmd = [
            sys.executable, "-m", "celery", "-A", "portal.celery", "worker",
            "--loglevel", "INFO", "--concurrency", "1", "--pool", "prefork",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", f"cli-{SESSION}-{len(started)}@%h", "-Q", env["SERVEBENCH_QUEUE"],
            "--beat", "--schedule", str(log.parent / f"celerybeat-{len(started)}"),
        ]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        started.append(proc)
        deadline = time.monotonic() + 90
        while " ready." not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the celery worker did not start:\n{log.read_text()}")
            time.sleep(0.3)
        return proc

    yield start
    for proc in started:
        _portal._stop(proc, timeout=30)


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


@pytest.fixture
def cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., CliResult]:
    """``cli("compare", a, b, url=live_server.url, token=t)``; env vars are cleared so a
    test states everything it relies on."""
    from servebench.cli import main

    def run(*argv: str, url: str | None = None, token: str | None = None) -> CliResult:
        monkeypatch.delenv("SERVEBENCH_URL", raising=False)
        monkeypatch.delenv("SERVEBENCH_TOKEN", raising=False)
        if url is not None:
            monkeypatch.setenv("SERVEBENCH_URL", url)
        if token is not None:
            monkeypatch.setenv("SERVEBENCH_TOKEN", token)
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def request_arrays(
    rng: random.Random, n: int, shift: float, output_len: int = 16, spread: float = 0.25
) -> dict[str, list[Any]]:
    """Per-request arrays shaped like vLLM's bench client's (seconds), latencies scaled
    by ``1 + shift``."""
    scale = 1.0 + shift
    ttfts = [rng.lognormvariate(-3.0, spread) * scale for _ in range(n)]
    itls = [
        [rng.lognormvariate(-5.0, spread) * scale for _ in range(output_len - 1)] for _ in range(n)
    ]
    latencies = [t + sum(gaps) for t, gaps in zip(ttfts, itls, strict=True)]
    return {
        "input_lens": [64] * n,
        "output_lens": [output_len] * n,
        "ttfts": ttfts,
        "itls": itls,
        "latencies": latencies,
        "errors": [""] * n,
    }


def metrics_from(detail: dict[str, list[Any]], concurrency: int) -> dict[str, float]:
    """The client's summary metrics for these arrays (vLLM's definitions)."""
    from servebench.verdict import latency_samples, percentile

    n = len(detail["latencies"])
    out_tokens = sum(detail["output_lens"])
    duration = sum(detail["latencies"]) / concurrency
    metrics: dict[str, float] = {
        "duration": duration,
        "completed": float(n),
        "failed": 0.0,
        "total_input_tokens": float(sum(detail["input_lens"])),
        "total_output_tokens": float(out_tokens),
        "request_throughput": n / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (out_tokens + sum(detail["input_lens"])) / duration,
    }
    for name in ("ttft", "tpot", "itl", "e2el"):
        values = sorted(latency_samples(detail, name))
        metrics[f"mean_{name}_ms"] = sum(values) / len(values)
        metrics[f"median_{name}_ms"] = percentile(values, 50)
        for p in (90, 99):
            metrics[f"p{p}_{name}_ms"] = percentile(values, p)
    return metrics


@pytest.fixture
def measured_run(make_run: Callable[..., Any]) -> Callable[..., Any]:
    """A succeeded run of ``tiny_spec`` (hf baseline + vLLM at concurrency 1 and 4) with
    seeded per-request data; ``failed=True`` makes it a failed run with a reason."""
    from portal.benchmarks import ingestion
    from portal.benchmarks.models import Run, RunStatus
    from runners.result import Measurement

    def make(
        owner: Any,
        *,
        shift: float = 0.0,
        seed: int = 0,
        n: int = 64,
        failed: bool = False,
        spec: dict[str, Any] | None = None,
        is_public: bool = False,
    ) -> Run:
        run = make_run(owner, spec=spec, status=RunStatus.RUNNING, is_public=is_public)
        rng = random.Random(seed)
        points = [("hf-sequential", "baseline", 1), ("vllm", "concurrency:max_concurrency=1", 1)]
        points.append(("vllm", "concurrency:max_concurrency=4", 4))
        for backend, key, concurrency in points:
            detail = request_arrays(rng, n, shift)
            body = measurement_body(backend, key, detail=detail)
            body["point"]["max_concurrency"] = concurrency
            if key == "baseline":
                body["point"].update(sweep="baseline", axis=None, value=None)
            body["metrics"] = metrics_from(detail, concurrency)
            body["raw"] = {"completed": n}
            ingestion.ingest_measurement(run, Measurement.model_validate(body))
        if failed:
            Run.objects.filter(pk=run.pk).update(
                status=RunStatus.FAILED, failure_reason="server failed to start: out of memory"
            )
        else:
            Run.objects.filter(pk=run.pk).update(
                status=RunStatus.SUCCEEDED, progress_done=3, progress_total=3
            )
        run.refresh_from_db()
        return run

    return make

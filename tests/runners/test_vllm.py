"""vLLM on the tiny model: a real server, vLLM's real bench client, real signals.

Server starts cost 30-100 s each on 2 CPU cores, so they are few: the point-level tests use
the session's shared server (``shared_vllm``, prefix caching on, compiled), and this
module starts one run interrupted mid-point, one interrupted during startup and one server
it kills, eager (``vllm_runs.py``). The command line's full run and the starts that fail
assert nothing a busy CPU changes: they are in ``test_vllm_cli.py``.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from shared_servers import shared_vllm_spec
from vllm_runs import gone, spec_for

from runners import clientmerge, clientpods, clientprobe, procs, samplesfile, vllm_bench
from runners import multiclient as mc
from runners.bottleneck import diagnose
from runners.multiclient import with_clients
from runners.result import ResultDocument
from runners.runner import ExitCode
from runners.spec import Point
from runners.vllm_bench import measure_point
from runners.vllm_server import VLLMServer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("have_vllm")]


def descendants_matching(proc: subprocess.Popen, needle: str, timeout_s: float) -> list[int]:
    """Wait until a descendant's command line contains ``needle``; return all descendants."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the runner exited early"
        kids = psutil.Process(proc.pid).children(recursive=True)
        for kid in kids:
            try:
                if needle in " ".join(kid.cmdline()):
                    return [k.pid for k in kids]
            except psutil.Error:
                continue
        time.sleep(0.5)
    raise AssertionError(f"no child running {needle!r} within {timeout_s} s")


def start_cli(spec, tmp_path: Path, *extra: str) -> subprocess.Popen:
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    argv = [sys.executable, "-m", "runners", "run", str(tmp_path / "spec.json")]
    argv += ["--out", str(tmp_path / "result.json"), "--workdir", str(tmp_path / "work"), *extra]
    with open(tmp_path / "stderr.txt", "w") as stderr:
        # SIGINT ignored, as a shell's background job (and CI harnesses) leave it: the
        # runner must still stop on it (it once ran on for minutes, then left orphans).
        return subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )


# --------------------------------------------------------------------------- one server


@pytest.fixture(scope="module")
def cached(shared_vllm, tmp_path_factory):
    """Spec, backend and the shared running server, prefix caching on (reset between
    points)."""
    spec = shared_vllm_spec(
        shared_vllm.spec.model.id,
        {"input_len": 64, "output_len": 16, "num_prompts": 16, "num_warmups": 1},
        sweeps=[{"name": "concurrency", "axis": "max_concurrency", "values": [1, 4]}],
    )  # spec_for's load, the shared server's model and backend
    workdir = tmp_path_factory.mktemp("vllm")
    return spec, shared_vllm.backend, shared_vllm.running(), workdir


def test_prefix_cache_reset_keeps_repeated_points_honest(cached):
    spec, backend, server, workdir = cached
    point = Point(
        sweep="prefix",
        axis=None,
        value=None,
        input_len=256,
        output_len=8,
        max_concurrency=4,
        num_prompts=16,
        request_rate=None,
    )
    first = measure_point(server, spec, backend, point, 0, workdir)
    # The same prompts again *without* the reset: what a warm cache does to a point.
    no_reset = backend.model_copy(update={"enable_prefix_caching": False})
    warm = measure_point(server, spec, no_reset, point, 1, workdir)
    again = measure_point(server, spec, backend, point, 2, workdir)
    assert [m.status for m in (first, warm, again)] == ["succeeded"] * 3, first.error
    rates = [m.server_metrics.prefix_cache_hit_rate for m in (first, warm, again)]
    assert all(r is not None for r in rates)
    assert rates[1] > 0.5 > rates[0]
    assert rates[2] < 0.5
    sm = first.server_metrics
    assert sm.prefix_cache_queries > 0 and sm.preemptions == 0 and sm.samples > 0
    assert first.commands["serve"].startswith("VLLM_SERVER_DEV_MODE=1 vllm serve ")
    assert "--enable-prefix-caching" in first.commands["serve"]


def test_a_point_whose_requests_fail_is_failed_never_zero(cached):
    spec, backend, server, workdir = cached
    too_long = Point(
        sweep="too-long",
        axis=None,
        value=None,
        input_len=1100,  # the server was started with max_model_len 1024
        output_len=16,
        max_concurrency=2,
        num_prompts=4,
        request_rate=None,
    )
    m = measure_point(server, spec, backend, too_long, 0, workdir)
    assert m.status == "failed"
    assert m.metrics == {}
    assert "maximum context length" in m.error or "max_model_len" in m.error, m.error
    assert server.alive  # one bad point does not take the server down


def test_a_points_metrics_time_series_shows_its_ramp(cached):
    """/metrics sampled ten times a second: a point of a second or more on the CPU has
    the idle server before it, requests in flight together during it, and every request's
    send time on the same clock (issue 15). Its length depends on the machine's pace
    (48 of these requests took 0.7 s on one 2-core machine, seconds on another), so the
    samples are counted against the window's length."""
    spec, backend, server, workdir = cached
    point = Point(
        sweep="ramp",
        axis="max_concurrency",
        value=8,
        input_len=64,
        output_len=64,
        max_concurrency=8,
        num_prompts=128,
        request_rate=None,
    )
    m = measure_point(server, spec, backend, point, 0, workdir)
    assert m.status == "succeeded", m.error
    telemetry = m.telemetry
    lo, hi = telemetry["window"]
    series = telemetry["server"]
    assert telemetry["sampler"]["scrape"] == "filtered"  # vLLM honours name[]
    assert len(telemetry["requests"]["sent"]) == 128
    assert min(telemetry["requests"]["sent"]) == lo
    before = [r for t, r in zip(series["t"], series["running"], strict=True) if t < lo]
    during = [r for t, r in zip(series["t"], series["running"], strict=True) if lo <= t <= hi]
    assert before and before[0] == 0  # idle until the first request
    # At least 5 Hz across the window (the sampler's 10 Hz, less a busy machine's delays).
    assert len(during) >= max(3, 5 * (hi - lo)), (lo, hi, series["t"])
    assert max(during) >= 4  # several requests in flight at once: the ramp
    assert any(v and v > 0 for v in series["kv_cache_usage"])
    assert telemetry["sampler"]["share_of_point_cpu"] < 0.2
    # No NVIDIA GPU here: said, not zero.
    gpu = telemetry["gpu"]
    assert gpu["status"] == "ok" or gpu["status"].startswith("not measured (no NVML): ")
    assert ("energy_per_output_token_j" in m.metrics) == (gpu["status"] == "ok")


# --------------------------------------------------------------------------- many clients


def assert_released_together(clients: list[dict], skew: dict, why: str) -> None:
    """What the start barrier guarantees, on a machine that may starve any one process
    for a second (a CI run: one of three clients ran 1,085 ms late while the other two
    were within 1 ms): no client starts before the common start time; most start within
    a few scheduler wake-ups of it (without the barrier they would start seconds apart:
    each imports vLLM and loads its tokenizer first); a late one is reported as late, and
    the skew reported is exactly the spread of the clients' own lateness."""
    late = sorted(c["start_late_ms"] for c in clients)
    assert late[0] >= 0, why  # nobody before the start time
    assert late[(len(late) - 1) // 2] < 100, why  # most on time
    assert skew["release_ms"] == pytest.approx(late[-1] - late[0], abs=0.01), why


def _client_paths(workdir: Path, m, n: int) -> list[Path]:
    stem = f"{m.backend}-{m.point.key.replace(':', '-').replace('=', '')}-r{m.repeat}"
    return [workdir / f"{stem}.c{i}.json" for i in range(n)]


def test_three_clients_merge_exactly_into_one_measurement(cached):
    spec, backend, server, workdir = cached
    spec3 = spec.model_copy(update={"workload": spec.workload.model_copy(update={"clients": 3})})
    point = Point(
        sweep="clients",
        axis=None,
        value=None,
        input_len=32,
        output_len=8,
        max_concurrency=6,
        num_prompts=18,
        request_rate=None,
    )
    m = measure_point(server, spec3, backend, point, 0, workdir)
    assert m.status == "succeeded", m.error
    paths = _client_paths(workdir, m, 3)
    files = [json.loads(p.read_text()) for p in paths]
    assert [f["num_prompts"] for f in files] == [6, 6, 6]
    assert [f["max_concurrency"] for f in files] == [2, 2, 2]
    # Independently: numpy over the union of the three clients' own samples.
    ok = [(f, i) for f in files for i, e in enumerate(f["errors"]) if not e]
    assert len(ok) == 18 == m.metrics["completed"]
    ttfts = [f["ttfts"][i] for f, i in ok]
    lats = [f["latencies"][i] for f, i in ok]
    itls = [g for f, i in ok for g in f["itls"][i]]
    for name, values in (("ttft", ttfts), ("e2el", lats), ("itl", itls)):
        assert m.metrics[f"median_{name}_ms"] == pytest.approx(np.median(values) * 1000)
        for p in (50, 90, 99):
            want = np.percentile(values, p) * 1000
            assert m.metrics[f"p{p}_{name}_ms"] == pytest.approx(want), (name, p)
    first = min(f["start_times"][i] for f, i in ok)
    last = max(f["start_times"][i] + f["latencies"][i] for f, i in ok)
    assert m.metrics["request_throughput"] == pytest.approx(18 / (last - first))
    assert m.metrics["total_output_tokens"] == sum(f["total_output_tokens"] for f in files)
    # A merge of one client is that client's own numbers (vLLM's definitions).
    alone, _ = clientmerge.merge(paths[:1])
    for key in ("mean_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p90_itl_ms", "p99_e2el_ms"):
        assert alone[key] == pytest.approx(files[0][key]), key
    # Each client's own numbers and evidence are kept; the start skew is reported.
    assert [c["num_prompts"] for c in m.raw["clients"]] == [6, 6, 6]
    assert len(m.detail["ttfts"]) == 18
    clients = m.conditions["clients"]
    assert [c["index"] for c in clients] == [0, 1, 2]
    assert all(c["requests"] == 6 and "cpu_per_wall" in c for c in clients)
    assert all("send_lag_p99_ms" in c for c in clients)
    skew = m.conditions["client_skew"]
    why = f"skew {skew}, clients {clients}, contended: {m.conditions.get('reasons')}"
    assert_released_together(clients, skew, why)
    assert skew["first_send_ms"] >= 0, why
    assert m.commands["bench"].count("vllm bench serve") == 3


def test_a_point_too_large_to_hold_spills_its_token_gaps_and_carries_a_reading_sample(
    cached, monkeypatch
):
    """Three clients whose union passes the inline limit (lowered here): the runner never
    holds the union's token gaps (``runners.spilled``), its numbers are still numpy's
    over the union, the full union is in the samples file the reporter uploads, and the
    measurement carries a reading sample of it (``runners.samplesfile``)."""
    spec, backend, server, workdir = cached
    monkeypatch.setenv(samplesfile.INLINE_VALUES_ENV, "120")
    spec3 = spec.model_copy(update={"workload": spec.workload.model_copy(update={"clients": 3})})
    point = Point(
        sweep="clients", axis=None, value=None, input_len=32, output_len=8,
        max_concurrency=6, num_prompts=18, request_rate=None,
    )  # fmt: skip
    m = measure_point(server, spec3, backend, point, 1, workdir)
    assert m.status == "succeeded", m.error
    files = [json.loads(p.read_text()) for p in _client_paths(workdir, m, 3)]
    union = {k: [v for f in files for v in f[k]] for k in clientmerge.DETAIL_KEYS}
    assert m.samples_full is not None and m.samples_file is not None
    assert m.samples_full.requests == 18 and 0 < m.samples_full.kept < 18
    assert json.loads(gzip.decompress(m.samples_file.read_bytes())) == union
    assert m.detail["sample_of"] == 18 and len(m.detail["itls"]) == m.samples_full.kept
    assert "samples_file" not in m.raw and "samples_full" not in m.model_dump(mode="json")["raw"]
    ok = [i for i, e in enumerate(union["errors"]) if not e]
    itls = [g for i in ok for g in union["itls"][i]]
    for name, values in (("ttft", [union["ttfts"][i] for i in ok]), ("itl", itls)):
        for p in (50, 99):
            want = np.percentile(values, p) * 1000
            assert m.metrics[f"p{p}_{name}_ms"] == pytest.approx(want), (name, p)
    assert m.metrics["mean_itl_ms"] == pytest.approx(np.mean(itls) * 1000)
    # The telemetry's window is every request's, not the reading sample's.
    first = min(union["start_times"][i] for i in ok)
    last = max(union["start_times"][i] + union["latencies"][i] for i in ok)
    t0 = m.telemetry["t0"]
    assert m.telemetry["window"] == pytest.approx([first - t0, last - t0], abs=2e-4)


def test_clients_in_pods_meet_at_the_rendezvous_and_their_samples_merge_exactly(cached):
    """What each client Pod runs (``runners.podclient``: vLLM's bench client, the HTTP
    start barrier, the uploads) against the runner's rendezvous, as processes here: each
    in a directory of its own, as each Pod has its own disk. Only the Pods' creation is
    left to the cluster tests."""
    spec, backend, server, workdir = cached
    two = with_clients(spec, 2)
    point = Point(
        sweep="pods",
        axis=None,
        value=None,
        input_len=32,
        output_len=8,
        max_concurrency=4,
        num_prompts=8,
        request_rate=None,
    )
    group = vllm_bench._clients(two, point, server, backend, workdir, "pods", 2, None)
    began = time.perf_counter()
    with clientpods.Rendezvous(group, "127.0.0.1") as meet:
        children = []
        for c in group:
            argv = clientpods.pod_argv(c.argv)
            argv[0] = sys.executable
            argv[argv.index("--result-dir") + 1] = str(workdir / f"pod{c.index}")
            command = [sys.executable, "-m", "runners.podclient", "--rendezvous", meet.url]
            children.append(
                subprocess.Popen(
                    [*command, "--index", str(c.index), "--", *argv],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=procs.python_env(),
                )
            )
        deadline = time.monotonic() + 300
        while not meet.all_ready():
            assert all(p.poll() is None for p in children), [p.communicate() for p in children]
            assert time.monotonic() < deadline, "the clients never reached the barrier"
            time.sleep(0.05)
        meet.release(time.time() + clientpods.START_DELAY_S)
        said = [p.communicate(timeout=300)[0] for p in children]
        assert [p.returncode for p in children] == [0, 0], said
        assert all(meet.has(c.index, k) for c in group for k in clientpods.FILES)
    result, report = workdir / "pods.json", workdir / "pods.fields.json"
    offset = time.time() - time.perf_counter()
    code, _, evidence = mc.merge_clients(group, result, report, None, None, clock_offset=offset)
    merged = json.loads(result.read_text())
    files = [json.loads(c.result.read_text()) for c in group]
    assert code == 0 and [f["num_prompts"] for f in files] == [4, 4]
    assert merged["completed"] == 8 == sum(f["completed"] for f in files)
    # On one host the clocks agree: the union is where the runner saw it happen.
    assert began < min(merged["start_times"]) < time.perf_counter()
    assert [e["requests"] for e in evidence] == [4, 4]
    assert_released_together(evidence, merged["skew"], f"{merged['skew']} {evidence}")
    assert all("Starting main benchmark run" in c.log.read_text() for c in group)


def test_clients_auto_probes_the_server_and_keeps_the_count_that_still_raised_the_rate(cached):
    spec, backend, server, workdir = cached
    auto = with_clients(spec, "auto")
    point = clientprobe.probe_point(clientprobe.heaviest(auto))
    assert (point.key, point.num_prompts) == ("clients-probe:max_concurrency=4", 16)
    probes = workdir / "clients-probe"
    probes.mkdir()
    measured = []

    def measure(n: int):
        m = measure_point(server, with_clients(auto, n), backend, point, n, probes)
        measured.append(m)
        return m

    probe = clientprobe.run("vllm", point, 2, measure)
    assert [m.status for m in measured] == ["succeeded", "succeeded"], measured[-1].error
    assert [len(m.conditions["clients"]) for m in measured] == [1, 2]
    rates = [m.metrics["request_throughput"] for m in measured]
    assert [t["request_throughput"] for t in probe.tried] == rates
    # Two clients are kept only where they raised the achieved rate by a tenth or more.
    assert probe.chosen == (2 if rates[1] >= 1.1 * rates[0] else 1), probe.why
    assert probe.why.startswith(f"1 client {rates[0]:.4g} req/s, 2 clients {rates[1]:.4g} req/s")
    assert probe.as_dict()["point"] == "clients-probe:max_concurrency=4"


def _starve_client_when_timed(log: Path, core: int, done: threading.Event) -> list:
    """Hold the bench client to a small share of one core while it times its requests.

    As soon as the client process exists (it then spends seconds importing vLLM), its
    threads are pinned to ``core`` beside a busy competitor there: from then on it has at
    most half of that core, so its timed requests are starved whenever they start (a CI
    run saw all 8 finish in 0.15 s, before a watcher that waited for the log line to pin
    it had done so). Once the log says the timed requests start, its session's scheduling
    group (the client runs in a session of its own: Linux autogroup) goes to nice 15
    against the competitor's 0: CFS weights 36 against 1024, about 3% of the core.
    Returns [competitor] once it started."""
    started: list = []

    def client_process() -> psutil.Process | None:
        for k in psutil.Process().children(recursive=True):
            try:
                if "runners.bench_client" in " ".join(k.cmdline()):
                    return k
            except psutil.NoSuchProcess:
                continue
        return None

    def watch() -> None:
        client = None
        while not done.is_set() and (client := client_process()) is None:
            time.sleep(0.01)
        if client is None:
            return
        started.append(
            subprocess.Popen(
                [sys.executable, "-c", "while True: pass"],
                preexec_fn=lambda: os.sched_setaffinity(0, {core}),
                start_new_session=True,
            )
        )
        for thread in client.threads():
            os.sched_setaffinity(thread.id, {core})  # threads it starts later inherit it
        while not done.is_set():
            if log.exists() and "Starting main benchmark run" in log.read_text(errors="replace"):
                Path(f"/proc/{client.pid}/autogroup").write_text("15")
                return
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    return started


def test_a_client_held_to_a_fraction_of_a_core_is_named_the_limit(cached, monkeypatch):
    spec, backend, server, workdir = cached
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")  # its log says at once when it starts
    point = Point(
        sweep="starved",
        axis=None,
        value=None,
        input_len=16,
        # 128 tokens each: the timed requests outlast the watcher's reaction to the log
        # line that starts them (with 16, a fast machine finished all 8 in 0.10 s, before
        # the client's nice took hold, and nothing limited it: 0.9-2.0 s here with 128)
        output_len=128,
        max_concurrency=8,
        num_prompts=8,  # all sent at once: no kept-alive connection idles past the server's
        request_rate=None,  # keep-alive while the client is starved (a disconnect)
    )
    log = workdir / "vllm-starved-r0.client.log"
    done = threading.Event()
    competitor = _starve_client_when_timed(log, sorted(os.sched_getaffinity(0))[-1], done)
    try:
        m = measure_point(server, spec, backend, point, 0, workdir)
    finally:
        done.set()
        for proc in competitor:
            proc.kill()
            proc.wait()
    assert competitor, "the bench client process never appeared"
    assert m.status == "succeeded", m.error
    (client,) = m.conditions["clients"]
    found = diagnose(m.model_dump())
    assert found.cause == "client", (found, client, m.conditions.get("reasons"), m.metrics)
    assert "workload.clients: 2" in found.sentence or "more cores" in found.sentence


@pytest.mark.stops_shared_vllm  # after every other test that uses the shared server
def test_stopping_the_server_ends_its_whole_process_group(cached):
    _, _, server, _ = cached
    pgid = server.pid
    members = procs.group_members(pgid)
    assert pgid in members and len(members) >= 2  # API server + engine core
    server.stop()
    assert procs.group_members(pgid) == []
    assert gone(members)


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("sig", "wait_for", "what"),
    [
        (signal.SIGTERM, "runners.bench_client", "SIGTERM"),
        (signal.SIGINT, "vllm.entrypoints.openai.api_server", "SIGINT (Ctrl-C)"),
    ],
    ids=["sigterm-mid-point", "sigint-during-startup"],
)
def test_an_interrupted_run_leaves_no_process_behind(tiny_model, tmp_path, sig, wait_for, what):
    # Long enough that the signal lands while the point (or the startup) is under way.
    spec = spec_for(
        tiny_model,
        workload={"input_len": 64, "output_len": 64, "num_prompts": 2000, "num_warmups": 1},
        sweeps=[{"name": "concurrency", "axis": "max_concurrency", "values": [1]}],
    )
    runner = start_cli(spec, tmp_path)
    try:
        children = descendants_matching(runner, wait_for, timeout_s=600)
        time.sleep(3)
        children = sorted({*children, *(k.pid for k in psutil.Process(runner.pid).children(True))})
        started = time.monotonic()
        runner.send_signal(sig)
        assert runner.wait(timeout=120) == ExitCode.INTERRUPTED
        took = time.monotonic() - started
    finally:
        if runner.poll() is None:
            runner.kill()
    assert gone(children), (tmp_path / "stderr.txt").read_text()[-2000:]
    assert all(procs.group_members(pid) == [] for pid in children)
    document = ResultDocument.model_validate_json((tmp_path / "result.json").read_text())
    assert document.status == "failed"
    assert document.errors[-1]["message"].startswith(f"interrupted by {what}")
    assert took < 30, f"the runner took {took:.0f} s to stop"


def test_engine_processes_die_with_the_api_server_and_the_reason_names_the_signal(
    tiny_model, tmp_path
):
    spec = spec_for(tiny_model)
    with VLLMServer(spec, spec.vllm_backends[0], tmp_path / "server.log") as server:
        assert server.pid is not None
        group = procs.group_members(server.pid)
        assert len(group) > 1, "vLLM's engine runs in processes of the server's group"
        server.proc.send_signal(signal.SIGKILL)  # the API server dies; its engine must not live on
        server.proc.wait()
        deadline = time.monotonic() + 10
        while procs.group_members(server.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert procs.group_members(server.pid) == [] and gone(group)
        assert server.ended() == "was killed by signal SIGKILL (9)"
        assert not server.alive

"""The runner's command line and its server's start on a real vLLM (the tiny model), which
check records and processes, not speed: a concurrency sweep through ``python -m runners
run`` reported to a portal, a server that cannot load its model, and one that misses its
start deadline.

They assert nothing a busy CPU changes (every bound is on what was recorded, none on how
fast), so they are marked ``shares_cpu`` and run beside the cluster's tests
(``scripts/suite.py``). The tests that judge what vLLM measured, and those that bound how
fast a run stops, are in ``test_vllm.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest
from vllm_runs import CLIENT_KEYS, VLLM_KEYS, gone, spec_for

from runners import procs
from runners.conditions import format_cpu_list
from runners.multiclient import with_clients
from runners.result import ResultDocument
from runners.runner import ExitCode, Runner
from runners.vllm_server import ServerError, VLLMServer

pytestmark = [pytest.mark.slow, pytest.mark.shares_cpu, pytest.mark.usefixtures("have_vllm")]


def test_a_server_that_cannot_start_fails_at_once_with_its_log(tmp_path):
    bad = tmp_path / "not-a-model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    spec = spec_for(bad, backends=[{"kind": "vllm", "startup_timeout_s": 7200}])
    code = Runner(spec, workdir=tmp_path / "work", out=tmp_path / "result.json").run()
    assert code == ExitCode.FAILED
    document = ResultDocument.model_validate_json((tmp_path / "result.json").read_text())
    assert document.status == "failed"
    assert [m.point.key for m in document.measurements] == [
        "concurrency:max_concurrency=1",
        "concurrency:max_concurrency=4",
    ]
    for m in document.measurements:
        assert m.status == "failed" and m.metrics == {}
        # Noticed by the process exiting, not by the 2-hour deadline:
        assert m.error.startswith("the vLLM server exited with code ")
        assert "Last lines of its log" in m.error and "no-such-architecture" in m.error
    assert document.errors[0]["where"] == "server vllm"
    leftovers = [
        p for p in psutil.process_iter(["cmdline"]) if str(bad) in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []


def test_a_server_start_error_names_the_deadline(tmp_path, tiny_model):
    spec = spec_for(tiny_model, backends=[{"kind": "vllm", "startup_timeout_s": 10}])
    # Below the spec's minimum (10 s), so that no machine, however fast, starts in time.
    backend = spec.vllm_backends[0].model_copy(update={"startup_timeout_s": 1})
    server = VLLMServer(spec, backend, tmp_path / "server.log")
    with pytest.raises(ServerError, match="was not ready within startup_timeout_s=1 s"):
        server.start()
    assert procs.group_members(server.pid) == []


# --------------------------------------------------------------------------- the CLI


def test_a_concurrency_sweep_through_the_cli(tiny_model, portal, tmp_path):
    spec = spec_for(
        tiny_model, backends=[{"kind": "hf-sequential", "num_prompts": 2}, {"kind": "vllm"}]
    )
    # clients: auto with one core for the clients: one client, no probe, and it says so.
    spec = with_clients(spec, "auto")
    # This machine's cores are too few for the automatic split: name the server's core.
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpus = str(cpus[0]), format_cpu_list(cpus[1:])
    env = {**os.environ, "SERVEBENCH_RUN_TOKEN": "sb_run_cli"}
    env["SERVEBENCH_SERVER_CPUS"] = server_cpu
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    argv = [sys.executable, "-m", "runners", "run", str(tmp_path / "spec.json")]
    argv += ["--out", str(tmp_path / "result.json"), "--report", portal.url]
    done = subprocess.run(
        [*argv, "--workdir", str(tmp_path / "work")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = ResultDocument.model_validate_json((tmp_path / "result.json").read_text())
    assert document.status == "succeeded"
    hf, c1, c4 = document.measurements
    assert hf.backend_kind == "hf-sequential" and hf.commands["hf"].startswith(
        "python -m runners hf"
    )
    for m, concurrency in ((c1, 1), (c4, 4)):
        assert m.status == "succeeded"
        assert set(m.metrics) == VLLM_KEYS
        assert m.metrics["completed"] == 16 and m.metrics["total_output_tokens"] == 16 * 16
        assert set(m.raw) >= CLIENT_KEYS and m.raw["max_concurrency"] == concurrency
        assert len(m.detail["ttfts"]) == 16 and "generated_texts" not in m.detail
        assert m.commands["serve"].startswith("vllm serve ")
        assert "--no-enable-prefix-caching" in m.commands["serve"]
        assert m.commands["bench"].startswith("vllm bench serve ")
        assert f"--max-concurrency {concurrency}" in m.commands["bench"]
        assert m.server_metrics.samples > 0 and m.server_metrics.preemptions == 0
        # Sampled ten times a second, but a short CPU point may still fall between samples,
        # so only the bounds are certain here (values: against a scripted /metrics).
        assert 0 <= m.server_metrics.num_requests_running_peak <= concurrency
        running = m.server_metrics.num_requests_running_mean  # the roofline's batch
        assert running is None or 1 <= running <= m.server_metrics.num_requests_running_peak
        # The cache vLLM allocated: the portal's capacity planning reads it.
        assert m.server_metrics.num_gpu_blocks > 0 and m.server_metrics.block_size > 0
        assert m.telemetry["server"]["t"] and m.telemetry["window"]
        # The server ran on its core, the client on the rest, as read from the processes.
        assert m.conditions["server_cores"] == m.conditions["server_affinity"] == server_cpu
        assert m.conditions["client_cores"] == m.conditions["client_affinity"] == client_cpus
    assert document.environment["host"]["core_split"] == (
        f"server {server_cpu}, client {client_cpus} (split by SERVEBENCH_SERVER_CPUS)"
    )
    assert "server_cores" not in hf.conditions  # the baseline owns every core
    # The HF baseline's telemetry: its requests' window, and the GPUs (or why not).
    assert len(hf.telemetry["requests"]["sent"]) == 2 and "status" in hf.telemetry["gpu"]
    assert c1.point.key == "concurrency:max_concurrency=1"
    # The server is gone: its pid and every process of its group.
    line = next(x for x in done.stderr.splitlines() if x.startswith("server ready"))
    pid = int(line.split("(pid ")[1].split(",")[0])
    assert procs.group_members(pid) == [] and gone([pid])
    assert sorted(portal.measurements) == [
        ("hf-sequential", "baseline", 0),
        ("vllm", "concurrency:max_concurrency=1", 0),
        ("vllm", "concurrency:max_concurrency=4", 0),
    ]
    assert portal.events()[-1]["type"] == "finished"
    probe = document.environment["load_generators"]["backends"]["vllm"]
    assert (probe["chosen"], probe["limit"], probe["tried"]) == (1, 1, [])
    assert "one core for the clients" in probe["why"] and "no probe" in probe["why"]
    sent = [e["environment"] for e in portal.events() if e["type"] == "environment"]
    assert sent[-1]["load_generators"] == document.environment["load_generators"]
    assert all(len(m.conditions["clients"]) == 1 for m in (c1, c4))

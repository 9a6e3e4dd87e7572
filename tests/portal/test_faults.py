"""Fault injection: kill and stop the parts of a real stack, and check nothing is lost.

A stack of its own (``faultstack.py``: embedded PostgreSQL and Redis on private sockets,
gunicorn, a Celery worker with beat, the real local executor, the real runner on the tiny
model) so that stopping PostgreSQL or Redis never touches the rest of the session. The
worker is killed at each step of dispatch with failpoints (``portal.lib.failpoints``:
the whole worker process group gets SIGKILL at that line, no cleanup, no ack). Each test
ends with the run in the right final state, each measurement stored exactly once, no
process of the run left alive (its PID namespace is gone), and the reason a person needs.

Each test appends a row (fault, final state, seconds from the fault to the final state)
to ``artifacts/fault-table.md``.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from faultstack import REPO, Stack, make_stack
from localruns import runner_process_of, supervisor_pid

# Its slow tests assert nothing a busy CPU changes: make test runs them beside others.
pytestmark = [pytest.mark.timeout(900), pytest.mark.shares_cpu]

TABLE = REPO / "artifacts" / "fault-table.md"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    # Not under pytest's tmp dir (mode 0700): as root, embedded PostgreSQL runs as a user
    # of its own, which must reach its data directory.
    home = Path(tempfile.mkdtemp(prefix="servebench-faults-"))
    home.chmod(0o755)
    made = make_stack(home / "services", home / "data")
    try:
        yield made
    finally:
        made.shutdown()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def _worker_back(stack: Stack) -> Iterator[None]:
    yield
    stack.start_postgres()
    stack.start_redis()
    if stack.worker_dead():
        stack.start_worker()


def record(fault: str, run: dict, seconds: float) -> None:
    TABLE.parent.mkdir(exist_ok=True)
    if not TABLE.exists():
        TABLE.write_text(
            "| fault | final state | reason | seconds to recover |\n| --- | --- | --- | --- |\n"
        )
    reason = ((run.get("failure_reason") or "-").splitlines() or ["-"])[0][:80]
    with TABLE.open("a") as fh:
        fh.write(f"| {fault} | {run['status']} | {reason} | {seconds:.1f} |\n")


def hf_spec(model: Path, prompts: int = 4, output_len: int = 16) -> dict:
    return {
        "name": "fault test",
        "model": {"id": str(model), "max_model_len": 2048},
        "workload": {"input_len": 64, "output_len": output_len, "num_prompts": 4},
        "backends": [{"kind": "hf-sequential", "num_prompts": prompts, "num_warmups": 0}],
        "resources": {"gpu_count": 0, "timeout_minutes": 15},
    }


def handle_of(stack: Stack, public_id: str) -> dict:
    """The local executor's handle, derived as the executor derives it (the API does not
    expose handles)."""
    return {"workdir": str(Path(stack.env["SERVEBENCH_DATA_DIR"]) / "runs" / public_id)}


def namespace_of(handle: dict) -> str | None:
    pid = supervisor_pid(handle)
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") if pid else None
    except OSError:
        return None


def left_alive(namespace: str | None) -> list[int]:
    """Processes still in the run's PID namespace."""
    if namespace is None:
        return []
    out = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/pid") == namespace:
                out.append(proc.pid)
        except OSError:
            continue
    return out


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def check_clean(stack: Stack, run: dict, measurements: int, namespace: str | None) -> None:
    assert len(run["measurements"]) == measurements, run["measurements"]
    keys = {(m["backend"], m["point_key"], m["repeat"]) for m in run["measurements"]}
    assert len(keys) == measurements  # exactly once
    wait_for(lambda: not left_alive(namespace), 30, "the run's processes to be gone")


@pytest.mark.parametrize(
    ("failpoint", "state_after_kill"),
    [
        ("dispatch.before-claim", "queued"),
        ("dispatch.after-claim", "dispatched"),
        ("dispatch.after-start", None),  # the runner carries on without the worker
    ],
)
def test_a_worker_killed_at_each_step_of_dispatch_loses_nothing(
    stack: Stack, tiny_model: Path, failpoint: str, state_after_kill: str | None
) -> None:
    stack.start_worker(failpoints=failpoint)
    public_id = stack.submit(hf_spec(tiny_model))
    wait_for(stack.worker_dead, 60, f"the worker to die at {failpoint}")
    killed = time.monotonic()
    if state_after_kill is not None:
        time.sleep(2)  # nothing moves without a worker
        assert stack.run(public_id)["status"] == state_after_kill
    stack.start_worker()
    run = stack.wait_final(public_id, 180)
    recovered = time.monotonic() - killed
    assert run["status"] == "succeeded", (run["failure_reason"], stack.tail("worker"))
    handle = handle_of(stack, public_id)
    check_clean(stack, run, 1, namespace_of(handle))
    log = (Path(handle["workdir"]) / "runner.log").read_text()
    assert log.count("supervisor: starting:") == 1  # one runner, whatever the retries
    record(f"worker SIGKILL at {failpoint}", run, recovered)


@pytest.mark.slow
def test_a_killed_runner_takes_its_vllm_server_with_it(
    stack: Stack, tiny_model: Path, have_vllm: None
) -> None:
    stack.start_worker()
    spec = {
        "name": "runner killed",
        "model": {"id": str(tiny_model), "max_model_len": 2048},
        # Minutes of work: killed mid-measurement on any machine, however fast.
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 2000, "num_warmups": 0},
        "backends": [{"kind": "vllm", "startup_timeout_s": 600}],
        "resources": {"gpu_count": 0, "timeout_minutes": 20},
    }
    public_id = stack.submit(spec)
    handle = handle_of(stack, public_id)
    server_log = Path(handle["workdir"]) / "work" / "server-vllm.log"
    wait_for(
        lambda: (
            server_log.exists() and "startup complete" in server_log.read_text(errors="replace")
        ),
        600,
        "the vLLM server to be up",
    )
    runner = runner_process_of(handle)
    server = runner.children(recursive=True)
    assert server, "the runner has no server process"
    namespace = namespace_of(handle)
    runner.send_signal(signal.SIGKILL)  # the OOM killer
    killed = time.monotonic()
    run = stack.wait_final(public_id, 120)
    recovered = time.monotonic() - killed
    assert run["status"] == "failed"
    assert run["failure_reason"].startswith(
        "runner exited with code 137 (SIGKILL) without reporting a result; last lines of its log:"
    )
    assert "left behind" in run["failure_reason"]  # the supervisor says it stopped the server
    wait_for(lambda: not left_alive(namespace), 60, "the server's processes to be gone")
    for proc in server:
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    record("runner SIGKILL with its vLLM server up", run, recovered)


def test_redis_down_when_a_run_is_submitted(stack: Stack, tiny_model: Path) -> None:
    stack.start_worker()
    stack.stop_redis()
    stopped = time.monotonic()
    public_id = stack.submit(hf_spec(tiny_model))  # PostgreSQL has it; the broker does not
    time.sleep(5)
    assert stack.run(public_id)["status"] == "queued"
    stack.start_redis()  # empty: the dispatch message is gone for good
    run = stack.wait_final(public_id, 180)
    recovered = time.monotonic() - stopped
    assert run["status"] == "succeeded", (run["failure_reason"], stack.tail("worker"))
    check_clean(stack, run, 1, namespace_of(handle_of(stack, public_id)))
    record("Redis stopped (5 s) across a submit", run, recovered)


def test_a_hung_redis_holds_up_a_submit_for_seconds_at_most(stack: Stack, tiny_model: Path) -> None:
    stack.start_worker()
    stack.pause_redis()  # accepts connections, answers nothing: worse than down
    try:
        started = time.monotonic()
        public_id = stack.submit(hf_spec(tiny_model))
        took = time.monotonic() - started
        assert took < 4, f"POST /runs/ took {took:.1f} s with Redis hung"
        assert stack.run(public_id)["status"] == "queued"
    finally:
        stack.pause_redis(signal.SIGCONT)
    resumed = time.monotonic()
    run = stack.wait_final(public_id, 180)  # reconcile sends the lost dispatch again
    assert run["status"] == "succeeded", (run["failure_reason"], stack.tail("worker"))
    check_clean(stack, run, 1, namespace_of(handle_of(stack, public_id)))
    assert "could not enqueue dispatch" in stack.tail("web", 400)
    fault = f"Redis hung (SIGSTOP) across a submit: POST took {took:.1f} s"
    record(fault, run, time.monotonic() - resumed)


def test_postgres_down_while_the_runner_reports(stack: Stack, tiny_model: Path) -> None:
    stack.start_worker()
    # "running" means the runner reported "started"; its environment, its measurement and
    # "finished" follow, each sent in order and retried until the portal takes it. The
    # outage lasts 20 s and at least until the runner has met it (a report refused with a
    # 5xx, logged), then 5 s of its retries: a fixed outage raced the runner's reports,
    # which on a slow machine all came after PostgreSQL was back.
    public_id = stack.submit(hf_spec(tiny_model, prompts=8, output_len=32))
    wait_for(lambda: (stack.run(public_id) or {}).get("status") == "running", 120, "running")
    log = Path(handle_of(stack, public_id)["workdir"]) / "runner.log"
    stack.stop_postgres()
    stopped = time.monotonic()
    wait_for(lambda: "failed (HTTP 5" in _text(log), 300, "the runner's report to meet the outage")
    time.sleep(max(5.0, 20 - (time.monotonic() - stopped)))
    down = time.monotonic() - stopped
    stack.start_postgres()
    run = stack.wait_final(public_id, 300)
    recovered = time.monotonic() - stopped
    assert run["status"] == "succeeded", (run["failure_reason"], stack.tail("worker"))
    runner_log = _text(log)
    assert "retrying in" in runner_log, runner_log[-2000:]
    check_clean(stack, run, 1, namespace_of(handle_of(stack, public_id)))
    record(f"PostgreSQL stopped ({down:.0f} s) while the runner reports", run, recovered)


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""

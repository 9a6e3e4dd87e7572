"""A runner cannot read the portal's secrets (local executor).

A real Celery worker holds the portal's secrets: DATABASE_URL and SECRET_KEY in its
environment, and a secret given as a file (SECRET_KEY_FILE). A probe takes the runner's
place, as a model with ``trust_remote_code`` would run inside it, and tries what such code
would try: every process's ``/proc/<pid>/environ``, the worker's memory through
``/proc/<pid>/mem``, the secret file (whose path it is even told), and the other runs'
work dirs. With namespaces (what ``auto`` picks wherever
``unshare`` works) it must find nothing. The same probe without them (``none``) finds the
worker's environment, which shows the probe is able to find what it looks for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from portal.benchmarks.models import Run
from portal.dispatch.executors import ExecutorError
from portal.dispatch.executors.local import isolation_prefix

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

PROBE = """#!{python}
import json, os
found = {{"environ": [], "memory": [], "secret_file": None, "other_runs": [], "pids": 0}}
needles = {needles!r}
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    found["pids"] += 1
    try:
        text = open(f"/proc/{{pid}}/environ", "rb").read().decode(errors="replace")
        cmdline = open(f"/proc/{{pid}}/cmdline", "rb").read()
    except OSError:
        continue
    found["environ"] += [n for n in needles if n in text]
    if b"celery" not in cmdline:
        continue
    # Celery rewrites its process title over the original environment block: read the
    # worker's memory instead, as code running as the same (or a privileged) user can.
    try:
        maps = open(f"/proc/{{pid}}/maps").read().splitlines()
        mem = open(f"/proc/{{pid}}/mem", "rb", 0)
    except OSError:
        continue
    for line in maps:
        parts = line.split()
        if len(parts) < 2 or not parts[1].startswith("rw"):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        if end - start > 256 * 1024 * 1024:
            continue
        try:
            mem.seek(start)
            chunk = mem.read(end - start)
        except (OSError, OverflowError, ValueError):
            continue
        found["memory"] += [n for n in needles if n.encode() in chunk]
try:
    found["secret_file"] = open({secret_file!r}).read()
except OSError as exc:
    found["secret_file"] = f"unreadable: {{exc}}"
runs = os.path.dirname(os.getcwd())
found["other_runs"] = [d for d in os.listdir(runs) if d != os.path.basename(os.getcwd())]
json.dump(found, open("probe.json", "w"))
"""


@pytest.fixture
def namespaces_available(need) -> None:
    try:
        isolation_prefix("namespaces")
    except ExecutorError as exc:
        need(False, "PID and mount namespaces (unshare)", str(exc))


@pytest.mark.parametrize("isolation", ["namespaces", "none"])
def test_a_runner_cannot_read_the_portals_secrets(
    isolation, namespaces_available, personas, live_server, celery_worker, waiter, tmp_path
):
    from django.conf import settings

    secret_dir = tmp_path / "secrets"
    secret_dir.mkdir()
    secret_file = secret_dir / "secret_key"
    file_secret = "file-secret-" + "s" * 40
    secret_file.write_text(file_secret)
    data_dir = tmp_path / "data"
    other = data_dir / "runs" / "anotherrunsdirectory0"
    other.mkdir(parents=True)
    (other / "spec.json").write_text('{"private": true}')
    env_secret = settings.SECRET_KEY
    db_url = settings.DATABASES["default"]["NAME"]  # part of the worker's DATABASE_URL
    probe = tmp_path / "probe"
    probe.write_text(
        PROBE.format(
            python=sys.executable,
            needles=[env_secret, f"/{db_url}", file_secret],
            secret_file=str(secret_file),
        )
    )
    probe.chmod(0o755)
    celery_worker(
        public_url=live_server.url,
        extra_env={
            "SERVEBENCH_RUNNER_PYTHON": str(probe),
            "SERVEBENCH_LOCAL_ISOLATION": isolation,
            "SERVEBENCH_DATA_DIR": str(data_dir),
            "SECRET_KEY_FILE": str(secret_file),
        },
    )
    spec = {
        "model": {"id": "org/tiny-model", "max_model_len": 512},
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 4},
        "backends": [{"kind": "vllm"}],
        "resources": {"gpu_count": 0, "timeout_minutes": 5},
    }
    response = personas["owner"].client.post(
        "/api/v1/runs/", json.dumps({"spec": spec}), content_type="application/json"
    )
    assert response.status_code == 201, response.content
    public_id = response.json()["id"]
    result = data_dir / "runs" / public_id / "probe.json"

    def probe_written() -> Any:
        try:  # it exists, empty, before the probe's json.dump is flushed
            return json.loads(result.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    found = waiter(probe_written, 120, "the probe to finish")
    run = Run.objects.get(public_id=public_id)
    if isolation == "none":
        # Without namespaces, a runner (as root here) reads the worker's secrets: the probe
        # can find what it looks for.
        assert env_secret in found["memory"] + found["environ"], found
        assert found["secret_file"] == file_secret
        return
    assert found["pids"] <= 2, f"the runner saw {found['pids']} other processes"
    assert found["environ"] == [] and found["memory"] == [], "the runner read a portal secret"
    assert file_secret not in (found["secret_file"] or ""), "the runner read the secret file"
    assert found["other_runs"] == [], "the runner saw other runs' work dirs"
    assert Path(run.executor_handle["workdir"]).name == public_id

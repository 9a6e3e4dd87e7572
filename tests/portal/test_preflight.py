"""What the executor cannot give is refused (400 naming the field) or warned about before a
run is queued, through the API and the form alike (``portal.benchmarks.preflight``); and
the tiny CPU demo preset is offered exactly where its model exists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from portal.benchmarks import preflight
from portal.benchmarks.models import Run
from runners import spec as rs

pytestmark = pytest.mark.django_db
RUNS = "/api/v1/runs/"


def post(client: Client, body: dict[str, Any]) -> Any:
    return client.post(RUNS, json.dumps(body), content_type="application/json")


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache of this test's own, with hub downloads off."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf" / "hub"


def cache_model(cache: Path, repo: str, revision: str = "main") -> None:
    """Lay a snapshot out as huggingface_hub does: refs/<branch> -> snapshots/<commit>."""
    root = cache / ("models--" + repo.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / revision).write_text(commit)
    (root / "snapshots" / commit).mkdir(parents=True)
    (root / "snapshots" / commit / "config.json").write_text("{}")


def test_a_gpu_the_local_machine_does_not_have_is_refused_naming_the_field(
    personas: dict[str, Any], spec_dict: Any, settings: Any, hub_cache: Path
) -> None:
    settings.SERVEBENCH_EXECUTOR = "local"
    settings.SERVEBENCH_LOCAL_GPUS = 0
    owner = personas["owner"].client
    spec = spec_dict(resources={"gpu_count": 1})
    response = post(owner, {"spec": spec})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["field"] == "spec.resources.gpu_count"
    assert "has none" in error["message"] and "gpu_count: 0" in error["message"]
    preset = post(owner, {"preset": "seed"})
    assert preset.status_code == 400
    assert preset.json()["error"]["field"] == "preset"
    assert "'seed' preset asks for 1 GPU" in preset.json()["error"]["message"]
    assert Run.objects.count() == 0
    # The machine has one: accepted. Asking for two is refused with the count it has.
    settings.SERVEBENCH_LOCAL_GPUS = 1
    assert post(owner, {"spec": spec}).status_code == 201
    two = post(owner, {"spec": spec_dict(resources={"gpu_count": 2})})
    assert two.status_code == 400 and "has 1; ask for at most 1" in two.json()["error"]["message"]
    # Nobody else learns anything new from it: outsiders cannot submit at all.
    assert post(personas["anon"].client, {"spec": spec}).status_code == 401


def test_kubernetes_refuses_more_gpus_than_a_job_may_ask_for(
    personas: dict[str, Any], spec_dict: Any, settings: Any
) -> None:
    settings.SERVEBENCH_EXECUTOR = "kubernetes"
    settings.SERVEBENCH_K8S_MAX_GPUS = 8
    settings.SERVEBENCH_LOCAL_GPUS = 0  # the web pod's own GPUs do not matter there
    owner = personas["owner"].client
    assert post(owner, {"spec": spec_dict(resources={"gpu_count": 8})}).status_code == 201
    response = post(owner, {"spec": spec_dict(resources={"gpu_count": 9})})
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "spec.resources.gpu_count"
    assert "SERVEBENCH_K8S_MAX_GPUS" in response.json()["error"]["message"]


def test_a_hub_model_it_cannot_fetch_is_queued_with_a_warning(
    personas: dict[str, Any], spec_dict: Any, settings: Any, hub_cache: Path, monkeypatch: Any
) -> None:
    settings.SERVEBENCH_EXECUTOR = "local"
    owner = personas["owner"].client
    response = post(owner, {"spec": spec_dict(model={"id": "org/not-here"})})
    assert response.status_code == 201
    [warning] = response.json()["warnings"]
    assert warning["field"] == "spec.model.id"
    assert "'org/not-here' is not in this machine's Hugging Face cache" in warning["message"]
    assert "huggingface-cli download org/not-here" in warning["message"]
    # In the cache: no warning. Online: no warning (it can be downloaded).
    cache_model(hub_cache, "org/cached")
    assert "warnings" not in post(owner, {"spec": spec_dict(model={"id": "org/cached"})}).json()
    pinned = spec_dict(model={"id": "org/cached", "revision": "v2"})
    assert post(owner, {"spec": pinned}).json()["warnings"][0]["field"] == "spec.model.id"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert "warnings" not in post(owner, {"spec": spec_dict(model={"id": "org/gone"})}).json()


def test_a_missing_local_model_directory_or_dataset_is_refused(
    personas: dict[str, Any], spec_dict: Any, settings: Any, tmp_path: Path
) -> None:
    # The local executor runs here: a path missing here can only fail, minutes later.
    settings.SERVEBENCH_EXECUTOR = "local"
    settings.SERVEBENCH_MODEL_ROOTS = [str(tmp_path)]
    owner = personas["owner"].client
    missing = post(owner, {"spec": spec_dict(model={"id": str(tmp_path / "nope")})})
    assert missing.status_code == 400
    error = missing.json()["error"]
    assert error["field"] == "spec.model.id"
    assert "there is no directory" in error["message"] and "check the path" in error["message"]
    (tmp_path / "there").mkdir()
    present = post(owner, {"spec": spec_dict(model={"id": str(tmp_path / "there")})})
    assert present.status_code == 201 and "warnings" not in present.json()


def test_local_gpus_follow_the_setting_and_cuda_visible_devices(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.SERVEBENCH_LOCAL_GPUS = 3
    assert preflight.local_gpus() == 3
    settings.SERVEBENCH_LOCAL_GPUS = None
    devices = sum(1 for p in Path("/dev").glob("nvidia*") if p.name[6:].isdigit())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert preflight.local_gpus() == devices
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert preflight.local_gpus() == 0


def test_the_tiny_demo_preset_is_offered_only_where_its_model_is(
    personas: dict[str, Any], settings: Any, tiny_model: Path, tmp_path: Path
) -> None:
    owner = personas["owner"].client
    settings.SERVEBENCH_TINY_MODEL_DIR = str(tmp_path / "not-built")
    names = [p["name"] for p in owner.get("/api/v1/presets/").json()]
    assert names == ["seed", "seed-all-baselines"]
    refused = post(owner, {"preset": rs.TINY_DEMO})
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "preset"

    settings.SERVEBENCH_TINY_MODEL_DIR = str(tiny_model)
    settings.SERVEBENCH_LOCAL_GPUS = 0
    presets = {p["name"]: p for p in owner.get("/api/v1/presets/").json()}
    assert sorted(presets) == ["seed", "seed-all-baselines", rs.TINY_DEMO]
    assert presets[rs.TINY_DEMO]["spec"]["model"]["id"] == str(tiny_model)
    created = post(owner, {"preset": rs.TINY_DEMO})
    assert created.status_code == 201, created.content
    run = Run.objects.get(public_id=created.json()["id"])
    assert run.spec == rs.tiny_demo(str(tiny_model)).model_dump(mode="json")
    assert "warnings" not in created.json()
    page = Client()
    page.force_login(personas["owner"].user)
    form = page.get("/runs/new/").context["form"]
    assert form.initial["preset"] == rs.TINY_DEMO  # where it can run, the form starts there

"""The new-run form: the spec text is the truth, the fields a view of it (portal.web.forms).

Through Django's test client as a browser without JavaScript posts it, and through the
live check (``/runs/new/check``) the page's script calls on every edit: the same form.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client

from portal.benchmarks.models import Run
from runners import spec as rs

pytestmark = pytest.mark.django_db
CHECK = "/runs/new/check"

PASTED = """\
# my own spec: comments and all
name: pasted spec
model: {id: org/pasted-model, max_model_len: 1024}
workload: {input_len: 96, output_len: 24, num_prompts: 12, num_warmups: 0}
sweeps:
  - {name: concurrency, axis: max_concurrency, values: [2, 6]}
backends: [{kind: vllm}]
resources: {gpu_count: 0}
"""


@pytest.fixture
def client(make_user: Any, settings: Any) -> Client:
    settings.SERVEBENCH_EXECUTOR = "local"
    settings.SERVEBENCH_LOCAL_GPUS = 0  # the seed preset asks for a GPU: refused here
    c = Client()
    c.force_login(make_user("former"))
    return c


def page_data(client: Client, preset: str = "") -> dict[str, Any]:
    """What a browser posts for the form as GET /runs/new/ rendered it."""
    form = client.get("/runs/new/" + (f"?preset={preset}" if preset else "")).context["form"]
    data = {k: v for k, v in form.initial.items() if v is not None}
    return {k: v for k, v in data.items() if k != "is_public"}


def check(client: Client, data: dict[str, Any]) -> dict[str, Any]:
    response = client.post(CHECK, data)
    assert response.status_code == 200, response.content
    return response.json()


def test_a_pasted_spec_runs_as_pasted_whatever_the_fields_still_say(client: Client) -> None:
    data = page_data(client, "seed")
    assert data["model_id"] == "Qwen/Qwen3-0.6B" and data["concurrency"] == "1, 4, 16, 64"
    # "Custom", the seed's values still in every field, the spec pasted over the seed's.
    response = client.post("/runs/new/", {**data, "preset": "", "spec_text": PASTED})
    assert response.status_code == 302, response.context["form"].errors
    run = Run.objects.get()
    assert run.spec == rs.loads_spec(PASTED).model_dump(mode="json")
    assert run.name == "pasted spec"


def test_editing_a_field_rewrites_the_spec_and_only_that_value(client: Client) -> None:
    data = {**page_data(client, "seed"), "preset": "", "spec_text": PASTED}
    state = check(client, data)  # the script's check after the paste: fields follow the spec
    assert state["fields"]["model_id"] == "org/pasted-model"
    assert state["fields"]["concurrency"] == "2, 6" and state["fields"]["gpu_count"] == "0"
    assert state["spec_text"] == PASTED.strip()  # nothing changed it: kept as typed
    assert state["preset"] == "" and state["errors"] == []
    data = {**data, **state["fields"], "synced": state["synced"]}

    edited = check(client, {**data, "input_len": "200", "concurrency": "3, 9"})
    spec = yaml.safe_load(edited["spec_text"])
    assert spec["workload"] == {"input_len": 200, "output_len": 24, "num_prompts": 12,
                                "num_warmups": 0}  # fmt: skip
    assert spec["sweeps"] == [{"name": "concurrency", "axis": "max_concurrency", "values": [3, 9]}]
    assert spec["model"] == {"id": "org/pasted-model", "max_model_len": 1024}
    assert edited["fields"]["input_len"] == "200"

    # Emptying the concurrency field removes that sweep; the backends field edits backends.
    emptied = check(client, {**data, "concurrency": "", "backends": ["hf-sequential"]})
    spec = yaml.safe_load(emptied["spec_text"])
    assert "sweeps" not in spec or spec["sweeps"] == []
    assert [b["kind"] for b in spec["backends"]] == ["hf-sequential"]


def test_editing_the_spec_updates_the_fields(client: Client) -> None:
    data = page_data(client, "seed")
    text = data["spec_text"].replace(
        "input_len: 1024\n  output_len: 128", "input_len: 300\n  output_len: 40", 1
    )
    assert text != data["spec_text"]
    state = check(client, {**data, "spec_text": text})
    assert state["fields"]["input_len"] == "300" and state["fields"]["output_len"] == "40"
    assert state["preset"] == ""  # no longer the seed: the select shows "Custom"


def test_switching_presets_leaves_nothing_of_the_seed(
    client: Client, settings: Any, tiny_model: Path
) -> None:
    settings.SERVEBENCH_TINY_MODEL_DIR = str(tiny_model)
    data = page_data(client, "seed")  # the spec text untouched, only the select changed
    state = check(client, {**data, "preset": rs.TINY_DEMO})
    demo = rs.tiny_demo(str(tiny_model))
    assert rs.loads_spec(state["spec_text"]) == demo
    assert [s["name"] for s in yaml.safe_load(state["spec_text"])["sweeps"]] == ["concurrency"]
    assert state["fields"]["concurrency"] == "1, 4, 16" and state["preset"] == rs.TINY_DEMO
    # The same without the script: the submit takes the new preset whole.
    response = client.post("/runs/new/", {**data, "preset": rs.TINY_DEMO})
    assert response.status_code == 302, response.context["form"].errors
    assert Run.objects.get().spec == demo.model_dump(mode="json")


def test_every_problem_is_reported_at_once_at_its_field(client: Client) -> None:
    bad = PASTED.replace("input_len: 96", "input_len: 0").replace(
        "output_len: 24", "output_len: -1"
    )
    bad = bad.replace("gpu_count: 0", "gpu_count: 1") + "bogus: 1\n"
    data = {**page_data(client, "seed"), "preset": "", "spec_text": bad}
    state = check(client, data)
    at = {(e["field"], e["path"]) for e in state["errors"]}
    assert ("spec_text", "spec.bogus") in at
    # A spec the schema refuses is not checked further; fix those, then the GPU shows.
    assert ("input_len", "spec.workload.input_len") in at
    assert ("output_len", "spec.workload.output_len") in at
    response = client.post("/runs/new/", data)
    assert response.status_code == 200 and Run.objects.count() == 0
    page = response.content.decode()
    assert 'id="input_len-errors"' in page and "spec.workload.input_len: " in page
    assert "The spec has 3 problems" in page
    form = response.context["form"]
    assert form["input_len"].value() == "0"  # the fields read back from the spec shown

    valid_but_gpu = bad.replace("input_len: 0", "input_len: 96").replace(
        "output_len: -1", "output_len: 24"
    )
    valid_but_gpu = valid_but_gpu.replace("bogus: 1\n", "")
    state = check(client, {**data, "spec_text": valid_but_gpu})
    [error] = state["errors"]
    assert (error["field"], error["path"]) == ("gpu_count", "spec.resources.gpu_count")
    assert "gpu_count: 0" in error["message"]


def test_warnings_show_before_submitting_and_after(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = {**page_data(client, "seed"), "preset": "", "spec_text": PASTED}
    state = check(client, data)
    [warning] = state["warnings"]
    assert (warning["field"], warning["path"]) == ("model_id", "spec.model.id")
    assert state["valid"] is True
    response = client.post("/runs/new/", data, follow=True)
    assert Run.objects.count() == 1
    notes = [str(m) for m in response.context["messages"]]
    assert any("spec.model.id: 'org/pasted-model' is not in" in m for m in notes)


def test_a_form_without_synced_values_applies_what_is_filled_in(
    client: Client, settings: Any
) -> None:
    """A client that never saw the page (or a script) posts a preset and some fields."""
    settings.SERVEBENCH_LOCAL_GPUS = 1
    response = client.post(
        "/runs/new/", {"preset": "seed", "input_len": "256", "concurrency": "2, 8", "gpu_count": ""}
    )
    assert response.status_code == 302, response.context["form"].errors
    spec = Run.objects.get().spec
    assert spec["workload"]["input_len"] == 256 and spec["sweeps"][0]["values"] == [2, 8]


def test_the_check_is_for_signed_in_users_and_only_by_post(client: Client) -> None:
    assert Client().post(CHECK, {}).status_code == 302
    assert client.get(CHECK).status_code == 405
    state = check(client, {})
    assert state["errors"][0]["message"] == "Paste a spec, or choose a preset."
    assert Run.objects.count() == 0


def test_the_page_has_no_inline_script(client: Client) -> None:
    page = client.get("/runs/new/").content.decode()
    assert "<script>" not in page and "<script " in page
    for tag in page.split("<script")[1:]:
        head, _, rest = tag.partition(">")
        assert 'src="' in head or 'type="application/json"' in head, head
        assert rest.startswith("</script>") or 'type="application/json"' in head
    state = json.loads(client.post(CHECK, {"preset": "seed"}).content)
    assert state["preset"] == "seed"

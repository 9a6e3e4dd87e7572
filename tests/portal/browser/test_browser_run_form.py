"""The new-run form in a real Chromium, its script live (static/web/run_new.js): a pasted
spec is what is stored and what the runner executes; fields and spec follow each other;
every problem shows at once at its field; the tiny demo preset replaces the seed whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from portal.benchmarks.models import Measurement, Run, RunStatus
from runners import spec as rs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def pasted_spec(model: str) -> str:
    """An HF-only spec on the tiny model (seconds on a CPU), unlike every preset."""
    return (
        "# pasted by hand\n"
        "name: pasted in the browser\n"
        f"model: {{id: {model}, max_model_len: 512}}\n"
        "workload: {input_len: 48, output_len: 12, num_prompts: 3, num_warmups: 0}\n"
        "backends:\n"
        "  - {kind: hf-sequential, num_prompts: 3, num_warmups: 0}\n"
        "resources: {gpu_count: 0, timeout_minutes: 10}\n"
    )


@pytest.fixture
def former(make_user: Any, settings: Any, tiny_model: Path) -> tuple[Any, str]:
    settings.SERVEBENCH_TINY_MODEL_DIR = str(tiny_model)
    settings.SERVEBENCH_EXECUTOR = "local"
    settings.SERVEBENCH_LOCAL_GPUS = 0
    user = make_user("former")
    return user, "pw-former"


def value(page: Any, selector: str) -> str:
    return page.page.input_value(selector)


def test_a_pasted_spec_is_stored_and_executed_exactly(
    page: Any, former: tuple[Any, str], tiny_model: Path, live_server: Any, celery_worker: Any,
    waiter: Any,
) -> None:  # fmt: skip
    worker = celery_worker(public_url=live_server.url)
    user, password = former
    page.sign_in(user.username, password)
    page.goto("/runs/new/")
    page.wait_for("document.getElementById('check-status').textContent === 'ready to submit'")
    assert page.page.input_value("#id_preset") == rs.TINY_DEMO  # a preset that runs here
    assert value(page, "#id_concurrency") == "1, 4, 16"
    page.shot("run-new-tiny-demo")

    text = pasted_spec(str(tiny_model))
    page.page.select_option("#id_preset", "")
    page.page.fill("#id_spec_text", text)
    # The fields follow the pasted spec (none of the preset's values is left to win).
    page.wait_for("document.getElementById('id_input_len').value === '48'")
    assert value(page, "#id_output_len") == "12" and value(page, "#id_num_prompts") == "3"
    assert value(page, "#id_concurrency") == "" and value(page, "#id_name") == (
        "pasted in the browser"
    )
    assert page.page.is_checked("#run-form input[name=backends][value=hf-sequential]")
    assert not page.page.is_checked("#run-form input[name=backends][value=vllm]")
    assert value(page, "#id_spec_text") == text  # kept as typed, comment and all
    page.shot("run-new-pasted")

    page.page.click("#run-form button[type=submit]")
    page.page.wait_for_url("**/runs/*/")
    run = Run.objects.get()
    assert run.spec == rs.loads_spec(text).model_dump(mode="json")
    assert page.console_errors == []

    def ended() -> Run | None:
        found = Run.objects.get(pk=run.pk)
        return found if found.is_final else None

    done = waiter(ended, 240, f"the run to end; worker log:\n{worker.output()[-3000:]}")
    assert done.status == RunStatus.SUCCEEDED, done.failure_reason
    # What the runner executed is what was pasted: its own result document says so.
    document = json.loads((Path(done.executor_handle["workdir"]) / "result.json").read_text())
    assert document["spec"] == done.spec == rs.loads_spec(text).model_dump(mode="json")
    measurement = Measurement.objects.get(run=done)
    assert (measurement.backend, measurement.input_len, measurement.output_len) == (
        "hf-sequential", 48, 12,
    )  # fmt: skip


def test_fields_and_spec_follow_each_other_and_problems_show_at_once(
    page: Any, former: tuple[Any, str]
) -> None:
    user, password = former
    page.sign_in(user.username, password)
    page.goto("/runs/new/?preset=seed")
    page.wait_for("document.getElementById('check-status').textContent !== 'checking…'")
    # The seed asks for a GPU this portal does not have: said at its field before submitting.
    page.wait_for("!document.getElementById('gpu_count-errors').hidden")
    assert "gpu_count: 0" in page.page.inner_text("#gpu_count-errors")
    assert page.page.input_value("#id_preset") == "seed"

    # A field edit rewrites the spec text; the rest of the spec is untouched.
    page.page.fill("#id_gpu_count", "0")
    page.page.fill("#id_input_len", "512")
    page.wait_for("document.getElementById('id_spec_text').value.includes('input_len: 512')")
    spec = yaml.safe_load(value(page, "#id_spec_text"))
    assert spec["resources"]["gpu_count"] == 0 and spec["workload"]["input_len"] == 512
    assert [s["name"] for s in spec["sweeps"]] == ["concurrency", "prompt-length", "output-length"]
    page.wait_for("document.getElementById('gpu_count-errors').hidden")
    assert page.page.input_value("#id_preset") == ""  # no longer the seed: "Custom"

    # Three problems at once, each at its field, named by its spec path.
    text = value(page, "#id_spec_text").replace("output_len: 128", "output_len: 0", 1)
    page.page.fill(
        "#id_spec_text", text.replace("input_len: 512", "input_len: -3", 1) + "bogus: 1\n"
    )
    page.wait_for("!document.getElementById('spec-problems').hidden")
    page.wait_for("document.querySelectorAll('#spec-problems-list li').length === 3")
    assert "spec.workload.input_len" in page.page.inner_text("#input_len-errors")
    assert "spec.workload.output_len" in page.page.inner_text("#output_len-errors")
    assert "spec.bogus: unknown field" in page.page.inner_text("#spec_text-errors")
    assert page.page.locator("[data-field=input_len].has-error").count() == 1
    page.shot("run-new-three-problems")
    page.page.click("#run-form button[type=submit]")
    page.page.wait_for_load_state()
    assert Run.objects.count() == 0
    assert "The spec has 3 problems" in page.page.inner_text("#spec-problems")

    # Choosing the tiny demo replaces the whole spec: none of the seed's sweeps survive.
    page.page.select_option("#id_preset", rs.TINY_DEMO)
    page.wait_for("document.getElementById('spec-problems').hidden")
    spec = yaml.safe_load(value(page, "#id_spec_text"))
    assert [s["name"] for s in spec["sweeps"]] == ["concurrency"]
    assert value(page, "#id_concurrency") == "1, 4, 16"
    assert page.console_errors == []


def test_the_form_at_phone_width(browser: Any, live_server: Any, former: tuple[Any, str]) -> None:
    """A look at 390 px (the layout itself is the shared stylesheet's)."""
    from tests.portal.browser.conftest import Page

    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = Page(context.new_page(), live_server.url)
    user, password = former
    page.sign_in(user.username, password)
    page.goto("/runs/new/")
    page.wait_for("document.getElementById('check-status').textContent === 'ready to submit'")
    page.shot("run-new-390")
    assert page.page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.console_errors == []
    context.close()


def test_a_failed_run_says_why_at_the_top_of_its_page(
    page: Any, former: tuple[Any, str], make_run: Any, measurement: Any
) -> None:
    from portal.benchmarks import ingestion
    from runners import causes
    from runners import result as rr

    user, password = former
    run = make_run(owner=user, status=RunStatus.RUNNING)
    error = (
        "the HF baseline failed: OSError: We couldn't connect to 'https://huggingface.co' to "
        "load the files, and couldn't find them in the cached files."
    )
    failed = measurement(
        backend="hf-sequential", point_key="baseline", status="failed", error=error
    )
    ingestion.ingest_measurement(run, rr.Measurement.model_validate(failed))
    reason = causes.headline([("hf-sequential baseline", error)], 3, model="org/tiny-model")
    ingestion.ingest_event(run, rr.Event(type="failed", message=reason, errors=[]))
    page.sign_in(user.username, password)
    page.goto(f"/runs/{run.short_id}/")  # the short id, as `make run` and the list print it
    page.page.wait_for_url(f"**{run.get_absolute_url()}")
    notice = page.page.inner_text("#failure-reason")
    assert "the HF baseline failed: OSError: We couldn't connect" in notice.splitlines()[0]
    assert "Next: the machine that ran it could not get the model" in notice
    assert "1 of 3 measurements failed" in notice
    page.shot("run-failed-reason")
    assert page.console_errors == []

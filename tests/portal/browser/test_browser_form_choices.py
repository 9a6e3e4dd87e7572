"""The new-run form as a newcomer meets it (issue 29, item 1), in Chromium at 1280 and 390
px: the backend boxes know every kind a preset holds; a preset's YAML shows whole numbers
as integers; a misspelt kind says "did you mean"; a concurrency value that cannot be read
keeps its text and its error through a submit; a local model directory that does not exist
is refused before anything is queued."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from portal.benchmarks.models import Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)


def _settled(page: Any) -> None:
    page.wait_for("document.getElementById('check-status').textContent !== 'checking…'")


@pytest.fixture
def newcomer(make_user: Any, settings: Any, tmp_path: Path) -> Any:
    settings.SERVEBENCH_EXECUTOR = "local"
    settings.SERVEBENCH_LOCAL_GPUS = 1
    settings.SERVEBENCH_MODEL_ROOTS = [str(tmp_path)]
    return make_user("newcomer")


def test_backend_boxes_and_preset_yaml_show_what_the_spec_says(page: Any, newcomer: Any) -> None:
    page.sign_in(newcomer.username, "pw-newcomer")
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto("/runs/new/?preset=seed-all-baselines")
        _settled(page)
        ticked = page.page.eval_on_selector_all(
            "input[name=backends]:checked", "els => els.map(e => e.value)"
        )
        assert sorted(ticked) == [
            "hf-batched", "hf-sequential", "hf-static-cache", "transformers-serve", "vllm",
        ]  # fmt: skip
        text = page.page.input_value("#id_spec_text")
        assert "\n  - 1\n  - 4\n" in text and "1.0" not in text and "- 64.0" not in text
        page.assert_fits()
        page.shot(f"form-all-baselines-{width}")
        # Unticking one kind removes it from the spec, and only it.
        page.page.uncheck("input[name=backends][value=hf-batched]")
        page.wait_for("!document.getElementById('id_spec_text').value.includes('kind: hf-batched')")
        assert "kind: hf-static-cache" in page.page.input_value("#id_spec_text")


def test_a_misspelt_kind_says_did_you_mean(page: Any, newcomer: Any) -> None:
    page.sign_in(newcomer.username, "pw-newcomer")
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto("/runs/new/?preset=seed")
        _settled(page)
        text = page.page.input_value("#id_spec_text")
        page.page.fill("#id_spec_text", text.replace("kind: hf-sequential", "kind: hf-sequentail"))
        page.wait_for("!document.getElementById('spec-problems').hidden")
        problems = page.page.inner_text("#spec-problems")
        assert "spec.backends.0.kind: 'hf-sequentail': did you mean 'hf-sequential'?" in problems
        assert "Input tag" not in problems and "expected tags" not in problems
        page.assert_fits()
        page.shot(f"form-did-you-mean-{width}")


def test_an_unreadable_concurrency_keeps_its_text_and_error_through_a_submit(
    page: Any, newcomer: Any
) -> None:
    page.sign_in(newcomer.username, "pw-newcomer")
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto("/runs/new/?preset=seed")
        _settled(page)
        page.page.fill("#id_concurrency", "1, x, 4")
        page.wait_for("!document.getElementById('concurrency-errors').hidden")
        _settled(page)
        page.page.click("#run-form button[type=submit]")
        page.page.wait_for_load_state()
        assert Run.objects.count() == 0
        assert page.page.input_value("#id_concurrency") == "1, x, 4"
        errors = page.page.inner_text("#concurrency-errors")
        assert "'x' is not a positive whole number" in errors
        # The page's own check after the reload agrees with the submit.
        page.page.fill("#id_name", f"still wrong at {width}")
        page.wait_for("document.getElementById('id_spec_text').value.includes('still wrong')")
        _settled(page)
        assert "'x' is not a positive whole number" in page.page.inner_text("#concurrency-errors")
        page.assert_fits()
        page.shot(f"form-concurrency-kept-{width}")


def test_a_missing_local_model_directory_is_refused_at_its_field(
    page: Any, newcomer: Any, tmp_path: Path
) -> None:
    page.sign_in(newcomer.username, "pw-newcomer")
    missing = tmp_path / "no-such-model"
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto("/runs/new/?preset=seed")
        _settled(page)
        page.page.fill("#id_model_id", str(missing))
        page.wait_for("!document.getElementById('model_id-errors').hidden")
        assert "there is no directory" in page.page.inner_text("#model_id-errors")
        _settled(page)
        page.page.click("#run-form button[type=submit]")
        page.page.wait_for_load_state()
        assert Run.objects.count() == 0
        assert "there is no directory" in page.page.inner_text("#model_id-errors")
        page.assert_fits()
        page.shot(f"form-missing-model-{width}")
    assert page.console_errors == []

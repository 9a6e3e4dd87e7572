"""The CI examples stay runnable: their spec validates once the image is filled in, and
every ``servebench`` command they contain parses with today's CLI."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from runners import spec as rs
from servebench.cli import build_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PIPELINES = ("github-actions.yml", "gitlab-ci.yml")


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


def commands(name: str) -> list[list[str]]:
    pipeline = yaml.safe_load((EXAMPLES / name).read_text())
    found = []
    for text in strings(pipeline):
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("servebench "):
                found.append(shlex.split(line)[1:])
    return found


def test_the_ci_spec_validates_once_the_image_is_filled_in():
    text = (EXAMPLES / "ci-spec.yaml").read_text()
    assert "@IMAGE@" in text
    spec = rs.loads_spec(text.replace("@IMAGE@", "ghcr.io/org/repo/vllm:0123abcd"))
    assert spec.repeats >= 2  # throughput gets a run-to-run noise estimate
    assert spec.workload.num_prompts >= 437  # a bounded p99 interval (docs/verdict.md)


@pytest.mark.parametrize("name", PIPELINES)
def test_every_servebench_command_in_the_pipelines_parses(name):
    found = commands(name)
    assert found, f"no servebench command in {name}"
    parser = build_parser()
    for argv in found:
        parser.parse_args(argv)  # a UsageError would fail the test with its message
    flat = [" ".join(argv) for argv in found]
    assert any("--label main" in c and "--wait" in c for c in flat)
    assert any("--compare-to latest:main" in c and "--summary" in c for c in flat)


def test_the_config_search_example_expands_to_its_configurations():
    spec = rs.loads_spec((EXAMPLES / "config-search.yaml").read_text())
    assert len(spec.config_names) == 6 and spec.config_names[0] == "vllm-seqs16-noprefix"
    assert [b.name for b in spec.search_backends] == spec.config_names
    assert spec.config_search is not None and spec.config_search.budget is not None

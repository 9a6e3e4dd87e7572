"""A configuration search on the tiny model, for real: three vLLM servers (max_num_seqs 4,
1, 16) one after another, vLLM's bench client, an SLA search on concurrency within p99
TTFT <= 150 ms, and early dropping.

Why the SLO splits them: at concurrency 4 a server that runs one sequence at a time
queues three requests behind one that decodes 32 tokens (~100 ms on these CPUs), so its
p99 TTFT is several hundred ms, while a server that batches four starts them all within
tens of ms. max_num_seqs 4 leads (the whole range, concurrency 1 to 4, meets the SLO);
max_num_seqs 1 is measured first at the leader's answer, misses there twice (the miss is
confirmed) and is dropped; max_num_seqs 16 passes there and is done (the top of the range).

Each configuration's sweep point is at concurrency 4 too (the workload's), so the winner
is measured a second time at its answer: that re-measurement must meet the SLO as well.
Three server starts (~100 s each on 2 CPU cores): the one run of this module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runners.result import ResultDocument
from runners.runner import ExitCode, Runner
from runners.spec import parse_spec

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("have_vllm"), pytest.mark.timeout(1800)]

SLO_MS = 150.0


def test_a_search_over_three_configurations_drops_one_early_and_ranks(tiny_model, tmp_path):
    spec = parse_spec(
        {
            "name": "config search on the tiny model",
            "model": {"id": str(tiny_model), "max_model_len": 512},
            "workload": {
                "input_len": 32,
                "output_len": 32,
                "num_prompts": 8,
                "num_warmups": 1,
                "max_concurrency": 4,
                "ignore_eos": True,
            },
            "backends": [{"kind": "vllm"}],
            "config_search": {"grid": {"max_num_seqs": [4, 1, 16]}},
            "sla_search": {
                "axis": "max_concurrency",
                "slo": {"p99_ttft_ms": SLO_MS},
                "low": 1,
                "high": 4,
                "max_points": 3,
            },
            "resources": {"gpu_count": 0, "timeout_minutes": 30},
        }
    )
    out = tmp_path / "result.json"
    code = Runner(spec, workdir=tmp_path / "work", out=out).run()
    document = ResultDocument.model_validate_json(out.read_text())
    searches = {s["backend"]: s for s in document.sla_searches}
    detail = "\n".join(f"{n}: {s['text']}" for n, s in searches.items())
    assert code == ExitCode.OK, detail + str(document.errors)

    leader, dropped, third = (searches[n] for n in ("vllm-seqs4", "vllm-seqs1", "vllm-seqs16"))
    assert leader["answer"] == 4 and leader["state"] == "top of range", detail
    assert dropped["state"] == "dropped", detail
    assert [s["value"] for s in dropped["path"]] == [4.0, 4.0]  # the gate, confirmed
    assert dropped["text"].startswith(
        "dropped: missed p99 TTFT <= 150 ms at concurrency 4 where vllm-seqs4 met it"
    )
    assert third["path"][0]["value"] == 4.0 and third["answer"] == 4, detail

    outcomes = {o["name"]: o for o in document.config_search}
    assert [o["state"] for o in document.config_search] == ["measured", "dropped", "measured"]
    assert outcomes["vllm-seqs1"]["reason"] == dropped["text"]
    # 3 sweep points + 2 + 2 + 1 search points: what a run with a drop has, no more.
    assert len(document.measurements) == 8

    # The winner measured once more at its answer (its sweep point, concurrency 4).
    winner = max(
        ("vllm-seqs4", "vllm-seqs16"),
        key=lambda n: next(
            m.metrics["output_throughput"]
            for m in document.measurements
            if m.backend == n and m.point.key == "sla:max_concurrency=4"
        ),
    )
    again = next(
        m for m in document.measurements if m.backend == winner and m.point.key == "single"
    )
    assert again.point.max_concurrency == 4
    assert again.metrics["p99_ttft_ms"] <= SLO_MS, again.metrics
    Path(tmp_path / "searches.txt").write_text(detail)

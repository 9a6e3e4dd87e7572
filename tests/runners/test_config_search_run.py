"""A configuration search on the tiny model, for real: three vLLM servers (max_num_seqs 4,
1, 16) one after another, vLLM's bench client, an SLA search on concurrency within median
TTFT <= 400 ms, and early dropping.

Why the SLO splits them: at concurrency 4 a server that runs one sequence at a time
queues three requests behind one that decodes 128 tokens (~0.2 s on these shared CPUs),
so once the first few are through, each request waits ~0.6 s for its first token, while
a server that batches four starts each within a step or two (10-50 ms). The median, not
the p99: of 8 requests the p99 is the slowest one, and on 2 shared cores one stall of the
machine puts it anywhere (a CI run saw max_num_seqs 4 at 466 ms at concurrency 1 and 63 ms at 4);
the median moves with the queueing, which is what this test is about. A point of 8
requests lasted under a second, so one stall of the shared cores could still hold up
most of them (a CI run: the bench client starved for ~0.7 s, every first token of
max_num_seqs 4 at concurrency 4 read at its request's end, median 464 ms): each point
sends 24 requests (5-12 s), and every miss is measured once more before the search
believes it (``confirm: failures``; a stall only ever adds latency). Eager mode: no
torch.compile at each server start (20 s less for three). max_num_seqs 4
leads (the whole range, concurrency 1 to 4, meets the SLO); max_num_seqs 1 is measured
first at the leader's answer, misses there twice (the miss is confirmed) and is dropped;
max_num_seqs 16 is measured first there too (a stall of the shared machine may drop it as
well: either is said).

Each configuration's sweep point is at concurrency 4 too (the workload's), so the winner
is measured a second time at its answer: that re-measurement must meet the SLO as well.
Three server starts (~100 s each on 2 CPU cores): the one real run of this module; the
budget's test starts one server that fails at once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runners import configsearch as cs
from runners.bottleneck import diagnose
from runners.result import ResultDocument
from runners.runner import ExitCode, Runner
from runners.spec import parse_spec

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("have_vllm"), pytest.mark.timeout(1800)]

SLO_MS = 400.0


def test_a_search_over_three_configurations_drops_one_early_and_ranks(tiny_model, tmp_path):
    spec = parse_spec(
        {
            "name": "config search on the tiny model",
            "model": {"id": str(tiny_model), "max_model_len": 512},
            "workload": {
                "input_len": 32,
                "output_len": 128,
                "num_prompts": 24,
                "num_warmups": 1,
                "max_concurrency": 4,
                "ignore_eos": True,
            },
            "backends": [{"kind": "vllm", "enforce_eager": True}],
            "config_search": {"grid": {"max_num_seqs": [4, 1, 16]}},
            "sla_search": {
                "axis": "max_concurrency",
                "slo": {"median_ttft_ms": SLO_MS},
                "low": 1,
                "high": 4,
                "max_points": 4,
                "confirm": "failures",
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
    # Low, then high; a miss at the high end (a stall) measured again, and met there.
    assert [s["value"] for s in leader["path"]] in ([1.0, 4.0], [1.0, 4.0, 4.0]), detail
    assert dropped["state"] == "dropped", detail
    assert [s["value"] for s in dropped["path"]] == [4.0, 4.0]  # the gate, confirmed
    assert dropped["text"].startswith(
        "dropped: missed median TTFT <= 400 ms at concurrency 4 where vllm-seqs4 met it"
    )
    assert third["path"][0]["value"] == 4.0, detail  # gated by the leader's answer
    assert third["state"] in ("top of range", "dropped"), detail

    outcomes = {o["name"]: o for o in document.config_search}
    third_state = "measured" if third["answer"] == 4 else "dropped"
    states = [o["state"] for o in document.config_search]
    assert states == ["measured", "dropped", third_state]
    assert outcomes["vllm-seqs1"]["reason"] == dropped["text"]
    # The sweep points and the searches' paths, nothing more: the leader low and high,
    # the dropped one its gate twice, the third its gate (and a confirmation of a miss).
    assert len(dropped["path"]) == 2
    assert len(third["path"]) in (1, 2)
    searched = len(leader["path"]) + len(dropped["path"]) + len(third["path"])
    assert len(document.measurements) == 3 + searched

    # The winner measured once more at its answer (its sweep point, concurrency 4).
    winner = max(
        ("vllm-seqs4", "vllm-seqs16")[: 1 + (third_state == "measured")],
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
    # It meets the SLO, unless its load generator was starved of CPU while it ran: then
    # the point says so itself. (A CI run: the bench client waited for a core 4 of 4.5 s,
    # read each answer's 128 chunks at once at its end, so every TTFT was its latency.)
    limit = diagnose(again.model_dump())
    met = again.metrics["median_ttft_ms"] <= SLO_MS
    assert met or limit.cause == "client", (again.metrics, again.conditions, limit)
    Path(tmp_path / "searches.txt").write_text(detail)


def test_the_budget_leaves_later_configurations_unstarted_and_says_so(tmp_path):
    """A model no server can load: the first configuration's server exits at once (its two
    points fail), which spends the budget of 2 points, so the others never start."""
    bad = tmp_path / "not-a-model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    spec = parse_spec(
        {
            "model": {"id": str(bad), "max_model_len": 512},
            "workload": {"input_len": 32, "output_len": 16, "num_prompts": 4},
            "backends": [{"kind": "vllm"}],
            "config_search": {"grid": {"max_num_seqs": [4, 1, 16]}, "budget": {"points": 2}},
            "sla_search": {
                "axis": "max_concurrency",
                "slo": {"median_ttft_ms": SLO_MS},
                "low": 1,
                "high": 4,
            },
        }
    )
    out = tmp_path / "result.json"
    assert Runner(spec, workdir=tmp_path / "work", out=out).run() == ExitCode.FAILED
    document = ResultDocument.model_validate_json(out.read_text())
    assert {m.backend for m in document.measurements} == {"vllm-seqs4"}
    assert len(document.measurements) == 2
    states = [(o["name"], o["state"]) for o in document.config_search]
    assert states == [
        ("vllm-seqs4", "measured"),
        ("vllm-seqs1", "not measured"),
        ("vllm-seqs16", "not measured"),
    ]
    why = "not measured: the budget of 2 points was spent (2 measured)"
    assert document.config_search[1]["reason"] == why
    assert document.timings[cs.TIMINGS_KEY][cs.NOT_MEASURED] == {
        "vllm-seqs1": why,
        "vllm-seqs16": why,
    }

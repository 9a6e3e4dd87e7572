"""Trace formats, the replay window and time scale, prompts that share prefixes, session
files, the eval file, and the spec's refusals: no server (test_traffic.py has one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runners.fingerprint import fingerprint
from runners.spec import SpecError, Trace, parse_spec
from runners.traffic import correctness, traces

M = {"id": "/m", "max_model_len": 4096}
VLLM = [{"kind": "vllm"}]


def mooncake(path: Path, rows: list[tuple[int, int, int, list[int]]]) -> Path:
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h})
            + "\n"
            for t, i, o, h in rows
        )
    )
    return path


def test_mooncake_windows_scale_and_clip(tmp_path):
    path = mooncake(
        tmp_path / "t.jsonl",
        [(1000, 64, 8, [1, 2]), (1500, 32, 4, [1]), (3000, 5000, 8, []), (9000, 16, 2, [])],
    )
    whole = traces.load(Trace(path=str(path), format="mooncake"), max_model_len=4096)
    assert [r.at_s for r in whole.requests] == [0.0, 0.5, 2.0, 8.0]  # from the first arrival
    assert whole.clipped == 1 and whole.requests[2].input_len + 8 <= 4096
    fast = traces.load(Trace(path=str(path), format="mooncake", time_scale=0.5))
    assert [r.at_s for r in fast.requests] == [0.0, 0.25, 1.0, 4.0]
    window = traces.load(
        Trace(path=str(path), format="mooncake", start_s=0.5, duration_s=2, max_requests=1)
    )
    assert [(r.at_s, r.input_len) for r in window.requests] == [(0.0, 32)]
    with pytest.raises(traces.TraceError, match="holds no request"):
        traces.load(Trace(path=str(path), format="mooncake", start_s=100))


def test_equal_leading_hash_ids_give_equal_leading_tokens():
    source = traces.TokenSource(list(range(10, 500)), block_size=4, seed=0)
    a = source.prompt(traces.TraceRequest(0, 10, 1, [7, 8]), 0)
    b = source.prompt(traces.TraceRequest(0, 10, 1, [7, 9]), 1)
    c = source.prompt(traces.TraceRequest(0, 3, 1, [7, 8]), 2)
    assert len(a) == len(b) == 10 and a[:4] == b[:4] and a[4:8] != b[4:8]
    assert c == a[:3]  # a prompt shorter than its blocks is their start


def test_burstgpt_and_azure_columns(tmp_path):
    burst = tmp_path / "b.csv"
    burst.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,100,20,120,Conversation log\n"
        "7.5,GPT-4,50,0,50,Conversation log\n"
        "9,ChatGPT,30,10,40,API log\n"
    )
    loaded = traces.load(Trace(path=str(burst), format="burstgpt"))
    assert [(r.at_s, r.input_len, r.output_len) for r in loaded.requests] == [
        (0.0, 100, 20),
        (4.0, 30, 10),
    ]
    assert loaded.skipped == 1  # a failed request in the log: no answer to replay
    azure = tmp_path / "a.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    loaded = traces.load(Trace(path=str(azure), format="azure"))
    assert loaded.requests[1].at_s == pytest.approx(4.314579, abs=1e-5)
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens\n1,2\n")
    with pytest.raises(traces.TraceError, match="missing: 'GeneratedTokens'"):
        traces.load(Trace(path=str(bad), format="azure"))
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1,x,2\n")
    with pytest.raises(traces.TraceError, match="line 2: ContextTokens must be a number"):
        traces.load(Trace(path=str(bad), format="azure"))


def test_the_eval_file_is_checked_and_scored(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text('{"prompt": "2+2=", "expected": "4"}\n{"prompt": "x", "expected": "[0-9]+", '
                    '"match": "regex", "output_len": 8}\n')  # fmt: skip
    spec = parse_spec(
        {
            "model": M,
            "workload": {"sessions": {}},
            "backends": VLLM,
            "correctness": {"eval_file": str(path)},
        }
    )
    items = correctness.eval_items(spec)
    assert [i["match"] for i in items] == ["exact", "regex"] and items[0]["output_len"] == 32
    assert correctness.score(items[0], " 4\n") and not correctness.score(items[0], "four")
    assert correctness.score(items[1], "it is 42.")
    assert correctness.agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 0.5
    path.write_text('{"prompt": "x", "expected": "(", "match": "regex"}\n')
    with pytest.raises(traces.TraceError, match="line 1: 'expected' is not a regular"):
        correctness.eval_items(spec)


def test_new_fields_stay_out_of_the_fingerprint_until_set():
    plain = parse_spec({"model": M, "backends": VLLM})
    dumped = plain.model_dump()
    assert "correctness" not in dumped
    assert "trace" not in dumped["workload"] and "sessions" not in dumped["workload"]
    sessions = parse_spec({"model": M, "backends": VLLM, "workload": {"sessions": {}}})
    assert fingerprint(sessions) != fingerprint(plain)


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        (
            {"workload": {"trace": {"path": "/t.jsonl", "format": "mooncake"}}},
            "backends.0.kind",
            "the HF baseline cannot replay a trace",
        ),
        (
            {"workload": {"trace": {"path": "/t.csv", "format": "mooncake"}}, "backends": VLLM},
            "workload.trace.path",
            "ends in .jsonl",
        ),
        (
            {"workload": {"sessions": {}, "request_rate": 2}, "backends": VLLM},
            "workload.sessions",
            "sets the prompts and arrivals itself",
        ),
        (
            {
                "workload": {"sessions": {}},
                "sweeps": [{"name": "c", "axis": "max_concurrency", "values": [1, 2]}],
                "backends": VLLM,
            },
            "sweeps.0",
            "sweeps do not apply",
        ),
        (
            {"workload": {"sessions": {"source": "custom"}}, "backends": VLLM},
            "workload.sessions.path",
            "need the file's path",
        ),
        (
            {"workload": {"sessions": {"turns": 10}, "input_len": 512}, "backends": VLLM},
            "workload.sessions.turns",
            "exceeds model.max_model_len",
        ),
        (
            {"correctness": {}, "backends": VLLM},
            "correctness",
            "set workload.trace or workload.sessions",
        ),
        (
            {
                "workload": {"sessions": {}, "temperature": 0.7},
                "correctness": {},
                "backends": VLLM,
            },
            "correctness.reference",
            "needs greedy decoding",
        ),
    ],
    ids=["hf", "extension", "rate", "sweep", "path", "context", "no-traffic", "sampling"],
)
def test_traffic_the_spec_cannot_run_is_refused_naming_the_field(data, field, words):
    with pytest.raises(SpecError) as caught:
        parse_spec({"model": M, **data})
    first = caught.value.errors[0]
    assert first["field"] == field, caught.value.errors
    assert words in first["message"]


def test_speculative_decoding_metrics_come_from_the_servers_counters():
    from runners import server_metrics as sm

    before = sm.parse(
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 7.0\n'
    )
    after = sm.parse(
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 110.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 330.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 162.0\n'
    )
    deltas = [after[n] - before[n] for n in sm.SPEC_DECODE]
    got = sm.spec_decode(*deltas)
    assert got["spec_decode_acceptance_rate"] == pytest.approx(150 / 300)
    assert got["spec_decode_mean_accepted_length"] == pytest.approx(1 + 150 / 100)
    assert sm.spec_decode(None, None, None) == {} and sm.spec_decode(0, 0, 0) == {}


def _document(name: str, agreement: list[float], kv: str = "auto") -> dict:
    spec = {
        "model": {"id": "org/tiny-model"},
        "workload": {"sessions": {}, "input_len": 64},
        "backends": [{"kind": "vllm", "name": name, "kv_cache_dtype": kv}],
        "correctness": {"sample": 8},
    }
    point = {"key": "single"}
    return {
        "spec": spec,
        "environment": {"gpu": {"model": "NVIDIA H100 80GB HBM3", "count": 1}},
        "measurements": [
            {"backend": name, "backend_kind": "vllm", "point": point, "repeat": r,
             "status": "succeeded", "detail": {},
             "metrics": {"output_throughput": 1000.0 + r, "greedy_agreement": a}}
            for r, a in enumerate(agreement)
        ],
    }  # fmt: skip


def test_compare_judges_the_answers_beside_the_speed():
    from servebench.compare import compare_documents

    base = _document("bf16", [1.0, 0.98, 0.99])
    fp8 = _document("fp8", [0.41, 0.44, 0.40], kv="fp8")
    comparison = compare_documents(base, fp8)
    assert comparison.comparable
    (point,) = comparison.points
    verdicts = {v.metric: v.verdict for v in point.verdicts}
    assert verdicts["greedy_agreement"] == "worse"  # the faster configuration's answers moved
    assert comparison.regressed
    assert "both runs checked their answers under load" in comparison.quality_note

"""A configuration search's run as the runner stores it, for the ranking's tests (the
module, the API and CLI, the page): max_num_seqs 4, 1, 8 with an SLA search on concurrency
within p99 TTFT <= 300 ms. Each configuration meets the SLO up to a concurrency of its
max_num_seqs; output tok/s is 10 x the load; median TPOT 4 ms (seqs8: 5 ms)."""

from __future__ import annotations

from typing import Any

from portal.benchmarks import ingestion
from runners import result as rr
from runners import sla
from runners.spec import parse_spec

SLO = {"p99_ttft_ms": 300}
SEARCH = {"axis": "max_concurrency", "slo": SLO, "low": 1, "high": 16, "max_points": 6}
CAPACITY = {"vllm-seqs4": 4, "vllm-seqs1": 1, "vllm-seqs8": 8}


def config_spec(spec_dict: Any, **extra: Any) -> dict[str, Any]:
    return spec_dict(
        sweeps=[],
        config_search={"grid": {"max_num_seqs": [4, 1, 8]}, **extra},
        sla_search=SEARCH,
    )


def body(measurement: Any, backend: str, key: str, value: float, repeat: int = 0) -> Any:
    ttft = 100.0 if value <= CAPACITY[backend] else 900.0
    b = measurement(backend, key, repeat)
    b["metrics"].update(
        output_throughput=10.0 * value,
        p99_ttft_ms=ttft,
        median_tpot_ms=5.0 if backend == "vllm-seqs8" else 4.0,
    )
    return rr.Measurement.model_validate(b)


def searched_run(
    make_run: Any, spec_dict: Any, measurement: Any, configs: int = 3, **extra: Any
) -> Any:
    """The run as the runner measures it: each configuration's sweep point, then its
    search, the later ones gated by the leader's answer (runners.sla.gates); only the
    first ``configs`` configurations (the rest as if the budget stopped them)."""
    data = config_spec(spec_dict, **extra)
    run = make_run(spec=data, status="running")
    spec = parse_spec(run.spec, stored=True)
    done: list[Any] = []
    for name in spec.config_names[:configs]:
        single = body(measurement, name, "single", 1.0)
        single.point = single.point.model_copy(update={"axis": None, "value": None})
        ingestion.ingest_measurement(run, single)
        done.append(single)
        gate = sla.gates(spec, done).get(name)
        steps: list[sla.Step] = []
        while (value := sla.next_value(spec.sla_search, steps, gate)) is not None:
            repeat = sla.next_repeat(steps, value)
            m = body(measurement, name, f"sla:max_concurrency={value:g}", value, repeat)
            ingestion.ingest_measurement(run, m)
            done.append(m)
            steps = sla.steps_of(spec, name, done)
    return run

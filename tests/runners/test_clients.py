"""Several load generators per point (``workload.clients``): the parts that need no server.

The real runs (three clients against one tiny vLLM server merged exactly, a client held
off its core named as the limit) share the server of ``test_vllm.py``.
"""

from __future__ import annotations

from pathlib import Path

from portal.benchmarks import commands
from runners import clientprobe
from runners import multiclient as mc
from runners.spec import parse_spec
from runners.vllm_bench import bench_script


def spec_with(**workload):
    base = {"input_len": 64, "output_len": 16, "num_prompts": 18, "max_concurrency": 6}
    return parse_spec(
        {
            "model": {"id": "m", "max_model_len": 512},
            "workload": base | workload,
            "backends": [{"kind": "vllm"}],
        }
    )


def test_each_client_sends_its_share_with_its_own_seed():
    spec = spec_with(clients=4, num_prompts=18, max_concurrency=6, num_warmups=8, seed=7)
    parts = mc.split(spec, spec.points()[0], 4)
    assert [p.num_prompts for _, p in parts] == [5, 5, 4, 4]
    assert [p.max_concurrency for _, p in parts] == [2, 2, 1, 1]
    assert [s.workload.seed for s, _ in parts] == [7, 8, 9, 10]
    assert [s.workload.num_warmups for s, _ in parts] == [2, 2, 2, 2]
    rated = spec_with(clients=4, request_rate=10.0)
    assert {p.request_rate for _, p in mc.split(rated, rated.points()[0], 4)} == {2.5}


def test_clients_get_a_core_each_or_say_that_they_share():
    assert mc.placement([0, 1, 2, 3], 3) == ([[3], [2], [1]], "each client on its own core of 4")
    cores, how = mc.placement([0, 1], 3)
    assert cores == [[1], [0], [1]] and how.startswith("3 clients share 2 cores")


def test_the_run_page_shows_the_commands_the_clients_ran():
    spec = spec_with(clients=3)
    point = spec.points()[0]
    ran = [Path(f"/work/run/vllm-single-r0.c{i}.json") for i in range(3)]
    reported = bench_script(spec, point, "http://127.0.0.1:41234", ran)
    assert reported.count("vllm bench serve") == 3 and reported.endswith("&\nwait")
    assert "--num-prompts 6 --max-concurrency 2" in reported
    shown = commands.shown(spec, "vllm", point.key, {"bench": reported})
    assert shown == {"commands": {"serve": shown["commands"]["serve"], "bench": reported},
                     "replaced": []}  # fmt: skip


# --------------------------------------------------------------------------- clients: auto


def test_auto_probes_at_the_heaviest_point_within_its_cores_and_prompts():
    spec = parse_spec(
        {
            "model": {"id": "m", "max_model_len": 512},
            "workload": {"input_len": 64, "output_len": 16, "num_prompts": 600, "clients": "auto"},
            "sweeps": [{"name": "c", "axis": "max_concurrency", "values": [2, 64, 16]}],
            "backends": [{"kind": "vllm"}],
        }
    )
    point = clientprobe.probe_point(clientprobe.heaviest(spec))
    # The heaviest point, its prompts capped at four rounds of its concurrency (256).
    assert (point.key, point.max_concurrency, point.num_prompts) == (
        "clients-probe:max_concurrency=64",
        64,
        256,
    )
    assert clientprobe.limit(point, cores=3) == 3  # a client per core at most
    assert clientprobe.limit(point, cores=32) == clientprobe.MAX_AUTO
    light = point.model_copy(update={"max_concurrency": 2})
    assert clientprobe.limit(light, cores=8) == 2  # one request in flight each at least
    # Before the probe (and in the portal's implied commands without one): one client.
    assert mc.clients_for(spec, point) == 1


def test_auto_keeps_adding_clients_while_the_rate_grows_by_a_tenth():
    def tried(*rates):
        return [{"clients": i + 1, "request_throughput": r} for i, r in enumerate(rates)]

    # 100 -> 150 (+50%) -> 160 (+7%, below 10%): two clients.
    n, why = clientprobe.choose(tried(100.0, 150.0, 160.0), at_limit=False)
    assert n == 2
    assert why == (
        "1 client 100 req/s, 2 clients 150 req/s (+50%), 3 clients 160 req/s (+7%); "
        "3 clients added less than 10%: 2 clients."
    )
    # Growth measured against the best so far, not the previous try.
    assert clientprobe.choose(tried(100.0, 90.0), at_limit=False)[0] == 1
    n, why = clientprobe.choose(tried(100.0, 200.0), at_limit=True)
    assert n == 2 and "2 clients is the most this point and these cores allow" in why
    failed = [*tried(100.0), {"clients": 2, "request_throughput": None, "error": "boom"}]
    n, why = clientprobe.choose(failed, at_limit=False)
    assert n == 1 and "2 clients failed (boom)" in why


def test_the_run_page_shows_the_commands_of_the_clients_auto_chose():
    spec = spec_with(clients="auto")
    point = spec.points()[0]
    ran = [Path(f"/work/run/vllm-single-r0.c{i}.json") for i in range(2)]
    reported = bench_script(mc.with_clients(spec, 2), point, "http://127.0.0.1:41234", ran)
    shown = commands.shown(spec, "vllm", point.key, {"bench": reported})
    assert shown["replaced"] == [] and shown["commands"]["bench"] == reported

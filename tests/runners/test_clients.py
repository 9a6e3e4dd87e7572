"""Several load generators per point (``workload.clients``): the parts that need no server.

The real runs (three clients against one tiny vLLM server merged exactly, a client held
off its core named as the limit) share the server of ``test_vllm.py``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from portal.benchmarks import commands
from runners import clientmerge, clientpods, clientprobe, podclient
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


# --------------------------------------------------------------------------- client Pods


def _ask(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method)  # noqa: S310 (http)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def _pod_clients(tmp_path: Path, n: int) -> list[mc.Client]:
    return [
        mc.Client(
            index=i,
            argv=[],
            result=tmp_path / f"p.c{i}.json",
            report=tmp_path / f"p.c{i}.fields.json",
            log=tmp_path / f"p.c{i}.client.log",
            cores=[],
        )
        for i in range(n)
    ]


def test_the_rendezvous_releases_the_clients_together_and_takes_only_their_files(tmp_path):
    clients = _pod_clients(tmp_path, 2)
    with clientpods.Rendezvous(clients, "127.0.0.1") as meet:
        base = meet.url
        assert _ask(f"{base}/go") == (204, b"")  # nobody ready: wait
        assert _ask(f"{base}/ready/0", "POST", b"1")[0] == 200
        assert not meet.all_ready()
        assert _ask(f"{base}/ready/1", "POST", b"1")[0] == 200 and meet.all_ready()
        meet.release(1234.5)
        assert _ask(f"{base}/go") == (200, json.dumps({"start_at": 1234.5}).encode())
        # Each client's files land where a local client's would.
        assert _ask(f"{base}/file/1/result", "PUT", b'{"completed": 3}')[0] == 200
        assert json.loads(clients[1].result.read_text()) == {"completed": 3}
        assert meet.has(1, "result") and not meet.has(0, "result")
        # Anything else is refused: another token, another client, another file.
        other = base.rsplit("/", 1)[0] + "/not-the-token"
        assert _ask(f"{other}/go")[0] == 404
        assert _ask(f"{other}/file/0/result", "PUT", b"x")[0] == 404
        assert _ask(f"{base}/ready/7", "POST", b"1")[0] == 404
        assert _ask(f"{base}/file/0/../../etc", "PUT", b"x")[0] == 404
        assert _ask(f"{base}/file/0/spec", "PUT", b"x")[0] == 404
        assert not clients[0].result.exists() and sorted(p.name for p in tmp_path.iterdir()) == [
            "p.c1.json"
        ]


def test_a_client_pod_runs_the_local_command_with_its_result_in_its_own_directory():
    argv = ["/venv/bin/python", "-m", "runners.bench_client", "--result-dir", "/work/run",
            "--result-filename", "v.c0.json", "--num-prompts", "6"]  # fmt: skip
    assert clientpods.pod_argv(argv) == [
        "python", "-m", "runners.bench_client", "--result-dir", clientpods.POD_WORKDIR,
        "--result-filename", "v.c0.json", "--num-prompts", "6",
    ]  # fmt: skip
    assert podclient.result_file(clientpods.pod_argv(argv)) == Path(
        clientpods.POD_WORKDIR, "v.c0.json"
    )


def test_clients_on_other_hosts_are_merged_on_the_runners_clock(tmp_path):
    """Two clients whose monotonic clocks are 1,000 s apart (two nodes): each one's
    requests are moved onto the runner's clock through the wall time it read at its
    release, so the union's window is the real 2 s, not 1,000 s."""
    runner_offset = 5_000.0  # the runner's time.time() - perf_counter()
    files, reports = [], []
    for i, own_offset in enumerate((5_000.0, 4_000.0)):  # node 2's clock runs 1,000 s ahead
        wall_start = 100_000.0 + i  # client 1 started one second after client 0
        perf = wall_start - own_offset
        data = {
            "start_times": [perf, perf + 0.5],
            "latencies": [0.5, 0.5],
            "ttfts": [0.1, 0.1],
            "itls": [[0.1], [0.1]],
            "output_lens": [2, 2],
            "input_lens": [4, 4],
            "errors": ["", ""],
            "generated_texts": ["", ""],
            "completed": 2,
            "num_prompts": 2,
            "total_input_tokens": 8,
            "total_output_tokens": 4,
        }
        path = tmp_path / f"c{i}.json"
        path.write_text(json.dumps(data))
        files.append(path)
        reports.append({"start": {"released_at": wall_start, "released_perf": perf}})
    merged, _ = clientmerge.merge(files, None, reports, None, clock_offset=runner_offset)
    # Client 0 from wall 100,000 to 100,001; client 1 from 100,001 to 100,002: 2 s.
    assert merged["request_throughput"] == pytest.approx(4 / 2.0)
    assert min(merged["start_times"]) == pytest.approx(100_000.0 - runner_offset)
    unaligned, _ = clientmerge.merge(files, None, reports, None)
    assert unaligned["request_throughput"] < 0.01  # what the raw clocks would have said

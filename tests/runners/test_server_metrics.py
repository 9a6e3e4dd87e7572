"""/metrics parsing, deltas and peaks (the live server is covered in test_vllm.py)."""

from __future__ import annotations

import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from runners.server_metrics import PointWatcher, cache_config, parse

EXPOSITION = """\
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="/models/my model"} 3.0
vllm:num_preemptions_total{engine="1",model_name="/models/my model"} 2.0
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="/models/my model"} 1.7e+09
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="/models/my model"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="/models/my model"} 0.5
vllm:num_requests_running{engine="0",model_name="/models/my model"} 4.0
vllm:num_requests_running{engine="1",model_name="/models/my model"} 3.0
vllm:num_requests_waiting{engine="0",model_name="/models/my model"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 9.0
vllm:prefix_cache_queries_total{engine="0",model_name="/models/my model"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="/models/my model"} 250.0
process_cpu_seconds_total 12.5
"""


def test_it_reads_only_the_wanted_series_combining_engines():
    assert parse(EXPOSITION) == {
        "vllm:num_preemptions_total": 5.0,  # counters add up over engines
        "vllm:kv_cache_usage_perc": 0.5,  # a fraction: the fullest engine
        "vllm:num_requests_running": 7.0,
        "vllm:num_requests_waiting": 0.0,  # not the *_by_reason series
        "vllm:prefix_cache_queries_total": 1000.0,
        "vllm:prefix_cache_hits_total": 250.0,
    }


def test_it_reads_the_allocated_kv_cache_from_cache_config_info():
    text = (
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",'
        'gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27000",'
        'prefix_caching_hash_algo="sha256"} 1.0\n'
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",'
        'gpu_memory_utilization="0.9",num_gpu_blocks="27000"} 1.0\n'
    )
    assert cache_config(text) == {
        "block_size": 16.0,
        "cache_dtype": "auto",
        "gpu_memory_utilization": 0.9,
        "num_gpu_blocks": 54000.0,  # two data-parallel engines
    }
    assert cache_config(EXPOSITION) == {}


def test_older_releases_report_gpu_cache_usage():
    assert parse("vllm:gpu_cache_usage_perc 0.75\n") == {"vllm:gpu_cache_usage_perc": 0.75}


class _Server:
    """Serves a /metrics whose counters grow and whose gauges move with each scrape; with
    ``filtered=False`` it answers the filtered path ``/metrics/?name[]=`` with a 404, as a
    server without prometheus_client's mount would."""

    def __init__(self, filtered: bool = True) -> None:
        self.scrapes = 0
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's server

            def do_GET(self) -> None:
                outer.paths.append(self.path)
                if self.path.startswith("/metrics/") and not filtered:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                outer.scrapes += 1
                n = outer.scrapes
                body = (
                    f"vllm:num_preemptions_total {n}\n"
                    f"vllm:prefix_cache_queries_total {100 * n}\n"
                    f"vllm:prefix_cache_hits_total {10 * n}\n"
                    f"vllm:kv_cache_usage_perc {0.9 if n == 2 else 0.1}\n"
                    f"vllm:num_requests_running {n}\n"
                ).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_port}"


@pytest.fixture(params=[True, False], ids=["filtered", "full"])
def metrics_server(request):
    server = _Server(filtered=request.param)
    yield server
    server.http.shutdown()
    server.http.server_close()


def wait_scrapes(server, n: int) -> None:
    """Until the server has answered ``n`` scrapes (a loaded machine is slow to start the
    watcher's thread: a fixed sleep could end before the first sample)."""
    deadline = time.monotonic() + 30
    while server.scrapes < n:
        assert time.monotonic() < deadline, f"{server.scrapes} scrapes in 30 s"
        time.sleep(0.01)


def test_a_point_gets_counter_deltas_and_sampled_peaks(metrics_server, hardware):
    with PointWatcher(metrics_server.url, interval_s=0.05) as watcher:
        wait_scrapes(metrics_server, 6)
    result = watcher.result()
    n = metrics_server.scrapes  # one before, the samples (the last at exit), one after
    # A sample whose scrape timed out on a loaded machine is not counted, but the server
    # saw the request: at most n - 2 samples.
    assert 3 <= result.samples <= n - 2
    assert result.preemptions == n - 1
    assert (result.prefix_cache_queries, result.prefix_cache_hits) == (100 * (n - 1), 10 * (n - 1))
    assert result.prefix_cache_hit_rate == pytest.approx(0.1)
    assert result.kv_cache_usage_peak == 0.9
    assert result.num_requests_running_peak == n - 1
    if hardware.nvidia:  # the GPUs this process sees were sampled: their memory in use
        assert isinstance(watcher.gpu_peak, int) and watcher.gpu_peak >= 0
    else:  # no NVIDIA driver: nothing to sample
        assert watcher.gpu_peak is None


def test_an_unreachable_server_gives_empty_metrics_not_an_error():
    with PointWatcher("http://127.0.0.1:9", interval_s=0.05) as watcher:
        time.sleep(0.2)
    result = watcher.result()
    assert result.samples == 0 and result.preemptions is None
    assert result.prefix_cache_hit_rate is None


def test_the_time_series_keeps_every_sample_with_counters_since_the_start(metrics_server):
    with PointWatcher(metrics_server.url, interval_s=0.02) as watcher:
        wait_scrapes(metrics_server, 8)
    series = watcher.series()
    samples = watcher.result().samples
    # The scrape before the point opens the series; then one entry per sample.
    assert len(series["t"]) == samples + 1 and series["interval_s"] == 0.02
    assert series["t"] == sorted(series["t"]) and series["t"][0] >= 0
    assert series["running"] == [float(n) for n in range(1, samples + 2)]
    # The batch decode had: the mean over the point's samples (the scrape before the
    # point is not one of them).
    assert watcher.result().num_requests_running_mean == pytest.approx(
        statistics.fmean(series["running"][1:])
    )
    assert series["preemptions"] == [float(n) for n in range(samples + 1)]
    assert series["prefix_cache_queries"][-1] == 100 * samples
    assert series["kv_cache_usage"][1] == 0.9  # the second scrape's spike is kept
    assert series["waiting"] is None  # never reported by this server


def test_it_asks_for_only_its_series_and_falls_back_to_the_full_exposition(metrics_server):
    with PointWatcher(metrics_server.url, interval_s=0.02) as watcher:
        time.sleep(0.2)
    telemetry = watcher.telemetry({})
    sampler = telemetry["sampler"]
    filtered = [p for p in metrics_server.paths if p.startswith("/metrics/?")]
    assert filtered and all("name%5B%5D=vllm%3Anum_requests_running" in p for p in filtered)
    if sampler["scrape"] == "filtered":
        # Every sample, and the reading after the point, filtered server-side (a scrape that
        # timed out on a loaded machine was asked for but is not a sample).
        assert len(filtered) >= sampler["scrapes"] + 1
    else:
        assert len(filtered) == 1  # asked once, refused, then the full exposition
    assert sampler["scrapes"] == watcher.result().samples > 0
    assert sampler["metrics_cpu_s"] >= 0 and sampler["scrape_ms_median"] > 0
    assert "window" not in telemetry  # no requests: nothing to sum over
    assert telemetry["gpu"]["status"] != "ok" or telemetry["gpu"]["devices"]

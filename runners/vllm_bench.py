"""One sweep point: vLLM's bench client against a running server or endpoint, parsed.

The client is vLLM's own (``runners.bench_client``) with every flag explicit, including
the ones whose defaults moved between releases (``--temperature 0``, percentiles,
``--request-rate inf``). Its ``--save-result --save-detailed`` JSON becomes the
Measurement: canonical metrics (``runners.result.METRIC_KEYS``), ``raw`` (everything but
per-request arrays) and ``detail`` (the arrays, minus generated texts).

A point where any request failed, or none completed, is a *failed* measurement carrying
the client's errors; its metrics are left empty so no chart ever plots a zero.

The target is a ``VLLMServer`` or a ``TransformersServer`` (``transformers serve``) the
runner started, or an ``Endpoint`` already deployed (``runners.endpoint``): the same client,
flags and parsing, so the numbers compare. ``transformers serve`` is asked through the
client's ``--transformers-fields`` adapter, which forces output lengths through its
``generation_config`` and checks them (``raw["servebench"]["length_check"]``; a point
where a length differs fails, ``length_failure``). An
endpoint's key reaches the client only as ``OPENAI_API_KEY`` in its environment; an
endpoint that takes only OpenAI fields is driven through the client's request adapter
(``runners.bench_client --openai-fields-only``). ``raw["servebench"]`` says how the
requests were made: the API, the fields dropped, and whether output lengths were forced
(``output_len``: ``forced``, ``natural`` when the spec let responses end at EOS, ``not
forced`` when the endpoint could not be asked to) with how many responses came back
shorter than requested.

The client run is bracketed by ``runners.conditions.Watch``: the ``conditions`` of the
point (CPU time of the server, its engine and the client against wall time, other
processes on the owned cores, steal, load) and whether something competed for them.
vLLM's CPU build binds its OpenMP threads within the runner's cores
(``VLLM_CPU_OMP_THREADS_BIND=auto`` follows the affinity the runner pinned, which the
server inherits); the value in effect is recorded.

A point of a spec with ``workload.clients: N`` runs N clients (``runners.multiclient``:
each its share, on its own core where the runner owns enough, released together at a
barrier) and measures their exact merge (``runners.clientmerge``): the merged result is
written where one client's would be and read the same way. Every measurement keeps each
client's saturation evidence in ``conditions["clients"]`` (one entry for one client).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import requests

from runners import causes, clientmerge, clientpods, nvml, procs
from runners import conditions as cond
from runners import multiclient as mc
from runners import telemetry as tm
from runners.bench_client import ADAPTERS, OPENAI_ONLY_FLAG, REPORT_ENV, TRANSFORMERS_FLAG
from runners.egress import pinned_session
from runners.endpoint import Endpoint, missing_key_reason, served_model
from runners.result import METRIC_KEYS, FullSamples, Measurement, PointInfo, utcnow
from runners.samplesfile import SAMPLE_OF
from runners.server_metrics import PointWatcher
from runners.spec import API_ENDPOINTS, EndpointBackend, Point, ServedBackend, Spec, VLLMBackend
from runners.transformers_server import TransformersServer
from runners.vllm_server import VLLMServer

Target = VLLMServer | Endpoint | TransformersServer


class _Skip(Exception):
    """The point cannot run (its reason is already set)."""


ENDPOINT_GPUS = "the endpoint's server runs on other GPUs than this machine's"
PER_REQUEST_KEYS = (
    "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
    "errors",
)  # fmt: skip
DROPPED_KEYS = ("generated_texts",)  # noise for random prompts, and megabytes of it
# A merge too large to hold (runners.clientmerge with a spill): its full samples' file and
# facts, and the reading sample's full count, which detail keeps (runners.samplesfile).
FULL_SAMPLES_KEYS = ("samples_full", "samples_file", SAMPLE_OF)


def request_mode(backend: ServedBackend | None) -> str:
    """How requests to this backend are made: 'vllm' (vLLM's client as is), 'openai'
    (OpenAI fields only) or 'transformers' (OpenAI fields and a generation_config)."""
    return getattr(backend, "request_fields", "vllm")


def adapter_flag(backend: ServedBackend | None) -> str | None:
    """The request adapter of ``runners.bench_client`` this backend needs, if any."""
    return {"openai": OPENAI_ONLY_FLAG, "transformers": TRANSFORMERS_FLAG}.get(
        request_mode(backend)
    )


def _dataset_flags(spec: Spec, point: Point) -> list[str]:
    w = spec.workload
    if w.dataset == "random":
        return [
            "--dataset-name", "random",
            "--random-input-len", str(point.input_len),
            "--random-output-len", str(point.output_len),
            "--random-range-ratio", str(w.range_ratio),
            "--random-prefix-len", str(w.prefix_len),
        ]  # fmt: skip
    if w.dataset == "prefix_repetition":
        return [
            "--dataset-name", "prefix_repetition",
            "--prefix-repetition-prefix-len", str(w.prefix_len),
            "--prefix-repetition-suffix-len", str(point.input_len),
            "--prefix-repetition-num-prefixes", str(w.num_prefixes),
            "--prefix-repetition-output-len", str(point.output_len),
        ]  # fmt: skip
    if w.dataset == "custom":
        # File order (the HF baseline takes the same first prompts); the prompt as written:
        # a chat server applies the template itself, a completions one gets the text.
        return [
            "--dataset-name", "custom",
            "--dataset-path", str(w.dataset_path),
            "--custom-output-len", str(point.output_len),
            "--disable-shuffle", "--skip-chat-template",
        ]  # fmt: skip
    return [
        "--dataset-name", "sharegpt",
        "--dataset-path", str(w.dataset_path),
        "--sharegpt-output-len", str(point.output_len),
    ]  # fmt: skip


def bench_flags(
    spec: Spec,
    point: Point,
    base_url: str,
    result_path: Path,
    backend: ServedBackend | None = None,
) -> list[str]:
    """Every `vllm bench serve` flag for this point (``backend`` default: a vLLM server
    asked through completions)."""
    w = spec.workload
    m = spec.model
    api = backend.api if backend is not None else "completions"
    vllm_server = backend is None or isinstance(backend, VLLMBackend)
    client = "openai-chat" if api == "chat" else "vllm" if vllm_server else "openai"
    flags = ["--backend", client, "--base-url", base_url, "--endpoint", API_ENDPOINTS[api]]
    flags += ["--model", m.id]
    if isinstance(backend, EndpointBackend) and served_model(spec, backend) != m.id:
        flags += ["--served-model-name", served_model(spec, backend)]
    if m.tokenizer:
        flags += ["--tokenizer", m.tokenizer]
    if m.trust_remote_code:
        flags.append("--trust-remote-code")
    flags += _dataset_flags(spec, point)
    rate = "inf" if point.request_rate is None else str(point.request_rate)
    flags += [
        "--num-prompts", str(point.num_prompts),
        "--max-concurrency", str(point.max_concurrency),
        "--request-rate", rate,
        "--burstiness", str(w.burstiness),
        "--seed", str(w.seed),
        "--num-warmups", str(w.num_warmups),
        "--temperature", f"{w.temperature:g}",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99",
    ]  # fmt: skip
    if w.top_p is not None:
        flags += ["--top-p", f"{w.top_p:g}"]
    if w.top_k is not None:
        flags += ["--top-k", str(w.top_k)]
    if w.ramp_up is not None:
        flags += [
            "--ramp-up-strategy", w.ramp_up.strategy,
            "--ramp-up-start-rps", str(w.ramp_up.start_rps),
            "--ramp-up-end-rps", str(w.ramp_up.end_rps),
        ]  # fmt: skip
    if backend is not None and backend.lora_names:
        flags += ["--lora-modules", *backend.lora_names]
        flags += ["--lora-assignment", backend.lora_assignment]
    if w.ignore_eos and request_mode(backend) != "openai":
        flags.append("--ignore-eos")  # transformers serve: as a generation_config
    if spec.slo:
        slo = spec.slo.model_dump(exclude_none=True)
        flags += ["--goodput", *(f"{k.removesuffix('_ms')}:{v:g}" for k, v in slo.items())]
    flags += [
        "--save-result", "--save-detailed",
        "--result-dir", str(result_path.parent),
        "--result-filename", result_path.name,
        "--disable-tqdm",
    ]  # fmt: skip
    return flags


def bench_script(
    spec: Spec,
    point: Point,
    base_url: str,
    results: list[Path],
    backend: ServedBackend | None = None,
) -> str:
    """The command of a point's load generators: one client's as ``bench_command``, or
    with ``workload.clients`` each client's for its share (``runners.multiclient``), run
    together; ``results``: each client's result file."""
    shares = mc.split(spec, point, len(results)) if len(results) > 1 else [(spec, point)]
    commands = [
        bench_command(bench_flags(s, p, base_url, path, backend), backend)
        for (s, p), path in zip(shares, results, strict=True)
    ]
    return commands[0] if len(commands) == 1 else mc.script(commands)


def traffic_driven(spec: Spec) -> bool:
    """A trace or sessions: the point is sent by ``runners.traffic``, not vLLM's client."""
    return spec.workload.trace is not None or spec.workload.sessions is not None


def traffic_flags(
    spec: Spec,
    base_url: str,
    result_path: Path,
    spec_path: Path,
    backend: ServedBackend | None = None,
) -> list[str]:
    """Every ``python -m runners.traffic`` flag for this backend (the spec as a file)."""
    api = backend.api if backend is not None else "completions"
    flags = ["--spec", str(spec_path), "--base-url", base_url, "--api", api]
    if isinstance(backend, EndpointBackend):
        flags += ["--served-model-name", served_model(spec, backend)]
    if request_mode(backend) != "vllm":
        flags.append("--text-prompts")  # only vLLM takes token ids as a prompt
    if request_mode(backend) == "openai":
        flags.append("--openai-fields-only")
    if backend is not None and backend.lora_names:
        flags += ["--lora-modules", *backend.lora_names]
        flags += ["--lora-assignment", backend.lora_assignment]
    return [*flags, "--result", str(result_path)]


def traffic_note(raw: dict[str, Any]) -> str | None:
    """The send lag (p99) and, when the client fell behind, that it did."""
    lag = (raw.get("traffic") or {}).get("lag") or {}
    if "p99_ms" not in lag:
        return None
    note = f"send lag p99 {lag['p99_ms']:.1f} ms, max {lag['max_ms']:.1f} ms"
    return f"{note}; {lag['note']}" if lag.get("note") else note


def bench_command(flags: list[str], backend: ServedBackend | None = None) -> str:
    """The client command a person would type; through the request adapter for a server
    that takes only OpenAI fields (``vllm bench serve`` has no such mode)."""
    flag = adapter_flag(backend)
    if flag:
        return shlex.join(["python", "-m", "runners.bench_client", flag, *flags])
    return shlex.join(["vllm", "bench", "serve", *flags])


def split_result(data: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any], dict[str, Any]]:
    """Client JSON -> (canonical metrics, raw without arrays, per-request arrays)."""
    metrics = {
        k: float(data[k])
        for k in METRIC_KEYS
        if isinstance(data.get(k), int | float) and not isinstance(data.get(k), bool)
    }
    detail = {k: data[k] for k in (*PER_REQUEST_KEYS, SAMPLE_OF) if k in data}
    dropped = (*PER_REQUEST_KEYS, *DROPPED_KEYS, *FULL_SAMPLES_KEYS)
    raw = {k: v for k, v in data.items() if k not in dropped}
    return metrics, raw, detail


def error_text(err: Any, limit: int = 300) -> str:
    """One request's error in one line: a traceback (what vLLM's client records for an
    exception) as its exception, the last line, where the cause is ("ServerDisconnectedError:
    Server disconnected"), never its first frames cut off before it."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].startswith("Traceback") and len(lines) > 1:
        return lines[-1][:limit]
    return " ".join(" ".join(lines).split())[:limit]


def client_failure(data: dict[str, Any], limit: int = 3) -> str | None:
    """Why a client result must not count (None when every request succeeded)."""
    completed = int(data.get("completed") or 0)
    failed = int(data.get("failed") or 0)
    if completed > 0 and failed == 0:
        return None
    seen: list[str] = []
    for err in data.get("errors") or []:
        text = error_text(err)
        if text and text not in seen:
            seen.append(text)
    total = completed + failed or data.get("num_prompts", "?")
    head = f"{failed} of {total} requests failed" if failed else "no request completed"
    if not seen:
        return f"{head} (the client recorded no error text; see its log)"
    more = f" (+{len(seen) - limit} more distinct)" if len(seen) > limit else ""
    return f"{head}; errors: " + " | ".join(seen[:limit]) + more


def probe(
    target: Target, spec: Spec, point: Point, backend: ServedBackend | None = None
) -> str | None:
    """Send one request shaped like the point's and quote the server's refusal, if any.

    The bench client records only the HTTP reason ('Bad Request'); the server's answer
    says what to change ("maximum context length is 512 tokens...", "extra fields not
    permitted"). The body carries the fields the client sends to this backend.
    """
    w = spec.workload
    endpoint = isinstance(backend, EndpointBackend)
    vllm_server = backend is None or isinstance(backend, VLLMBackend)
    if w.dataset not in ("random", "prefix_repetition") and vllm_server:
        return None
    api = backend.api if backend is not None else "completions"
    length = point.input_len + w.prefix_len
    model = served_model(spec, backend) if isinstance(backend, EndpointBackend) else spec.model.id
    if backend is not None and backend.lora_names:
        model = backend.lora_names[0]  # the client asks for adapters by name
    body: dict[str, Any] = {"model": model, "temperature": w.temperature}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "hello " * length}]
        body["max_completion_tokens"] = point.output_len
    else:
        body["prompt"] = [100] * length if vllm_server else "hello " * length
        body["max_tokens"] = point.output_len
        body["repetition_penalty"] = 1.0  # as vLLM's client sends it
    if w.ignore_eos:
        body["ignore_eos"] = True
    if (flag := adapter_flag(backend)) is not None:
        ADAPTERS[flag](body)  # the fields the client's adapter would send
    headers = target.headers if isinstance(target, Endpoint) else {}
    # Only to the target's origin, never following a redirect (runners.egress).
    session = (
        target.session
        if isinstance(target, Endpoint)
        else pinned_session(target.base_url, target.LABEL)
    )
    try:
        response = session.post(
            f"{target.base_url}{API_ENDPOINTS[api]}", json=body, headers=headers, timeout=120
        )
    except requests.RequestException:
        return None
    if response.status_code == 200:
        return None
    try:
        message = str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = response.text
    if isinstance(target, Endpoint) and target.key:
        message = message.replace(target.key, "[api key]")
    why = f"a request of this shape is refused with {response.status_code}: {message[:500]}"
    if endpoint and adapter_flag(backend) is None and response.status_code in (400, 422):
        why += (
            " (if the server takes only OpenAI fields, set request_fields: openai on this "
            "endpoint: vLLM's client sends repetition_penalty and ignore_eos)"
        )
    return why


def point_info(point: Point) -> PointInfo:
    return PointInfo(key=point.key, **point.model_dump())


def request_facts(
    spec: Spec, backend: ServedBackend, point: Point, detail: dict[str, Any], adapted: dict
) -> dict[str, Any]:
    """How the requests were made (``raw["servebench"]``): API, fields dropped and added
    by the request adapter, and the output lengths of the requests that succeeded."""
    asked = spec.workload.ignore_eos or spec.workload.dataset == "random"
    if request_mode(backend) == "openai" and asked:
        output_len = "not forced"
    else:
        output_len = "forced" if asked else "natural"
    errors = detail.get("errors") or []
    lens = [
        n
        for i, n in enumerate(detail.get("output_lens") or [])
        if isinstance(n, int | float) and not (i < len(errors) and errors[i])
    ]
    short = sum(1 for n in lens if n < point.output_len)
    long = sum(1 for n in lens if n > point.output_len)
    facts: dict[str, Any] = {
        "api": backend.api,
        "request_fields": getattr(backend, "request_fields", "vllm"),
        "output_len": output_len,
        "requested_output_len": point.output_len,
        "short_responses": short,
        "long_responses": long,
        "responses": len(lens),
    }
    for key in ("dropped_fields", "added_fields"):
        if adapted.get(key):
            facts[key] = adapted[key]
    lengths, stream = adapted.get("lengths"), adapted.get("stream")
    if lengths and request_mode(backend) == "transformers":
        facts["length_check"] = lengths  # each forced response's length, checked
    notes = []
    if stream:
        facts["stream"] = stream
        if stream["chunks"] < stream["tokens"]:
            notes.append(
                f"the server streamed {stream['chunks']} chunks for {stream['tokens']} tokens "
                "(it sends no chunk for a token that decodes to no text): inter-token "
                "latencies are per chunk, and a response's first token is its first text"
            )
    if output_len == "not forced":
        notes.insert(
            0,
            "output lengths could not be forced: this endpoint takes only OpenAI fields "
            f"(no ignore_eos); {short} of {len(lens)} responses ended before "
            f"{point.output_len} tokens"
            + (f" and {long} ran past it (the server ignored the limit)" if long else "")
            + "; the metrics count the tokens that came back",
        )
    if notes:
        facts["note"] = "; ".join(notes)
    return facts


def length_failure(backend: ServedBackend, facts: dict[str, Any]) -> str | None:
    """Why a point whose output lengths were forced must not count: responses of another
    length than asked (the same definitions would not hold), or None."""
    check = facts.get("length_check") or {}
    if not check.get("differing"):
        return None
    examples = ", ".join(f"asked {a}, got {g}" for a, g in check.get("examples") or [])
    return (
        f"{check['differing']} of {check['checked']} responses of {backend.name!r} came back "
        f"with another number of tokens than the request forced ({examples}), so its "
        "throughput would not compare with the other backends'. Next: check that this "
        "transformers version honours generation_config's eos_token_id, or measure natural "
        "lengths (workload.ignore_eos: false with a non-random dataset)"
    )


def _client_env(target: Target, backend: ServedBackend, report: Path) -> dict[str, str]:
    env = procs.python_env()
    env.pop("OPENAI_API_KEY", None)  # only an endpoint's own key, never one inherited
    if isinstance(target, Endpoint) and target.key:
        env["OPENAI_API_KEY"] = target.key
    env[REPORT_ENV] = str(report)  # the adapter's fields and the client's CPU time
    return env


def client_cpu(report: Path, telemetry: dict[str, Any]) -> dict[str, float]:
    """The load generator's own CPU over the requests' window (``client_cpu_s``,
    ``client_cpu_per_wall``: 1.0 is one core busy all the time), from the CPU samples
    its report holds; {} when either is missing (the traffic client, a failed point)."""
    try:
        samples = json.loads(report.read_text()).get("client_cpu") if report.exists() else None
    except (OSError, ValueError, AttributeError):
        return {}
    window, t0 = telemetry.get("window"), telemetry.get("t0")
    if not samples or not window or not isinstance(t0, int | float):
        return {}
    start, end = t0 + window[0], t0 + window[1]
    used = cond.window_cpu(samples, start, end)
    if used is None or end <= start:
        return {}
    return {"client_cpu_s": round(used, 3), "client_cpu_per_wall": round(used / (end - start), 3)}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _clients(
    spec: Spec,
    point: Point,
    target: Target,
    backend: ServedBackend,
    workdir: Path,
    stem: str,
    n: int,
    cores: cond.Cores | None,
    client_cores: tuple[int, ...] | None = None,
) -> list[mc.Client]:
    """The point's ``n`` load generators (``runners.multiclient``): each one's flags for
    its share, its files and its core (among ``client_cores`` where the server has cores
    of its own, ``runners.placement.split_cores``; else among every owned core)."""
    owned = client_cores or (cores or cond.own_cores()).ids
    placed, how = mc.placement(owned, n)
    out = []
    for i, (own_spec, own_point) in enumerate(mc.split(spec, point, n)):
        result = workdir / f"{stem}.c{i}.json"
        flags = bench_flags(own_spec, own_point, target.base_url, result, backend)
        argv = [sys.executable, "-m", "runners.bench_client"]
        argv += [flag] if (flag := adapter_flag(backend)) else []
        client = mc.Client(
            index=i,
            argv=[*argv, *flags],
            result=result,
            report=workdir / f"{stem}.c{i}.fields.json",
            log=workdir / f"{stem}.c{i}.client.log",
            cores=placed[i],
            placement=how,
        )
        out.append(client)
    return out


def _key_env(target: Target, backend: ServedBackend) -> str | None:
    """Where a client Pod finds the endpoint's key: the variable the portal fills from
    the key's Secret in every Pod of the run (None without a key)."""
    if isinstance(target, Endpoint) and target.key and isinstance(backend, EndpointBackend):
        return backend.key_env()
    return None


def _unavailable(target: Target) -> str | None:
    """Why an endpoint's point cannot run at all (no key, no answer), or None."""
    if not isinstance(target, Endpoint):
        return None
    if target.key_missing:
        return missing_key_reason(target.backend)
    if not target.alive:
        return target.unreachable_reason()
    return None


def measure_point(
    target: Target,
    spec: Spec,
    backend: ServedBackend,
    point: Point,
    repeat: int,
    workdir: Path,
    cores: cond.Cores | None = None,
    client_cores: tuple[int, ...] | None = None,
) -> Measurement:
    """Run the bench client for one point against ``target`` (a vLLM server the runner
    started, or an endpoint); never raises for a bad point. ``client_cores``: the
    load generators' cores when the server has cores of its own.

    KeyboardInterrupt (Ctrl-C, SIGTERM via the CLI's handler) propagates after the
    client's process group is stopped.
    """
    started_at, t0 = utcnow(), time.monotonic()
    is_endpoint = isinstance(backend, EndpointBackend)
    stem = f"{backend.name}-{point.key.replace(':', '-').replace('=', '')}-r{repeat}"
    result_path = workdir / f"{stem}.json"
    log_path = workdir / f"{stem}.client.log"
    report_path = workdir / f"{stem}.fields.json"
    result_path.unlink(missing_ok=True)
    report_path.unlink(missing_ok=True)
    traffic = traffic_driven(spec)
    if traffic:
        spec_path = workdir / f"{stem}.spec.json"
        spec_path.write_text(spec.model_dump_json())
        flags = traffic_flags(spec, target.base_url, result_path, spec_path, backend)
        bench = shlex.join(["python", "-m", "runners.traffic", *flags])
    else:
        flags = bench_flags(spec, point, target.base_url, result_path, backend)
        bench = bench_command(flags, backend)
    n = 1 if traffic else mc.clients_for(spec, point)
    group = (
        _clients(spec, point, target, backend, workdir, stem, n, cores, client_cores)
        if n > 1
        else []
    )
    evidence: list[dict[str, Any]] = []  # each client's saturation (runners.clientmerge)
    pods: clientpods.PodClients | None = None
    if group:
        results = [c.result for c in group]
        bench = bench_script(spec, point, target.base_url, results, backend)
    commands = {"bench": bench}
    if not is_endpoint:
        commands = {"serve": target.command(), **commands}
    fields: dict[str, Any] = {"commands": commands}
    samples_file: Path | None = None  # a large merge's full samples (runners.spilled)
    # vLLM's CPU build binds its OpenMP threads by this (GPU builds ignore it).
    extra = {"vllm_cpu_omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")}
    error = _unavailable(target)
    try:
        if error is not None:
            raise _Skip
        if isinstance(backend, VLLMBackend) and backend.enable_prefix_caching:
            assert isinstance(target, VLLMServer)
            target.reset_prefix_cache()
        # An endpoint's GPUs are not this machine's: NVML here would measure the wrong ones.
        gpu = nvml.Sampler(off=ENDPOINT_GPUS if is_endpoint else None)
        with PointWatcher(target.base_url, gpu=gpu) as watcher:
            argv = [sys.executable, "-m", "runners.bench_client"]
            argv += [flag] if (flag := adapter_flag(backend)) else []
            if traffic:
                argv = [sys.executable, "-m", "runners.traffic"]
            with cond.Watch(cores or cond.own_cores(), extra=extra) as watch:
                env = _client_env(target, backend, report_path)
                if group:
                    slo = spec.slo.model_dump(exclude_none=True) if spec.slo else None
                    slo = {k.removesuffix("_ms"): v for k, v in (slo or {}).items()}
                    pods = clientpods.launcher(_key_env(target, backend))
                    if pods is not None:  # on Kubernetes: each client in a Pod of its own
                        code, bad_log, evidence = clientpods.measure(
                            pods, group, backend.name, result_path, report_path, slo,
                            point.request_rate,
                        )  # fmt: skip
                    else:
                        barrier = workdir / f"{stem}.barrier"
                        code, bad_log, evidence = mc.measure(
                            group, env, barrier, result_path, report_path, slo,
                            point.request_rate,
                        )  # fmt: skip
                    log_path = bad_log or log_path
                else:
                    code = procs.run([*argv, *flags], log_path, env=env)
        fields["conditions"] = watch.result()
        fields["server_metrics"] = watcher.result()
        speculation = {
            k: getattr(fields["server_metrics"], k)
            for k in ("spec_decode_acceptance_rate", "spec_decode_mean_accepted_length")
            if getattr(fields["server_metrics"], k) is not None
        }
        # NVML sees this machine's GPUs: an endpoint's memory is not among them.
        fields["gpu_memory_peak_bytes"] = None if is_endpoint else watcher.gpu_peak
        if not is_endpoint and not target.alive:
            assert not isinstance(target, Endpoint)
            error = f"{target.LABEL} {target.ended()} during this point. " + procs.log_section(
                target.log_path, target.log_tail()
            )
        elif code != 0 or not result_path.exists():
            client = "servebench's traffic client" if traffic else "vLLM's bench client"
            error = f"{client} exited with code {code} without a result. " + procs.log_section(
                log_path, procs.tail(log_path)
            )
        else:
            data = json.loads(result_path.read_text())
            metrics, fields["raw"], fields["detail"] = split_result(data)
            if "samples_full" in data:  # the reading sample of a merge too large to hold
                fields["samples_full"] = FullSamples.model_validate(data["samples_full"])
                samples_file = Path(data["samples_file"])
            adapted = json.loads(report_path.read_text()) if report_path.exists() else {}
            fields["raw"]["servebench"] = request_facts(
                spec, backend, point, fields["detail"], adapted
            )
            facts = fields["raw"]["servebench"]
            if traffic and (note := traffic_note(fields["raw"])):
                facts["note"] = f"{facts['note']}; {note}" if facts.get("note") else note
            error = client_failure(data) or length_failure(backend, facts)
            if error is None:
                fields["metrics"] = metrics | speculation  # judged like any metric
                checked = (fields["raw"].get("traffic") or {}).get("correctness") or {}
                fields["metrics"] |= checked.get("metrics") or {}
            elif target.alive and (why := probe(target, spec, point, backend)):
                error = f"{why}\n{error}"  # the server's own words first: the cause
        # What the hardware did while the requests ran, and what sampling it cost.
        # A reading sample's own window is narrower than its requests': the merge's is exact.
        bounds = (fields.get("raw") or {}).get("window") if samples_file is not None else None
        fields["telemetry"] = watcher.telemetry(fields.get("detail") or {}, bounds)
        tm.sampler_share(fields["telemetry"], fields["conditions"].get("process_cpu_s"))
        if group:
            if pods is None:  # a client in a Pod samples its CPU on its own node's clock
                busiest = [client_cpu(c.report, fields["telemetry"]) for c in group]
                most = max(busiest, key=lambda c: c.get("client_cpu_per_wall", 0))
                fields["conditions"] |= most
            fields["conditions"] |= {
                "clients": evidence,
                "client_placement": group[0].placement,
                "client_skew": (fields.get("raw") or {}).get("skew") or {},
            }
        else:
            fields["conditions"] |= client_cpu(report_path, fields["telemetry"])
            if not traffic and "detail" in fields:
                report = _read_json(report_path)
                fields["conditions"]["clients"] = [
                    clientmerge.evidence(0, fields["detail"], report, point.request_rate)
                ]
        # This machine's GPU power is not an endpoint's: no energy or cost for it.
        if "metrics" in fields and not is_endpoint:
            price = spec.resources.gpu_hour_price
            fields["metrics"] |= tm.derive(fields["telemetry"], metrics, price_per_gpu_hour=price)
    except _Skip:
        pass
    except Exception as exc:  # a broken point must not end the sweep
        error = f"{type(exc).__name__}: {exc}"
    if error:  # the first real cause first, from the whole log it points at
        error = causes.explain(error)
    measured = Measurement(
        backend=backend.name,
        backend_kind=backend.kind,
        point=point_info(point),
        repeat=repeat,
        status="failed" if error else "succeeded",
        error=error,
        started_at=started_at,
        finished_at=utcnow(),
        duration_s=round(time.monotonic() - t0, 3),
        **fields,
    )
    if samples_file is not None:
        measured.keep_samples_file(samples_file)  # the full arrays, for runners.report
    return measured

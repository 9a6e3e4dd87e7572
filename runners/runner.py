"""Orchestrates one run: environment -> HF baseline -> vLLM servers and points -> end.

Order matters for trust:

1. the environment is captured before any model is loaded;
2. the HF baseline runs in a child process that exits before any vLLM server starts,
   so the two never share the GPU;
3. one vLLM server per distinct server configuration, started once, all of its points
   (and repeats, then its SLA search) measured against it, then stopped, always,
   whatever happens; a child on cores apart from the bench client's where the runner
   owns enough (``runners.placement.split_cores``), or on Kubernetes, where the portal
   asks for it, in a Pod of its own (``runners.kube``).
   A configuration search's configurations are such servers, in the spec's order (the
   order its early dropping reads, ``runners.sla.gates``); each starts only while the
   search's budget lasts (``runners.configsearch``);
3b. endpoints (deployed servers) last, nothing of the runner's own still running: their
   points, then their SLA search;
4. every measurement is written to ``--out`` and posted to the portal the moment it
   exists, so a crash later loses nothing already measured.

Exit codes (``ExitCode``): 0 all measurements succeeded, 1 some or all failed (or the
portal cancelled the run), 130 interrupted by SIGINT/SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from enum import IntEnum
from pathlib import Path
from typing import Any

from runners import __version__, causes, clientpods, clientprobe, kube, nvml, placement, procs, sla
from runners import conditions as cond
from runners import configsearch as cs
from runners import endpoint as ep
from runners import hf_config as hfc
from runners import telemetry as tm
from runners.document import DocumentWriter
from runners.environment import capture
from runners.fingerprint import fingerprint
from runners.multiclient import with_clients
from runners.progress import Progress
from runners.report import NoReporter, Reporter, ReportError, ReportRejected, RunCancelled
from runners.result import Event, Measurement, PointInfo, ResultDocument, utcnow
from runners.spec import (
    EndpointBackend,
    HFBackend,
    HFBatchedBackend,
    Point,
    ServedBackend,
    Spec,
    TransformersServeBackend,
    VLLMBackend,
    hf_point,
    search_point,
)
from runners.transformers_server import TransformersServer
from runners.vllm_bench import Target, measure_point, point_info
from runners.vllm_server import LocalServer, ServerError


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    INTERRUPTED = 130


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGHUP), turned into an exception so the same cleanup as Ctrl-C runs."""

    def __init__(self, signame: str = "SIGTERM") -> None:
        super().__init__(signame)
        self.signame = signame


def server_groups(spec: Spec) -> list[list[VLLMBackend]]:
    """vLLM backends grouped by server configuration, in spec order (one server each)."""
    groups: dict[str, list[VLLMBackend]] = {}
    for backend in spec.vllm_backends:
        key = json.dumps(backend.server_key(), sort_keys=True, default=str)
        groups.setdefault(key, []).append(backend)
    return list(groups.values())


class Runner:
    """Runs a spec; ``run()`` returns the exit code. One instance per run."""

    def __init__(
        self,
        spec: Spec,
        *,
        workdir: Path,
        out: Path | None = None,
        reporter: Reporter | NoReporter | None = None,
        progress: Progress | None = None,
        cores: cond.Cores | None = None,
        api_keys: dict[str, str] | None = None,
    ) -> None:
        self.spec = spec
        # Endpoint API keys by backend name, out of the environment children inherit.
        self.api_keys = ep.take_keys(spec) if api_keys is None else api_keys
        # The cores this run owns (the CLI pinned the process to them; children inherit).
        self.cores = cores or cond.own_cores()
        # Which of them the servers get and which the load generator (runners.placement);
        # decided again with the GPU count once the environment is known.
        self.split = placement.split_for(self.cores.ids)
        self.workdir = workdir
        self.reporter = reporter or NoReporter()
        self.progress = progress or Progress(quiet=True)
        self.writer = DocumentWriter(out)
        self.total = spec.total_measurements()
        self.unstored: list[str] = []  # measurements the portal refused to store
        self._configs_t0: float | None = None  # when the first configuration began
        self._clients: dict[str, int] = {}  # workload.clients: auto, as probed per backend
        self._t0 = time.monotonic()
        self.document = ResultDocument(
            runner_version=__version__,
            status="running",
            spec=spec.model_dump(mode="json"),
            timings={"started_at": utcnow()},
        )

    # ------------------------------------------------------------------ bookkeeping

    def _record(self, m: Measurement) -> None:
        self.document.measurements.append(m)
        if self.spec.sla_search is not None:
            self.document.sla_searches = sla.summarize(self.spec, self.document.measurements)
        self._config_outcomes(ended=False)
        self.writer.write(self.document)
        done = len(self.document.measurements)
        self.progress.measurement(done, self.total, m)
        if not self._report(lambda: self.reporter.measurement(m)):
            # Kept in --out, but the portal does not have it: the run cannot succeed.
            self.unstored.append(f"{m.backend} {m.point.key} r{m.repeat}")
        line = f"{m.backend} {m.point.key} r{m.repeat}: {m.status}"
        self._report(
            lambda: self.reporter.event(
                Event(type="progress", done=done, total=self.total, message=line)
            )
        )

    def _report(self, call: Callable[[], object]) -> bool:
        """Post to the portal; a final refusal is noted (False) and the run goes on."""
        try:
            call()
        except ReportRejected as exc:
            self._error("report", str(exc))
            return False
        return True

    def _error(self, where: str, message: str) -> None:
        self.document.errors.append({"where": where, "message": message})
        self.progress.say(f"error ({where}): {message.splitlines()[0][:300]}")

    def _timing(self, key: str, value: Any) -> None:
        self.document.timings[key] = value

    def _failed(
        self, backend: str, point: PointInfo, repeat: int, error: str, kind: str
    ) -> Measurement:
        """A served point that never ran (its server did not start or had died)."""
        now = utcnow()
        return Measurement(
            backend=backend,
            backend_kind=kind,  # type: ignore[arg-type]
            point=point,
            repeat=repeat,
            status="failed",
            error=error,
            started_at=now,
            finished_at=now,
            duration_s=0.0,
        )

    # ------------------------------------------------------------------ phases

    def _environment(self) -> None:
        t = time.monotonic()
        env = capture(self.spec, self.api_keys)
        self.split = placement.split_for(self.cores.ids, gpus=env["gpu"]["count"])
        env["host"] |= self.split.describe()
        if kube.POD_ENV in os.environ:  # the servers in Pods of their own (runners.kube)
            env["host"] |= {
                "server_cores": "its own Pod",
                "client_cores": self.cores.text,
                "core_split": f"servers in Pods of their own; the client on {self.cores.text}",
            }
        self.document.environment = env
        self.document.fingerprint = fingerprint(self.spec, env)
        self._timing("environment_s", round(time.monotonic() - t, 3))
        self.writer.write(self.document)
        self._report(
            lambda: self.reporter.event(
                Event(type="environment", environment=env, fingerprint=self.document.fingerprint)
            )
        )
        gpu = env["gpu"]
        self.progress.say(
            f"environment: GPU {gpu['model']} x{gpu['count']}, vLLM {env['software']['vllm']}, "
            f"torch {env['software']['torch']}, model revision {env['model']['revision'][:19]}"
        )

    def _hf(
        self, backend: HFBackend | HFBatchedBackend, repeat: int, point: Point | None = None
    ) -> Measurement:
        """An HF baseline in a child process: hf-sequential (``runners.hf``), or
        hf-static-cache and hf-batched at ``point`` (``runners.hf_baselines``)."""
        config = hfc.for_backend(self.spec, backend, point)
        point = point or hf_point(self.spec, backend)  # type: ignore[arg-type]
        stem = f"{backend.name}-r{repeat}"  # names may contain '.': no with_suffix
        if backend.kind == "hf-batched":
            stem += "-" + re.sub(r"[^A-Za-z0-9_.=-]", "_", point.key)
        result_path = self.workdir / f"{stem}.json"
        log_path = self.workdir / f"{stem}.log"
        result_path.unlink(missing_ok=True)
        started_at, t = utcnow(), time.monotonic()
        # --cpus only when the runner was given it; else the child inherits the affinity.
        cpus = self.cores.text if self.cores.source == "--cpus" else None
        argv = hfc.child_argv(config, sys.executable, str(result_path), cpus)
        # GPU telemetry is sampled here, in the runner, never inside the measured child.
        with nvml.Sampler() as gpu:
            code = procs.run(argv, log_path, env=procs.python_env())
        fields: dict[str, Any] = {"commands": {"hf": config.command()}}
        data = json.loads(result_path.read_text()) if result_path.exists() else {}
        error = data.get("error")
        if code != 0 or "metrics" not in data:
            error = error or (
                f"the HF baseline exited with code {code}. "
                + procs.log_section(log_path, procs.tail(log_path))
            )
        else:
            fields |= {
                "metrics": data["metrics"],
                "detail": data["detail"],
                "raw": data["raw"],
                "gpu_memory_peak_bytes": data.get("gpu_memory_peak_bytes"),
                "conditions": data.get("conditions") or {},
            }
            # The child's start_times are on the same clock (perf_counter: CLOCK_MONOTONIC).
            fields["telemetry"] = tm.assemble(gpu, gpu.t0 or 0.0, data["detail"])
            tm.sampler_share(fields["telemetry"], fields["conditions"].get("process_cpu_s"))
            price = self.spec.resources.gpu_hour_price
            fields["metrics"] = {
                **data["metrics"],
                **tm.derive(fields["telemetry"], data["metrics"], price_per_gpu_hour=price),
            }
        return Measurement(
            backend=backend.name,
            backend_kind=backend.kind,
            point=point_info(point),
            repeat=repeat,
            status="failed" if error else "succeeded",
            error=error,
            started_at=started_at,
            finished_at=utcnow(),
            duration_s=round(time.monotonic() - t, 3),
            **fields,
        )

    def _vllm_group(self, backends: list[VLLMBackend]) -> None:
        """One vLLM server for these backends (``server_groups``)."""
        first = backends[0]
        log = self.workdir / f"server-{first.name}.log"
        # On Kubernetes, where the portal asks for it: in a Pod of its own (runners.kube).
        self._served(kube.server_for(self.spec, first, log), backends)

    def _transformers(self, backend: TransformersServeBackend) -> None:
        """``transformers serve`` for this backend, started and stopped like vLLM's."""
        log = self.workdir / f"server-{backend.name}.log"
        self._served(TransformersServer(self.spec, backend, log, cores=self.cores), [backend])

    def _served(self, server: LocalServer, backends: list[Any]) -> None:
        """Start ``server``; every point and repeat of ``backends`` measured against it,
        then their SLA search; stop it."""
        points: list[Point] = self.spec.points()
        first = backends[0]
        self.progress.say(
            f"starting {server.LABEL} for {', '.join(b.name for b in backends)} "
            f"(timeout {first.startup_timeout_s} s, log {server.log_path})"
        )
        if isinstance(server, kube.PodServer):
            self.progress.say(f"in Pod {server.name} (the client stays in this Pod)")
        else:
            server.cpus = None if self.split.shared else self.split.server
            self.progress.say(f"cores: {self.split.summary()}")
        try:
            server.start()
        except ServerError as exc:
            self._error(f"server {first.name}", str(exc))
            for repeat in range(self.spec.repeats):
                for backend in backends:
                    for point in points:
                        self._record(
                            self._failed(
                                backend.name, point_info(point), repeat, str(exc), backend.kind
                            )
                        )
            for backend in self._searched(backends):
                self._search_failed(backend, str(exc))
            return
        try:
            self._timing(f"server_startup_s.{first.name}", round(server.startup_s or 0, 1))
            self.progress.say(
                f"server ready in {server.startup_s:.0f} s (pid {server.pid}, {server.base_url})"
            )
            if isinstance(server, kube.PodServer):  # where it ran, in the environment too
                pods = self.document.environment.setdefault("kubernetes", {})
                pods.setdefault("server_pods", []).append(server.placement())
                self.writer.write(self.document)
            # The runner's thread, and so the bench client it starts, on the client's cores.
            client = None if self.split.shared or server.cpus is None else self.split.client
            with cond.pinned(client):
                self._served_points(server, backends, points)
        finally:
            server.stop()
            self.progress.say(f"server stopped (pid {server.pid})")

    def _served_points(self, server: LocalServer, backends: list[Any], points: list[Point]) -> None:
        """Every point and repeat of ``backends`` against ``server``, then their SLA search."""
        for backend in backends:
            if server.alive:
                self._probe_clients(server, backend, self._client_cores(server))
        for repeat in range(self.spec.repeats):
            for backend in backends:
                for point in points:
                    if server.alive:
                        m = self._measure(
                            server, backend, point, repeat, self._client_cores(server)
                        )
                    else:
                        reason = (
                            f"{server.LABEL} {server.ended()} before this point. "
                            + procs.log_section(server.log_path, server.log_tail())
                        )
                        m = self._failed(
                            backend.name, point_info(point), repeat, reason, backend.kind
                        )
                    self._record(self._placed(m, server))
        for backend in self._searched(backends):
            self._search(server, backend)

    def _measure(
        self,
        target: Target,
        backend: Any,
        point: Point,
        repeat: int,
        client_cores: tuple[int, ...] | None = None,
    ) -> Measurement:
        """One point of a served backend or endpoint, with the spec its clients need."""
        return measure_point(
            target,
            self._spec_for(backend),
            backend,
            point,
            repeat,
            self.workdir,
            cores=self.cores,
            client_cores=client_cores,
        )

    def _spec_for(self, backend: Any) -> Spec:
        """The spec a backend's points are measured with: ``workload.clients: auto``
        replaced by the count its probe chose (``runners.clientprobe``)."""
        if self.spec.workload.clients != "auto":
            return self.spec
        return with_clients(self.spec, self._clients.get(backend.name, 1))

    def _probe_clients(
        self, target: Target, backend: Any, client_cores: tuple[int, ...] | None
    ) -> None:
        """With ``workload.clients: auto``: probe how many load generators ``backend``
        needs at its heaviest point; the count, what each try achieved and why, in the
        run's environment (``load_generators``, sent again) and the progress."""
        if self.spec.workload.clients != "auto" or backend.name in self._clients:
            return
        point = clientprobe.probe_point(clientprobe.heaviest(self.spec))
        cores = len(client_cores) if client_cores else len(self.cores.ids)
        if clientpods.available():  # each client in a Pod of its own: not our cores
            cores = clientprobe.MAX_AUTO
        cap = clientprobe.limit(point, cores)
        workdir = self.workdir / "clients-probe"
        workdir.mkdir(parents=True, exist_ok=True)
        self.progress.say(
            f"load generators for {backend.name}: probing 1 to {cap} clients at {point.key} "
            f"({point.num_prompts} prompts each)"
        )

        def measure(n: int) -> Measurement:
            spec = with_clients(self.spec, n)
            m = measure_point(
                target,
                spec,
                backend,
                point,
                n,
                workdir,
                cores=self.cores,
                client_cores=client_cores,
            )
            rate = (m.metrics or {}).get("request_throughput")
            said = f"{rate:.4g} req/s" if m.status == "succeeded" and rate else "failed"
            self.progress.say(f"load generators for {backend.name}: {n} -> {said}")
            return m

        probe = clientprobe.run(backend.name, point, cap, measure)
        self._clients[backend.name] = probe.chosen
        self.progress.say(f"load generators for {backend.name}: {probe.why}")
        found = self.document.environment.setdefault(
            "load_generators", {"clients": "auto", "backends": {}}
        )
        found["backends"][backend.name] = probe.as_dict()
        self.writer.write(self.document)
        env, fp = self.document.environment, self.document.fingerprint
        self._report(
            lambda: self.reporter.event(Event(type="environment", environment=env, fingerprint=fp))
        )

    def _client_cores(self, server: LocalServer) -> tuple[int, ...] | None:
        """The load generators' cores when this server has cores of its own."""
        if isinstance(server, kube.PodServer) or self.split.shared or server.cpus is None:
            return None
        return tuple(self.split.client)

    def _placed(self, m: Measurement, target: Target) -> Measurement:
        """A served point's conditions with the core split, and the affinities read from
        the server's process and this thread (the client's: what they really ran on)."""
        if isinstance(target, kube.PodServer) and m.conditions:
            m.conditions |= target.placement()
        elif isinstance(target, LocalServer) and m.conditions:
            m.conditions |= {
                **self.split.describe(),
                "server_affinity": target.affinity,
                "client_affinity": cond.process_affinity(0),
            }
        return m

    def _endpoint(self, backend: EndpointBackend) -> None:
        """A deployed server: no start, no stop; its points, then its SLA search."""
        target = ep.Endpoint(
            self.spec,
            backend,
            self.api_keys.get(backend.name),
            self.workdir / f"endpoint-{backend.name}.log",
        )
        self.progress.say(f"endpoint {backend.name}: {backend.base_url} ({backend.api})")
        self._probe_clients(target, backend, None)
        for repeat in range(self.spec.repeats):
            for point in self.spec.points():
                self._record(self._measure(target, backend, point, repeat))
        if backend in self._searched([backend]):
            self._search(target, backend)

    def _config_outcomes(self, ended: bool) -> None:
        if self.spec.config_search is not None:
            self.document.config_search = cs.outcomes(
                self.spec,
                self.document.measurements,
                self.document.sla_searches,
                cs.skipped_of(self.document.timings),
                ended=ended,
            )

    def _config_may_start(self, backends: list[VLLMBackend]) -> bool:
        """A configuration search's next configuration starts while its budget lasts
        (``runners.configsearch``); one not started lowers the run's total."""
        if self._configs_t0 is None:
            self._configs_t0 = time.monotonic()
        elapsed = time.monotonic() - self._configs_t0
        why = cs.budget_reason(self.spec, self.document.measurements, elapsed)
        if why is None:
            return True
        section = self.document.timings.setdefault(cs.TIMINGS_KEY, {})
        for backend in backends:
            section.setdefault(cs.NOT_MEASURED, {})[backend.name] = f"not measured: {why}"
            self.total -= cs.planned_measurements(self.spec, backend.name)
            self.progress.say(f"configuration {backend.name} not measured: {why}")
        self._config_outcomes(ended=False)
        self.writer.write(self.document)
        return False

    # ------------------------------------------------------------------ SLA search

    def _searched(self, backends: list[Any]) -> list[ServedBackend]:
        names = {b.name for b in self.spec.search_backends}
        return [b for b in backends if b.name in names]

    def _search(self, target: Target, backend: ServedBackend) -> None:
        """Measure the SLA search's points on ``backend`` until it is over
        (``runners.sla``); a search that ends early lowers the run's total."""
        search = self.spec.sla_search
        assert search is not None
        kind = backend.kind
        steps: list[sla.Step] = []
        # A later configuration of a configuration search starts at the leader's answer.
        gate = sla.gates(self.spec, self.document.measurements).get(backend.name)
        if gate is not None:
            self.progress.say(
                f"SLA search on {backend.name}: first at {gate.value:g}, the answer of "
                f"the leader {gate.leader} (a miss there drops it)"
            )
        while (value := sla.next_value(search, steps, gate)) is not None:
            point = search_point(self.spec, value)
            repeat = sla.next_repeat(steps, value)  # 1: measured again after a miss
            if repeat:
                self.progress.say(f"SLA search on {backend.name}: {point.key} again")
            if isinstance(target, ep.Endpoint) or target.alive:
                m = self._measure(target, backend, point, repeat)
            else:
                assert isinstance(target, LocalServer)
                reason = f"{target.LABEL} {target.ended()} before this point. " + procs.log_section(
                    target.log_path, target.log_tail()
                )
                m = self._failed(backend.name, point_info(point), repeat, reason, kind)
            m = self._placed(m, target)
            # A point that failed because its server (or a deployed endpoint) is gone says
            # nothing about the load: bisecting on would "converge" on failures alone.
            gone = m.status == "failed" and not target.alive
            if gone and isinstance(target, ep.Endpoint):
                m = m.model_copy(
                    update={"error": f"{m.error or ''}\nthen {target.unreachable_reason()}"}
                )
            self._record(m)
            steps = sla.steps_of(self.spec, backend.name, self.document.measurements)
            if gone:
                self.progress.say(f"SLA search on {backend.name}: its server no longer answers")
                break
        if value is None:
            self.total -= search.max_points - len(steps)
        outcome = sla.result(self.spec, backend.name, steps, ended=value is not None, gate=gate)
        self.progress.say(
            f"SLA search on {backend.name}: {outcome['text']} "
            f"({outcome['points_used']} of {search.max_points} points)"
        )

    def _search_failed(self, backend: ServedBackend, error: str) -> None:
        """The search's first point, failed: its server never started."""
        search = self.spec.sla_search
        assert search is not None
        gate = sla.gates(self.spec, self.document.measurements).get(backend.name)
        first = gate.value if gate else sla.round_value(search, search.low)
        point = search_point(self.spec, first)
        self._record(self._failed(backend.name, point_info(point), 0, error, backend.kind))
        self.total -= search.max_points - 1

    # ------------------------------------------------------------------ the run

    def _measure_all(self) -> None:
        for backend in self.spec.hf_backends:
            for repeat in range(self.spec.repeats):
                self.progress.say(f"HF baseline {backend.name} r{repeat} (log in {self.workdir})")
                self._record(self._hf(backend, repeat))
        for batched in self.spec.batched_backends:
            for repeat in range(self.spec.repeats):
                for point in self.spec.points():
                    self.progress.say(f"HF baseline {batched.name} {point.key} r{repeat}")
                    self._record(self._hf(batched, repeat, point))
        configs = set(self.spec.config_names)
        for backends in server_groups(self.spec):
            if {b.name for b in backends} & configs and not self._config_may_start(backends):
                continue
            self._vllm_group(backends)
        for served in self.spec.transformers_backends:
            self._transformers(served)
        for backend in self.spec.endpoint_backends:
            self._endpoint(backend)

    def _finish(
        self,
        status: str,
        message: str | None = None,
        *,
        send: bool = True,
        report_budget_s: float | None = None,
    ) -> None:
        self.document.status = status  # type: ignore[assignment]
        if self.spec.sla_search is not None:  # a search left unfinished now never will be
            self.document.sla_searches = sla.summarize(
                self.spec, self.document.measurements, ended=True
            )
        self._config_outcomes(ended=True)
        self._timing("finished_at", utcnow())
        self._timing("duration_s", round(time.monotonic() - self._t0, 3))
        self.writer.write(self.document)
        if not send:
            return
        timings, errors = self.document.timings, self.document.errors
        if status == "failed":
            event = Event(type="failed", message=message, errors=errors, timings=timings)
        else:
            event = Event(type="finished", status=status, errors=errors, timings=timings)  # type: ignore[arg-type]
        try:
            self.reporter.event(event, max_elapsed_s=report_budget_s)
        except (ReportError, ReportRejected, RunCancelled) as exc:
            self.progress.say(f"could not send the final report: {exc}")

    def run(self) -> ExitCode:
        self.oom_kills_at_start = procs.oom_kills()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.writer.write(self.document)
        try:
            self._report(lambda: self.reporter.event(Event(type="started", total=self.total)))
            self._environment()
            self._measure_all()
        except KeyboardInterrupt as exc:
            what = exc.signame if isinstance(exc, Interrupted) else "SIGINT (Ctrl-C)"
            message = f"interrupted by {what}; finished measurements are kept"
            self._error("runner", message)
            # A runner being stopped has seconds, not minutes: keep the last report short.
            self._finish("failed", message, report_budget_s=10.0)
            return ExitCode.INTERRUPTED
        except RunCancelled as exc:
            self._error("runner", f"the portal cancelled the run: {exc}")
            self._finish("failed", send=False)
            return ExitCode.FAILED
        except ReportError as exc:
            message = f"stopped: the portal was unreachable ({exc})"
            self._error("report", message)
            self._finish("failed", message, send=False)
            return ExitCode.FAILED
        except Exception as exc:
            self._error("runner", "".join(traceback.format_exception(exc))[-4000:])
            self._finish("failed", f"runner error: {type(exc).__name__}: {exc}")
            return ExitCode.FAILED
        if self.unstored:
            refusal = next(e["message"] for e in self.document.errors if e["where"] == "report")
            self._finish(
                "failed",
                f"the portal could not store {len(self.unstored)} measurement(s) "
                f"({', '.join(self.unstored[:3])}{', ...' if len(self.unstored) > 3 else ''}): "
                f"{refusal}. They are in the runner's result file.",
            )
            return ExitCode.FAILED
        ok = [m for m in self.document.measurements if m.status == "succeeded"]
        if len(ok) == len(self.document.measurements) == self.total:
            self._finish("succeeded")
            return ExitCode.OK
        if ok:
            self._finish("partial")
            return ExitCode.FAILED
        # The first real cause and the next step on the first line (runners.causes), not
        # "see the errors": the portal shows that line at the top of the run's page.
        failures = [
            (f"{m.backend} {m.point.key}" + (f" (repeat {m.repeat})" if m.repeat else ""), m.error)
            for m in self.document.measurements
        ]
        reason = causes.headline(failures, self.total, model=self.spec.model.id, logs=True)
        oom = procs.oom_cause(self.oom_kills_at_start)
        # A child the OOM killer ended: "exited with code -9" (the HF baseline) or "was
        # killed by signal SIGKILL (9)" (a server, procs.exit_text).
        killed = ("code -9", "signal SIGKILL")
        if oom and any(k in (m.error or "") for m in self.document.measurements for k in killed):
            reason = f"{oom}\n{reason}"
        self._finish("failed", reason)
        return ExitCode.FAILED

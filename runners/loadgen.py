"""Inside one bench client process: a synchronized start and its own saturation evidence.

``runners.bench_client`` calls ``install(report)`` before vLLM's client runs. It wraps the
last thing vLLM's ``benchmark()`` awaits before it starts its clock and sends the first
timed request (``vllm.benchmarks.serve.fetch_diffusion_metrics``, called once before and
once after the timed requests), so the hook runs after the tokenizer, the dataset, the
test request and the warm-ups, and right before the first send:

- **Start barrier** (``BARRIER_ENV`` names a directory, ``INDEX_ENV`` this client's index,
  set by ``runners.multiclient`` when a point has several clients): the client writes
  ``ready-<index>`` there, waits for ``go`` (JSON ``{"start_at": epoch seconds}``, which the
  parent writes once every client is ready) and sleeps until that wall-clock time. A
  client in a Pod of its own (``runners.clientpods``) has no directory in common with the
  runner: there ``BARRIER_ENV`` is the runner's rendezvous URL, the client POSTs
  ``<url>/ready/<index>`` and polls ``GET <url>/go`` (204 until every client is ready, then
  the same JSON). It
  records when it was ready, when it was released (``time.time`` and
  ``time.perf_counter``, the clock of its ``start_times``: the pair converts them to wall
  time) and how late against ``start_at`` it was released. A parent that never says go
  (``BARRIER_TIMEOUT_S``) ends the client with the reason.
- **Event-loop lag**: from the release to the last completion (the wrapped coroutine's
  second call), a task sleeps ``LAG_TICK_S`` at a time
  and records how late each wake-up was. vLLM's client sends each request from that one
  event loop at the time its schedule says (the request rate's arrival times) or when a
  slot frees (concurrency): a late wake-up is a late send, so the lag's p99 and max are
  the client's send lag against its schedule. A loop starved of CPU, or one busy parsing
  streams, shows here first.
- **Run-queue wait**: ``/proc/self/schedstat`` (the main thread, which runs the event
  loop) counts the time the thread was ready to run but waited for a core, sampled with
  the CPU time (``runners.bench_client.CpuSampler``). CPU per wall says how busy the
  client was; CPU plus wait per wall says how much CPU it wanted: a client given a
  fraction of a core is at ~1.0 of the latter while the former stays at its share.

Everything lands in the client's report file (``start``, ``loop_lag``, ``client_wait``)
for ``runners.clientmerge`` to read.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

BARRIER_ENV = "SERVEBENCH_BARRIER"
INDEX_ENV = "SERVEBENCH_CLIENT_INDEX"
BARRIER_TIMEOUT_S = 900.0
BARRIER_POLL_S = 0.005
HTTP_POLL_S = 0.02  # a GET to the runner per poll: a little slower than a file's stat
LAG_TICK_S = 0.01
_SCHEDSTAT = Path("/proc/self/schedstat")


def run_queue_wait_s() -> float | None:
    """Seconds the main thread has waited, ready to run, for a core (None off Linux)."""
    try:
        fields = _SCHEDSTAT.read_text().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class LoopLag:
    """How late each ``LAG_TICK_S`` wake-up of the event loop came (a task)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(LAG_TICK_S)
            self.lags.append(max(time.perf_counter() - before - LAG_TICK_S, 0.0))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def summary(self) -> dict[str, float | int]:
        self.stop()
        if not self.lags:
            return {}
        ordered = sorted(self.lags)

        def q(p: float) -> float:
            return round(ordered[min(int(p * len(ordered)), len(ordered) - 1)] * 1000, 3)

        return {"ticks": len(ordered), "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": q(1.0)}


class StartHook:
    """The barrier (when ``BARRIER_ENV`` is set) and the lag monitor, on the first call of
    the wrapped coroutine; ``facts()`` for the report."""

    def __init__(self, barrier: str | None, index: int) -> None:
        self.url = barrier.rstrip("/") if barrier and barrier.startswith("http") else None
        self.barrier = Path(barrier) if barrier and self.url is None else None
        self.index = index
        self.lag = LoopLag()
        self.start: dict[str, Any] = {"index": index}
        self.started = False

    def _never_released(self) -> RuntimeError:
        return RuntimeError(
            f"client {self.index} waited {BARRIER_TIMEOUT_S:.0f} s at the start "
            "barrier and the runner never released it"
        )

    def _ask(self, method: str, path: str) -> tuple[int, bytes]:
        assert self.url is not None
        data = str(time.time()).encode() if method == "POST" else None
        url = f"{self.url}/{path}"  # the runner's http:// rendezvous, never another scheme
        request = urllib.request.Request(url, data=data, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
                return answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""
        except OSError:
            return 0, b""  # the runner busy or the network blinking: asked again

    async def _wait_for_go_http(self) -> float:
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        while (await asyncio.to_thread(self._ask, "POST", f"ready/{self.index}"))[0] != 200:
            if time.monotonic() > deadline:
                raise self._never_released()
            await asyncio.sleep(HTTP_POLL_S)
        while True:
            status, body = await asyncio.to_thread(self._ask, "GET", "go")
            if status == 200:
                return float(json.loads(body)["start_at"])
            if time.monotonic() > deadline:
                raise self._never_released()
            await asyncio.sleep(HTTP_POLL_S)

    async def _wait_for_go(self) -> float:
        if self.url is not None:
            return await self._wait_for_go_http()
        assert self.barrier is not None
        (self.barrier / f"ready-{self.index}").write_text(str(time.time()))
        go = self.barrier / "go"
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        while not go.exists():
            if time.monotonic() > deadline:
                raise self._never_released()
            await asyncio.sleep(BARRIER_POLL_S)
        return float(json.loads(go.read_text())["start_at"])

    async def before_first_send(self) -> None:
        self.started = True
        self.start["ready_at"] = time.time()
        if self.barrier is not None or self.url is not None:
            start_at = await self._wait_for_go()
            # Coarse sleep, then a short spin: a release within a millisecond of start_at.
            while (left := start_at - time.time()) > 0.002:
                await asyncio.sleep(left - 0.002)
            while time.time() < start_at:
                pass
            self.start["start_at"] = start_at
        wall, perf = time.time(), time.perf_counter()
        self.start |= {"released_at": wall, "released_perf": perf}
        if "start_at" in self.start:
            self.start["late_ms"] = round((wall - self.start["start_at"]) * 1000, 3)
        self.lag.start()

    def facts(self) -> dict[str, Any]:
        return {"start": self.start, "loop_lag": self.lag.summary()}


def install() -> StartHook:
    """Wrap vLLM's last await before its timed requests (module docstring); refuse a vLLM
    whose client is built otherwise rather than start unsynchronized."""
    from vllm.benchmarks import serve

    original = getattr(serve, "fetch_diffusion_metrics", None)
    if original is None:
        raise RuntimeError(
            "this vLLM's bench client has no serve.fetch_diffusion_metrics; the start "
            "barrier of runners.loadgen needs updating for it"
        )
    hook = StartHook(os.environ.get(BARRIER_ENV), int(os.environ.get(INDEX_ENV, "0")))

    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        if hook.started:  # the second call: every timed request has completed
            hook.lag.stop()  # the metrics vLLM computes next block the loop: not a send
            return await original(*args, **kwargs)
        result = await original(*args, **kwargs)
        await hook.before_first_send()
        return result

    serve.fetch_diffusion_metrics = wrapped
    return hook

"""The cores a benchmark owns, and the conditions each measurement was taken under.

A CPU-side number is only as good as the CPU it ran on. On a machine shared with anything
else (the portal itself, another run, a compiler) the HF baseline's OpenMP threads wait
on each other whenever one of them is descheduled, and a 2-core box measured 20 output
tok/s instead of 400 without any sign of it. So:

**Ownership.** ``own_cores()`` decides which cores the runner owns: ``--cpus LIST`` or
``SERVEBENCH_CPUS`` (e.g. ``2-7``) when given (they must be among the cores this process
may run on), else every core in its affinity mask (``sched_getaffinity``: on Kubernetes
with the static CPU manager that is the Pod's exclusive cpuset). Threads follow the
cores: one per owned core, fewer when a cgroup CPU quota (``cpu.max``) allows fewer; to
use fewer threads, own fewer cores. ``pin()`` binds the process to those cores;
children inherit it, so the HF child and the vLLM server (whose CPU build binds its
OpenMP threads within the process's affinity) stay on them. ``thread_env()`` is the
environment that sizes OpenMP/MKL pools (``set_thread_env()`` sets it in a process that
has not imported torch yet, overriding inherited values).
When the runner owns enough cores, a server it starts and the load generator get disjoint
ones (``runners.placement.split_cores``): ``pinned()`` runs a block on a subset (the
calling thread's affinity, inherited by what it starts), ``process_affinity()`` reads
back what a process really got.

**Conditions.** ``Watch`` brackets one measurement (the HF timed loop, one vLLM bench
client run) with two snapshots of ``/proc`` and returns a plain dict (the
``conditions`` of ``runners.result.Measurement``):

- ``cores``, ``threads``, ``cpu_quota``: what it owned;
- ``wall_s``, ``process_cpu_s``, ``process_cpu_per_wall``: the CPU time of the
  measuring process and its descendants (reaped ones included) against wall time;
- ``others_cpu_s``, ``others_share``: CPU time *other* processes used on the owned cores
  (their busy time in ``/proc/stat`` minus ours: it counts processes that started and
  ended inside the window, and ones in other containers or PID namespaces), and the
  share of the owned cores' time that was; ``top_others``: the visible ones by name;
- ``steal_share``: time the hypervisor gave the owned cores to someone else;
- ``throttled_s``: time the cgroup's CPU quota held the container back;
- ``load_avg``: the host's 1/5/15-minute load average at the start and end (a lagging,
  host-wide number that includes our own threads: context, not a verdict);
- ``client_cpu_s``, ``client_cpu_per_wall`` (vLLM points, added by
  ``runners.vllm_bench.client_cpu``): the load generator's own CPU time over the requests'
  window (``window_cpu`` over its samples) and per second of that window: 1.0 is a core;
- ``contended`` and ``reasons``: plain sentences for each rule that fired: others took
  ``CONTENDED_SHARE`` of the cores its threads need (of all owned cores when it has a
  thread per core; beyond the spare ones when a CPU quota allows fewer threads than
  cores), steal took that share, the quota throttled it, or a CPU-bound process ran
  less than ``MIN_CPU_PER_WALL`` of the wall time.

No root, no extra packages: Linux ``/proc`` and ``/sys/fs/cgroup`` only. Where they do
not exist (not Linux) the dict says so and nothing is flagged.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners import procs

CPUS_ENV = "SERVEBENCH_CPUS"
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
CONTENDED_SHARE = 0.05  # of the owned cores' time, taken by others (or stolen)
MIN_OTHERS_CPU_S = 0.05  # below this, clock-tick rounding, not competition
MIN_CPU_PER_WALL = 0.8  # a CPU-bound process that ran less than this was kept waiting
_TOP_OTHERS = 3

_PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class CoreError(ValueError):
    """A requested core set that cannot be owned; the message names what to change."""


# --------------------------------------------------------------------------- ownership


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6] (the kernel's cpulist format); CoreError if malformed."""
    ids: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        ranged = "-" in part
        if not lo.isdigit() or (ranged and (not hi.isdigit() or int(hi) < int(lo))):
            raise CoreError(f"{text!r} is not a CPU list like '0-3,6'")
        ids.update(range(int(lo), int(hi or lo) + 1))
    if not ids:
        raise CoreError(f"{text!r} names no CPU")
    return sorted(ids)


def format_cpu_list(ids: list[int] | tuple[int, ...]) -> str:
    """[0, 1, 2, 3, 6] -> '0-3,6'."""
    out: list[str] = []
    ordered = sorted(set(ids))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cgroup_cpu_quota() -> float | None:
    """CPUs the cgroup's quota allows (v2 ``cpu.max``, v1 CFS quota); None if unlimited."""
    parts = (_read("/sys/fs/cgroup/cpu.max") or "").split()
    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() and int(parts[1]):
        return int(parts[0]) / int(parts[1])
    quota = _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
    period = _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
    if quota and period and quota.isdigit() and period.isdigit() and int(period):
        return int(quota) / int(period)
    return None


def cgroup_cpuset() -> str | None:
    """The cgroup's effective cpuset ('0-3'), v2 then v1; None when not readable."""
    return _read("/sys/fs/cgroup/cpuset.cpus.effective") or _read(
        "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"
    )


def _throttled_s() -> float | None:
    """Cumulative time the cgroup was throttled by its CPU quota (v2 usec, v1 ns)."""
    for path, key, scale in (
        ("/sys/fs/cgroup/cpu.stat", "throttled_usec", 1e-6),
        ("/sys/fs/cgroup/cpu/cpu.stat", "throttled_time", 1e-9),
    ):
        for line in (_read(path) or "").splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value) * scale
    return None


def affinity() -> list[int]:
    """The CPUs this process may run on, sorted."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class Cores:
    """The cores a benchmark owns and the threads sized to them."""

    ids: tuple[int, ...]
    source: str  # "--cpus", "SERVEBENCH_CPUS" or "affinity"
    threads: int
    threads_source: str  # "cores" or "cpu quota"
    quota: float | None = None

    @property
    def text(self) -> str:
        return format_cpu_list(self.ids)

    def describe(self) -> dict[str, Any]:
        return {
            "cores": self.text,
            "core_count": len(self.ids),
            "cores_source": self.source,
            "cpu_quota": round(self.quota, 2) if self.quota is not None else None,
        }

    def summary(self) -> str:
        quota = f", CPU quota {self.quota:g}" if self.quota is not None else ""
        return (
            f"cores {self.text} ({self.source}{quota}), "
            f"{self.threads} thread{'s' * (self.threads != 1)} ({self.threads_source})"
        )


def own_cores(requested: str | None = None, environ: dict[str, str] | None = None) -> Cores:
    """The cores to own: ``requested`` (a ``--cpus`` value), else ``$SERVEBENCH_CPUS``,
    else this process's affinity. CoreError when a requested core is not allowed here."""
    environ = dict(os.environ if environ is None else environ)
    allowed = affinity()
    source = "affinity"
    ids = allowed
    text = requested or environ.get(CPUS_ENV, "").strip()
    if text:
        source = "--cpus" if requested else CPUS_ENV
        ids = parse_cpu_list(text)
        outside = sorted(set(ids) - set(allowed))
        if outside:
            raise CoreError(
                f"{source}={text}: CPU {format_cpu_list(outside)} is not among the CPUs this "
                f"process may run on ({format_cpu_list(allowed)})"
            )
    quota = cgroup_cpu_quota()
    threads, threads_source = len(ids), "cores"
    if quota is not None and math.floor(quota) < threads:
        threads, threads_source = max(1, math.floor(quota)), "cpu quota"
    return Cores(tuple(ids), source, threads, threads_source, quota)


def pin(cores: Cores) -> None:
    """Bind this process (and so every child it starts later) to ``cores``."""
    if hasattr(os, "sched_setaffinity") and set(cores.ids) != set(affinity()):
        os.sched_setaffinity(0, cores.ids)


@contextlib.contextmanager
def pinned(ids: Sequence[int] | None) -> Iterator[None]:
    """Run the block on ``ids`` only: the calling thread's affinity, which every process it
    starts and every thread it creates inherits (the server's process and the client's),
    restored after. ``None`` or an empty list changes nothing."""
    if not ids or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, ids)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def process_affinity(pid: int) -> str | None:
    """The CPU list a running process may use ('0-3'); None when it cannot be read."""
    try:
        return format_cpu_list(sorted(os.sched_getaffinity(pid)))
    except (OSError, AttributeError):
        return None


def thread_env(cores: Cores) -> dict[str, str]:
    """Environment that sizes a child's OpenMP / MKL / OpenBLAS pools to ``cores``."""
    return {name: str(cores.threads) for name in THREAD_VARS}


def set_thread_env(cores: Cores) -> None:
    """Size this process's pools: call before torch is imported (children inherit it)."""
    os.environ.update(thread_env(cores))


# --------------------------------------------------------------------------- /proc


def _cpu_times() -> dict[int, tuple[int, int, int]] | None:
    """Per CPU: (busy, steal, total) clock ticks from /proc/stat."""
    text = _read(_PROC / "stat")
    if text is None:
        return None
    out: dict[int, tuple[int, int, int]] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *values = line.split()
        if not name[3:].isdigit():
            continue
        v = [int(x) for x in values[:8]] + [0] * (8 - len(values[:8]))
        user, nice, system, idle, iowait, irq, softirq, steal = v
        busy = user + nice + system + irq + softirq
        out[int(name[3:])] = (busy, steal, busy + idle + iowait + steal)
    return out


@dataclass(frozen=True)
class _Proc:
    name: str
    ppid: int
    started: int  # clock ticks after boot: tells a reused pid from the same process
    cpu_s: float  # its own user + system time
    reaped_s: float  # user + system time of the children it reaped


def _processes() -> dict[int, _Proc]:
    """Every process visible in this PID namespace, by pid."""
    out: dict[int, _Proc] = {}
    for pid, name, rest in procs.proc_stats(_PROC):
        try:
            out[pid] = _Proc(
                name=name,
                ppid=int(rest[1]),
                started=int(rest[19]),
                cpu_s=(int(rest[11]) + int(rest[12])) / _TICK,
                reaped_s=(int(rest[13]) + int(rest[14])) / _TICK,
            )
        except (IndexError, ValueError):
            continue
    return out


def _descendants(root: int, procs: dict[int, _Proc]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, proc in procs.items():
        children.setdefault(proc.ppid, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def load_avg() -> list[float] | None:
    """The host's 1, 5 and 15-minute load averages."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


@dataclass
class _Snapshot:
    at: float
    cpus: dict[int, tuple[int, int, int]] | None
    own_cpu_s: float
    own_pids: set[int]
    procs: dict[int, _Proc]
    throttled_s: float | None
    load: list[float] | None

    @classmethod
    def take(cls) -> _Snapshot:
        procs = _processes()
        me = os.getpid()
        mine = _descendants(me, procs)
        t = os.times()
        # This process including the children it reaped, plus live descendants with the
        # children *they* reaped: a child that ends inside the window still counts as ours.
        own = t.user + t.system + t.children_user + t.children_system
        own += sum(procs[p].cpu_s + procs[p].reaped_s for p in mine)
        return cls(
            at=time.monotonic(),
            cpus=_cpu_times(),
            own_cpu_s=own,
            own_pids=mine | {me},
            procs=procs,
            throttled_s=_throttled_s(),
            load=load_avg(),
        )


def _top_others(start: _Snapshot, end: _Snapshot) -> list[dict[str, Any]]:
    used: list[dict[str, Any]] = []
    mine = start.own_pids | end.own_pids
    for pid, proc in end.procs.items():
        if pid in mine:
            continue
        before = start.procs.get(pid)
        same = before is not None and before.started == proc.started
        delta = proc.cpu_s - before.cpu_s if same else proc.cpu_s
        if delta >= 0.01:
            used.append({"pid": pid, "name": proc.name, "cpu_s": round(delta, 2)})
    used.sort(key=lambda d: -d["cpu_s"])
    # Names only (the kernel's 15-character comm): command lines can carry secrets, and
    # the result document may be public.
    return used[:_TOP_OTHERS]


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


@dataclass
class Watch:
    """Conditions around one measurement: ``with Watch(cores) as w: ...; w.result()``.

    ``cpu_bound``: the measuring process itself must be running the whole time (the HF
    loop on a CPU), so a low CPU-time-to-wall ratio means it was kept waiting.
    ``threads``: the compute threads the measured code used (torch's), when it sized them.
    ``extra`` is merged into the result (e.g. the vLLM CPU thread binding).
    """

    cores: Cores
    cpu_bound: bool = False
    threads: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    _start: _Snapshot | None = None
    _end: _Snapshot | None = None

    def __enter__(self) -> Watch:
        self._start = _Snapshot.take()
        return self

    def __exit__(self, *exc: object) -> None:
        self._end = _Snapshot.take()

    def result(self) -> dict[str, Any]:
        start, end = self._start, self._end
        if start is None or end is None:
            raise RuntimeError("Watch.result() before the watched block ended")
        wall = max(end.at - start.at, 1e-9)
        own_cpu = max(end.own_cpu_s - start.own_cpu_s, 0.0)
        out: dict[str, Any] = {
            **self.cores.describe(),
            "host_cpus": os.cpu_count() or 0,
            "wall_s": round(wall, 3),
            "process_cpu_s": round(own_cpu, 3),
            "process_cpu_per_wall": round(own_cpu / wall, 3),
        }
        if self.threads is not None:
            out["threads"] = self.threads
            same = self.threads == self.cores.threads
            out["threads_source"] = self.cores.threads_source if same else "set by the caller"
        if start.cpus is not None and end.cpus is not None:
            owned = [c for c in self.cores.ids if c in start.cpus and c in end.cpus]
            d_busy = sum(end.cpus[c][0] - start.cpus[c][0] for c in owned) / _TICK
            d_steal = sum(end.cpus[c][1] - start.cpus[c][1] for c in owned) / _TICK
            d_total = sum(end.cpus[c][2] - start.cpus[c][2] for c in owned) / _TICK
            capacity = max(d_total, wall * len(owned), 1e-9)
            others = max(d_busy - own_cpu, 0.0)
            out |= {
                "others_cpu_s": round(others, 3),
                "others_share": round(others / capacity, 3),
                "steal_share": round(d_steal / capacity, 3),
            }
        else:
            out["note"] = "no /proc/stat here: other processes and steal were not measured"
        out["top_others"] = _top_others(start, end)
        if start.throttled_s is not None and end.throttled_s is not None:
            out["throttled_s"] = round(max(end.throttled_s - start.throttled_s, 0.0), 3)
        out["load_avg"] = {"start": start.load, "end": end.load}
        out |= self.extra
        out["reasons"] = judge(out, threads=self.cores.threads, cpu_bound=self.cpu_bound)
        out["contended"] = bool(out["reasons"])
        return out


def window_cpu(samples: list[list[float]], start: float, end: float) -> float | None:
    """CPU seconds a process used between ``start`` and ``end`` from its ``[[t, cpu_s],
    ...]`` samples (``runners.bench_client.CpuSampler``), linear between samples; None
    when the samples do not cover the window."""
    points = sorted((float(t), float(c)) for t, c in samples)
    if len(points) < 2 or start < points[0][0] or end > points[-1][0]:
        return None

    def at(x: float) -> float:
        for (t1, c1), (t2, c2) in itertools.pairwise(points):
            if t1 <= x <= t2:
                return c1 if t2 == t1 else c1 + (c2 - c1) * (x - t1) / (t2 - t1)
        return points[-1][1]

    return max(at(end) - at(start), 0.0)


def judge(c: dict[str, Any], *, threads: int, cpu_bound: bool = False) -> list[str]:
    """The reasons (plain sentences) a measurement with conditions ``c`` was contended;
    empty when nothing competed for its cores. ``threads``: the cores its work needs (a
    CPU quota below the core count leaves the rest as headroom others may use)."""
    reasons: list[str] = []
    wall, cores = c["wall_s"] or 1e-9, max(c["core_count"], 1)
    others = c.get("others_cpu_s")
    if others is not None:
        spare = max(cores - threads, 0)
        needed = max(cores - spare, 1)
        if others >= MIN_OTHERS_CPU_S and (others / wall - spare) / needed >= CONTENDED_SHARE:
            names = ", ".join(f"{p['name']} {p['cpu_s']:.2f} s" for p in c.get("top_others", []))
            where = (
                f"the {cores} cores it owned ({_pct(c['others_share'])} of their time)"
                if not spare
                else f"the {cores} cores it could run on, leaving fewer than the {threads} "
                "its CPU quota allows"
            )
            reasons.append(
                f"other processes used {others / wall:.2f} CPUs of {where}"
                + (f"; the busiest other processes: {names}" if names else "")
            )
    if (c.get("steal_share") or 0.0) >= CONTENDED_SHARE:
        reasons.append(
            f"the hypervisor took {_pct(c['steal_share'])} of its cores' time (CPU steal)"
        )
    throttled = c.get("throttled_s") or 0.0
    if throttled / wall >= CONTENDED_SHARE:
        reasons.append(f"its cgroup's CPU quota throttled it for {throttled:.2f} s of {wall:.2f} s")
    if cpu_bound and c["process_cpu_per_wall"] < MIN_CPU_PER_WALL:
        reasons.append(
            f"it ran only {_pct(c['process_cpu_per_wall'])} of the wall time although it needs "
            "a CPU all the time: it was kept waiting"
        )
    return reasons

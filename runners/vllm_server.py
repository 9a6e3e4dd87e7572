"""One vLLM OpenAI-compatible server for one server configuration (and ``LocalServer``,
what it shares with the other servers the runner starts: ``runners.transformers_server``).

Started as ``python -m vllm.entrypoints.openai.api_server`` from an argv list (no shell)
in a process group of its own (``runners.procs``), on a free local port, logging to a
file. Readiness is ``GET /health`` answering 200 before ``startup_timeout_s``; if the
process exits first (bad model path, out of memory, unsupported flag) that is noticed
within a second, not at the deadline, and the error carries the last lines of the log.

The module entry point (not the ``vllm`` console script) is used because it exists in
every vLLM distribution, including CPU builds whose console script cannot find the
``vllm`` package metadata; ``command()`` still prints the ``vllm serve`` line a person
would type.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

import requests

from runners import conditions as cond
from runners import procs
from runners.egress import Egress
from runners.spec import Spec, VLLMBackend

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
HOST = "127.0.0.1"
STOP_GRACE_S = 20.0  # SIGTERM to SIGKILL when the runner stops a server it is done with
INTERRUPT_GRACE_S = 5.0  # ... and when the runner itself was interrupted


class ServerError(RuntimeError):
    """The server could not start or died; the message is meant for a person."""


def optional_flags(pairs: Iterable[tuple[str, object]]) -> list[str]:
    """``[flag, value, ...]`` for each (flag, value) whose value is set (not None)."""
    return [part for flag, value in pairs if value is not None for part in (flag, str(value))]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def serve_flags(spec: Spec, backend: VLLMBackend) -> list[str]:
    """Every `vllm serve` flag for this configuration, model and address excluded."""
    m = spec.model
    flags = ["--dtype", m.dtype, "--max-model-len", str(m.max_model_len)]
    if m.revision:
        flags += ["--revision", m.revision]
    if m.tokenizer:
        flags += ["--tokenizer", m.tokenizer]
    if m.trust_remote_code:
        flags.append("--trust-remote-code")
    flags += [
        "--tensor-parallel-size", str(backend.tensor_parallel_size),
        "--kv-cache-dtype", backend.kv_cache_dtype,
        # Explicit both ways: vLLM's default has changed between releases.
        "--enable-prefix-caching" if backend.enable_prefix_caching
        else "--no-enable-prefix-caching",
    ]  # fmt: skip
    optional = (
        ("--gpu-memory-utilization", backend.gpu_memory_utilization),
        ("--max-num-batched-tokens", backend.max_num_batched_tokens),
        ("--max-num-seqs", backend.max_num_seqs),
        ("--quantization", backend.quantization),
        ("--block-size", backend.block_size),
    )
    flags += optional_flags(optional)
    if backend.enforce_eager:
        flags.append("--enforce-eager")
    if backend.speculative_config:
        flags += ["--speculative-config", json.dumps(backend.speculative_config, sort_keys=True)]
    if backend.lora_adapters:
        # Served next to the base model; each adapter resident at once (--max-loras).
        flags += ["--enable-lora", "--lora-modules"]
        flags += [f"{a.name}={a.path}" for a in backend.lora_adapters]
        flags += ["--max-loras", str(len(backend.lora_adapters))]
        if backend.max_lora_rank is not None:
            flags += ["--max-lora-rank", str(backend.max_lora_rank)]
    if spec.workload.trace is not None or spec.workload.sessions is not None:
        # Each answer's usage says how many prompt tokens came from the prefix cache:
        # the per-turn hit rate of sessions (runners.traffic).
        flags.append("--enable-prompt-tokens-details")
    # /health and /metrics polls would otherwise fill the log the failure reasons quote.
    flags.append("--disable-uvicorn-access-log")
    return [*flags, *backend.extra_args]


def server_env(backend: VLLMBackend) -> dict[str, str]:
    """Extra environment: dev mode exposes /reset_prefix_cache, needed only with caching."""
    return {"VLLM_SERVER_DEV_MODE": "1"} if backend.enable_prefix_caching else {}


class LocalServer:
    """A server the runner starts for one backend, in a process group of its own, on a free
    local port, logging to a file; use as a context manager to always stop it.

    Subclasses say how to start it (``argv``, ``env``) and what a person would type
    (``command``); ``LABEL`` names it in failure reasons."""

    LABEL = "the server"

    def __init__(self, spec: Spec, backend: Any, log_path: Path) -> None:
        self.spec = spec
        self.backend = backend
        self.log_path = log_path
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None
        # The cores it runs on (``runners.placement.split_cores``); None: the runner's.
        self.cpus: tuple[int, ...] | None = None
        self.affinity: str | None = None  # as read from the started process

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def egress(self) -> Egress:
        """What its HTTP clients may reach: this server only (``runners.egress``)."""
        return Egress.local_server(self.base_url, self.LABEL)

    def command(self) -> str:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        """The server's environment: the runner's, plus what the server needs."""
        return dict(os.environ)

    def start(self) -> None:
        """Spawn the server and wait for /health; raise ServerError (server stopped) if not."""
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"$ {shlex.join(self.argv())}\n".encode())
        # Pinned at birth: every engine process and OpenMP thread inherits the set.
        with cond.pinned(self.cpus):
            self.proc = procs.spawn(self.argv(), self.log_path, self.env())
        self.affinity = cond.process_affinity(self.proc.pid)
        try:
            self._wait_ready(started + self.backend.startup_timeout_s)
        except BaseException as exc:
            # Interrupted: the run must end within seconds, not after a full grace period.
            self.stop(INTERRUPT_GRACE_S if isinstance(exc, KeyboardInterrupt) else STOP_GRACE_S)
            raise
        self.startup_s = time.monotonic() - started

    def _wait_ready(self, deadline: float) -> None:
        assert self.proc is not None
        session = self.egress().session()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerError(
                    f"{self.LABEL} {procs.exit_text(code)} before it was ready. "
                    + procs.log_section(self.log_path, self.log_tail())
                )
            try:
                if session.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise ServerError(
                    f"{self.LABEL} was not ready within startup_timeout_s="
                    f"{self.backend.startup_timeout_s} s (raise it for large models). "
                    + procs.log_section(self.log_path, self.log_tail())
                )
            time.sleep(0.5)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        return procs.tail(self.log_path, lines)

    def ended(self) -> str:
        """How it ended, for failure reasons: "exited with code 1", "was killed by signal
        SIGKILL (9)" (the OOM killer, or a person)."""
        return procs.exit_text(self.proc.poll() if self.proc else None)

    def stop(self, grace_s: float | None = None) -> None:
        """Stop the whole process group (engine workers included); safe to call twice.
        ``grace_s`` between SIGTERM and SIGKILL: by default ``STOP_GRACE_S``, or
        ``INTERRUPT_GRACE_S`` while a SIGINT/SIGTERM of the runner is being handled."""
        if grace_s is None:
            interrupted = isinstance(sys.exc_info()[1], KeyboardInterrupt)
            grace_s = INTERRUPT_GRACE_S if interrupted else STOP_GRACE_S
        if self.proc is not None:
            procs.stop(self.proc, grace_s=grace_s)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class VLLMServer(LocalServer):
    """A running (or startable) vLLM server; use as a context manager to always stop it."""

    LABEL = "the vLLM server"
    backend: VLLMBackend

    def argv(self) -> list[str]:
        address = ["--host", HOST, "--port", str(self.port)]
        flags = serve_flags(self.spec, self.backend)
        return [
            sys.executable,
            "-m",
            SERVER_MODULE,
            "--model",
            self.spec.model.id,
            *address,
            *flags,
        ]

    def command(self) -> str:
        """The `vllm serve` command a person would type to get this exact server."""
        env = [f"{k}={v}" for k, v in server_env(self.backend).items()]
        address = ["--host", HOST, "--port", str(self.port)]
        argv = [*env, "vllm", "serve", self.spec.model.id, *address]
        return shlex.join([*argv, *serve_flags(self.spec, self.backend)])

    def env(self) -> dict[str, str]:
        return {**os.environ, **server_env(self.backend)}

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache so a point does not reuse the previous point's prompts."""
        session = self.egress().session()
        response = session.post(f"{self.base_url}/reset_prefix_cache", timeout=30)
        if response.status_code != 200:
            raise ServerError(
                f"POST /reset_prefix_cache answered {response.status_code}: "
                f"{response.text[:200]} (it needs VLLM_SERVER_DEV_MODE=1 in the server env)"
            )

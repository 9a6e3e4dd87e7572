"""Transformers' own OpenAI-compatible server for one ``transformers-serve`` backend.

``transformers serve MODEL`` (Transformers 5.x) loads the model given on its command line
and answers ``/v1/completions`` and ``/v1/chat/completions``: with ``--continuous-batching``
through paged attention (requests join and leave a running batch), without it one
``generate()`` call at a time on an inference thread. The runner starts it like a vLLM
server (``runners.vllm_server.LocalServer``: its own process group, a free local port,
a log, ``GET /health`` before ``startup_timeout_s``), measures it at the same points with
vLLM's bench client, and stops it.

The server refuses (422) any request field beyond its own schema, so the client goes
through the request adapter ``runners.bench_client --transformers-fields``: OpenAI fields,
plus a ``generation_config`` that forces output lengths (as vLLM's ``ignore_eos``) and
carries ``top_k``; each response's length is checked.

The module entry point ``python -m transformers.cli.transformers`` is used (the console
script need not be on PATH); ``command()`` prints the ``transformers serve`` line. The
server lists models from the Hugging Face hub cache, and fails to without one: the
directory is created if missing.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from runners import conditions as cond
from runners.spec import Spec, TransformersServeBackend
from runners.vllm_server import HOST, LocalServer, optional_flags

SERVER_MODULE = "transformers.cli.transformers"


def model_argument(spec: Spec) -> str:
    """The model as the server names it: ``id`` or ``id@revision``."""
    m = spec.model
    return f"{m.id}@{m.revision}" if m.revision else m.id


def device(spec: Spec) -> str:
    """CPU without GPUs, the GPU with one, the server's own placement across several."""
    gpus = spec.resources.gpu_count
    return "cpu" if gpus == 0 else "cuda" if gpus == 1 else "auto"


def serve_flags(spec: Spec, backend: TransformersServeBackend) -> list[str]:
    """Every ``transformers serve`` option for this backend, model and address excluded."""
    flags = ["--device", device(spec), "--dtype", spec.model.dtype]
    batching = (
        "--continuous-batching" if backend.continuous_batching else "--no-continuous-batching"
    )
    flags.append(batching)
    flags.append("--compile" if backend.compile else "--no-compile")
    if spec.model.trust_remote_code:
        flags.append("--trust-remote-code")
    optional = (
        ("--attn-implementation", backend.attn_implementation),
        ("--cb-num-blocks", backend.cb_num_blocks),
        ("--cb-block-size", backend.cb_block_size),
        ("--cb-max-batch-tokens", backend.cb_max_batch_tokens),
    )
    flags += optional_flags(optional)
    return flags


def hub_cache() -> Path:
    """The Hugging Face hub cache the server lists models from (HF_HUB_CACHE, HF_HOME/hub
    or ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(home) / "hub"


def serve_command(spec: Spec, backend: TransformersServeBackend, port: int | str) -> str:
    """The ``transformers serve`` command a person would type to serve ``backend`` on
    ``port`` (the runner's own, and the portal's reproduce section)."""
    argv = ["transformers", "serve", model_argument(spec), "--host", HOST, "--port", str(port)]
    return shlex.join([*argv, *serve_flags(spec, backend)])


class TransformersServer(LocalServer):
    """A running (or startable) ``transformers serve``."""

    LABEL = "transformers serve"
    backend: TransformersServeBackend

    def __init__(
        self,
        spec: Spec,
        backend: TransformersServeBackend,
        log_path: Path,
        cores: cond.Cores | None = None,
    ) -> None:
        super().__init__(spec, backend, log_path)
        self.cores = cores

    def argv(self) -> list[str]:
        address = ["--host", HOST, "--port", str(self.port)]
        flags = serve_flags(self.spec, self.backend)
        model = model_argument(self.spec)
        return [sys.executable, "-m", SERVER_MODULE, "serve", model, *address, *flags]

    def command(self) -> str:
        """The ``transformers serve`` command a person would type to get this server."""
        return serve_command(self.spec, self.backend, self.port)

    def env(self) -> dict[str, str]:
        # Its torch pools sized to the cores it owns, as the HF baselines' are: the run's,
        # or its share of them when the load generator has cores of its own.
        threads = cond.thread_env(self.cores) if self.cores is not None else {}
        if self.cores is not None and self.cpus:
            count = str(min(len(self.cpus), self.cores.threads))
            threads = {name: count for name in threads}
        return {**os.environ, **threads}

    def start(self) -> None:
        hub_cache().mkdir(parents=True, exist_ok=True)
        super().start()

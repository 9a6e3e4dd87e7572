"""One tiny vLLM server for the whole session, for every test that needs *a* server.

A vLLM server start costs ~60-100 s on 2 cores (importing torch and vLLM, loading the
model, warming up). Tests of the bench client, of /metrics scraping, of traffic formats
and of what a point measured need a running server, not one of their own: they share this
one (``shared_vllm`` in ``tests/conftest.py``). Tests that need flags of their own (an API
key, LoRA, ``max_num_seqs``, speculative decoding) or that start the server through the
runner keep their own.

Its configuration is the one such tests need: the tiny model, ``max_model_len`` 1024,
prefix caching on (vLLM's default; the runner resets the cache before each point, which
needs ``VLLM_SERVER_DEV_MODE=1``, set with it), 32-token cache blocks so that short
shared prefixes hit, and each answer's prompt-token details (the per-turn cache hits of
multi-turn sessions). A test measures it with its own spec (``measure_point(server,
spec, backend, ...)``): the spec decides the load, the server is what it is.

It starts when the first test that uses it starts (nothing is paid by a session that
selects none of them) and stops as soon as the last one ends (``stop_after_last_use``),
so it never runs beside the rest of the suite. A test may stop it (the stop tests of
``test_vllm.py``): ``running()`` starts it again for a later user, and ``starts`` says
how often that cost a start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SHARED_VLLM_BACKEND: dict[str, Any] = {
    "kind": "vllm",
    "enable_prefix_caching": True,
    "block_size": 32,
}
SHARED_VLLM_MAX_MODEL_LEN = 1024


def shared_vllm_spec(model: Path | str, workload: dict[str, Any], **more: Any) -> Any:
    """A spec (``runners.spec.Spec``) for the shared server: its model, max_model_len and
    backend (``backends[0]``), ``workload`` on top of a small default, ``more`` top-level
    fields (``correctness``...)."""
    from runners.spec import parse_spec

    return parse_spec(
        {
            "model": {"id": str(model), "max_model_len": SHARED_VLLM_MAX_MODEL_LEN},
            "workload": {"input_len": 32, "output_len": 8, "num_warmups": 1, **workload},
            "backends": [dict(SHARED_VLLM_BACKEND)],
            **more,
        }
    )


class SharedVLLM:
    """The session's shared vLLM server: ``spec`` and ``backend`` describe it (pass them,
    or a spec of your own, to ``measure_point``); ``running()`` is the server, started if
    it is not running."""

    def __init__(self, model: Path, workdir: Path) -> None:
        # Sessions turn on --enable-prompt-tokens-details (runners.vllm_server.serve_flags).
        self.spec = shared_vllm_spec(model, {"sessions": {"num_sessions": 1}})
        self.backend = self.spec.vllm_backends[0]
        self.workdir = workdir
        self.starts = 0
        self._server: Any = None

    def running(self) -> Any:
        """The running ``runners.vllm_server.VLLMServer``; starts one if there is none."""
        from runners.vllm_server import VLLMServer

        if self._server is None or not self._server.alive:
            self.starts += 1
            log = self.workdir / f"server-{self.starts}.log"
            self._server = VLLMServer(self.spec, self.backend, log)
            self._server.start()
        return self._server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

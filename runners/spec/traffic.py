"""Production traffic in the spec: a trace replayed at its own times (``Trace``), multi-turn
conversations (``Sessions``), and the correctness of the answers under that load
(``Correctness``). What they become is in ``runners.traffic``; ``docs/traffic.md`` is the
user's guide.

Each is ``None`` by default and left out of dumps until set, so the fingerprint of every
spec written before them is unchanged. A point driven by a trace or by sessions is sent by
servebench's own client (``python -m runners.traffic``), which calls vLLM's request
functions and vLLM's metric code: TTFT, TPOT, ITL and E2E mean what `vllm bench serve`
means by them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from runners.spec.common import _SAFE_PATH, FieldError, Strict, _safe

if TYPE_CHECKING:
    from runners.spec.root import Spec

TraceFormat = Literal["mooncake", "burstgpt", "azure"]


class Trace(Strict):
    """Requests replayed at the arrival times of a trace file."""

    path: str = Field(
        description="The trace: JSONL (mooncake) or CSV (burstgpt, azure); see docs/traffic.md."
    )
    format: TraceFormat = Field(
        description="'mooncake' (JSONL: timestamp ms, input_length, output_length, hash_ids); "
        "'burstgpt' (CSV: Timestamp s, Request tokens, Response tokens); 'azure' (CSV: "
        "TIMESTAMP, ContextTokens, GeneratedTokens)."
    )
    time_scale: float = Field(
        1.0,
        gt=0,
        le=1000,
        description="Arrival times are multiplied by this: 0.5 replays twice as fast, 2 at "
        "half speed.",
    )
    start_s: float = Field(
        0.0, ge=0, description="Window: skip the trace's first start_s seconds (trace time)."
    )
    duration_s: float | None = Field(
        None, gt=0, description="Window: replay this many seconds of the trace (trace time)."
    )
    max_requests: int | None = Field(
        None, ge=1, le=100_000, description="Window: at most this many requests."
    )
    block_size: int = Field(
        512,
        ge=1,
        le=65_536,
        description="Tokens per hash_ids block (mooncake): requests with equal leading "
        "hash_ids get equal leading prompt tokens.",
    )
    lag_limit_ms: float = Field(
        50.0,
        gt=0,
        le=60_000,
        description="The client could not keep up when its p99 send lag passes this.",
    )

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return _safe(v, "trace path", _SAFE_PATH)

    @model_validator(mode="after")
    def _extension(self) -> Trace:
        wanted = ".jsonl" if self.format == "mooncake" else ".csv"
        if not self.path.endswith(wanted):
            raise FieldError(
                "path", f"a {self.format} trace is a {wanted} file: its name ends in {wanted}"
            )
        return self


class Sessions(Strict):
    """Multi-turn conversations: each turn's prompt is the conversation so far plus the new
    user message, so the context grows and prefix caching can serve it."""

    source: Literal["synthetic", "sharegpt", "custom"] = Field(
        "synthetic",
        description="'synthetic' (turns of workload.input_len new tokens, each answered with "
        "workload.output_len); 'sharegpt' (a JSON list of {conversations: [{from, value}]}); "
        '\'custom\' (JSONL, one session per line: {"turns": ["...", ...]}).',
    )
    path: str | None = Field(None, description="The sessions file (sharegpt, custom).")
    num_sessions: int = Field(16, ge=1, le=10_000, description="Conversations per point.")
    turns: int = Field(
        3, ge=1, le=100, description="User turns per conversation (synthetic; a cap for files)."
    )
    think_time_s: float = Field(
        0.0, ge=0, le=3600, description="Pause between an answer and the next user turn."
    )
    session_concurrency: int | None = Field(
        None, ge=1, le=10_000, description="Conversations open at once (default: all)."
    )
    session_rate: float | None = Field(
        None, gt=0, le=10_000, description="Poisson arrivals of new conversations per second."
    )

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "sessions path", _SAFE_PATH)

    @model_validator(mode="after")
    def _source(self) -> Sessions:
        if self.source == "synthetic" and self.path:
            raise FieldError("path", "synthetic sessions read no file: leave path out")
        if self.source != "synthetic" and not self.path:
            raise FieldError("path", f"sessions from {self.source!r} need the file's path")
        if self.source == "custom" and not str(self.path).endswith(".jsonl"):
            raise FieldError("path", "custom sessions are a JSONL file: its name ends in .jsonl")
        return self


class Correctness(Strict):
    """Answers checked beside speed, from the responses of the loaded point itself."""

    sample: int = Field(
        16, ge=1, le=1000, description="Requests per point compared with the reference."
    )
    reference: Literal["hf", "none"] = Field(
        "hf",
        description="'hf': the same prompts decoded greedily by Transformers (token "
        "agreement); 'none': only the eval file.",
    )
    eval_file: str | None = Field(
        None,
        description="JSONL of {prompt, expected, match: exact|regex}: sent within the "
        "point's load and scored from its responses.",
    )

    @field_validator("eval_file")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "eval file path", _SAFE_PATH)

    @model_validator(mode="after")
    def _something(self) -> Correctness:
        if self.reference == "none" and not self.eval_file:
            raise FieldError("reference", "with reference 'none' give an eval_file to score")
        if self.eval_file and not self.eval_file.endswith(".jsonl"):
            raise FieldError("eval_file", "the eval file is JSONL: its name ends in .jsonl")
        return self


def check_traffic(spec: Spec) -> None:
    """What a trace, sessions and correctness need from the rest of the spec."""
    w = spec.workload
    driven = "trace" if w.trace is not None else "sessions" if w.sessions is not None else None
    if w.trace is not None and w.sessions is not None:
        raise FieldError("workload.sessions", "a point replays a trace or runs sessions, not both")
    if driven is not None:
        if w.dataset != "random" or w.ramp_up is not None or w.request_rate is not None:
            raise FieldError(
                f"workload.{driven}",
                f"the {driven} sets the prompts and arrivals itself: leave dataset, "
                "request_rate and ramp_up at their defaults",
            )
        if spec.sweeps:
            raise FieldError(
                "sweeps.0",
                f"a {driven} is replayed as one point; sweeps do not apply (run one spec "
                "per time_scale or session_concurrency instead)",
            )
        for i, backend in enumerate(spec.backends):
            if backend.kind.startswith("hf-"):
                raise FieldError(
                    f"backends.{i}.kind",
                    f"the HF baseline cannot replay a {driven}: it sends requests one batch "
                    "after another, with no arrival times or conversations. Remove it, or "
                    "measure it with a plain workload in a spec of its own",
                )
    s = w.sessions
    if s is not None and s.source == "synthetic":
        total = s.turns * (w.input_len + w.output_len)
        if total > spec.model.max_model_len:
            raise FieldError(
                "workload.sessions.turns",
                f"the last turn's context, turns x (input_len + output_len) = {total} "
                f"tokens, exceeds model.max_model_len {spec.model.max_model_len}: fewer "
                "turns or shorter ones",
            )
    c = spec.correctness
    if c is None:
        return
    if driven is None:
        raise FieldError(
            "correctness",
            "correctness is checked on points servebench's own client sends: set "
            "workload.trace or workload.sessions",
        )
    if c.reference == "hf" and not w.greedy:
        raise FieldError(
            "correctness.reference",
            "token agreement with the HF reference needs greedy decoding: leave temperature, "
            "top_p and top_k out, or use reference 'none' with an eval_file",
        )

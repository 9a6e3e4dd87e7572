"""What an HF baseline measures, said once: spec -> configuration -> flags -> configuration.

Three baselines run in child processes (``runners.hf``: hf-sequential;
``runners.hf_baselines``: hf-static-cache and hf-batched). Their configuration is built
here from a spec and a backend (``for_backend``), written as the child's flags
(``flags``, ``command``, ``child_argv``) and read back by the child's parser
(``add_flags`` / ``config_from_args``, ``add_baseline_flags`` / ``baseline_from_args``).
The runner runs it, the run page shows its ``command()`` under a Copy button
(``portal.benchmarks.commands``), and the child parses it: one rule for all three.

The rule:

- the model, revision, tokenizer, dtype and remote-code permission are the spec's
  ``model``; the seed is the workload's;
- hf-sequential and hf-static-cache measure one point (``runners.spec.hf_point``: the
  backend's own input/output lengths and prompt count, else the workload's);
  hf-batched measures each sweep point, in batches of the point's concurrency;
- with a custom dataset the baselines get the servers' prompts as the servers get them:
  the same file, through the chat template when any served backend is asked through chat.

This module imports neither torch, transformers nor numpy (nor Django): the portal builds
the commands without them, and a test keeps it so.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from runners.spec import HFBatchedBackend, HFStaticCacheBackend, hf_point

if TYPE_CHECKING:
    from runners.spec import HFBackend, Point, Spec

Kind = Literal["batched", "static-cache"]
COMPILE_BACKENDS = ("inductor", "aot_eager")
DTYPES = ("auto", "bfloat16", "float16", "float32")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")


@dataclass(frozen=True)
class HFConfig:
    """Everything that determines an HF baseline measurement."""

    model: str
    input_len: int
    output_len: int
    num_prompts: int
    num_warmups: int = 1
    seed: int = 0
    dtype: str = "bfloat16"
    revision: str | None = None
    tokenizer: str | None = None
    trust_remote_code: bool = False
    attn_implementation: str | None = None
    prompts_file: str | None = None
    chat_template: bool = False

    # The child that measures it: ``python -m runners hf``.
    module = ("runners", "hf")

    def flags(self) -> list[str]:
        """The ``python -m runners hf`` flags that reproduce this configuration."""
        argv = ["--model", self.model]
        for flag, value in (
            ("--revision", self.revision),
            ("--tokenizer", self.tokenizer),
            ("--attn-implementation", self.attn_implementation),
        ):
            if value is not None:
                argv += [flag, value]
        argv += [
            "--dtype", self.dtype,
            "--input-len", str(self.input_len),
            "--output-len", str(self.output_len),
            "--num-prompts", str(self.num_prompts),
            "--num-warmups", str(self.num_warmups),
            "--seed", str(self.seed),
        ]  # fmt: skip
        if self.trust_remote_code:
            argv.append("--trust-remote-code")
        if self.prompts_file is not None:
            argv += ["--prompts-file", self.prompts_file]
            if self.chat_template:
                argv.append("--chat-template")
        return argv

    def command(self) -> str:
        """The shell command that reruns exactly this baseline."""
        return shlex.join(["python", "-m", *self.module, *self.flags()])


@dataclass(frozen=True)
class BaselineConfig:
    """An ``HFConfig`` plus what the other baselines need: the batch size (hf-batched)
    and the ``torch.compile`` backend (hf-static-cache)."""

    kind: Kind
    hf: HFConfig
    batch_size: int = 1
    compile_backend: str = "inductor"

    # The child that measures it: ``python -m runners.hf_baselines``.
    module = ("runners.hf_baselines",)

    def flags(self) -> list[str]:
        argv = [self.kind, *self.hf.flags()]
        if self.kind == "batched":
            argv += ["--batch-size", str(self.batch_size)]
        else:
            argv += ["--compile-backend", self.compile_backend]
        return argv

    def command(self) -> str:
        return shlex.join(["python", "-m", *self.module, *self.flags()])


# --------------------------------------------------------------------------- spec -> config


def from_spec(
    spec: Spec, backend: HFBackend | HFBatchedBackend, point: Point | None = None
) -> HFConfig:
    """The ``HFConfig`` of ``backend`` at ``point`` (default: ``hf_point``, the single point
    hf-sequential and hf-static-cache measure)."""
    point = point or hf_point(spec, backend)  # type: ignore[arg-type]
    w = spec.workload
    custom = w.dataset == "custom"
    return HFConfig(
        model=spec.model.id,
        revision=spec.model.revision,
        tokenizer=spec.model.tokenizer,
        trust_remote_code=spec.model.trust_remote_code,
        dtype=spec.model.dtype,
        input_len=point.input_len,
        output_len=point.output_len,
        num_prompts=point.num_prompts,
        num_warmups=backend.num_warmups,
        seed=w.seed,
        attn_implementation=backend.attn_implementation,
        # The servers' prompts, as they get them (the spec keeps their api consistent).
        prompts_file=w.dataset_path if custom else None,
        chat_template=custom and any(b.api == "chat" for b in spec.served_backends),
    )


def for_backend(
    spec: Spec, backend: HFBackend | HFBatchedBackend, point: Point | None = None
) -> HFConfig | BaselineConfig:
    """What the runner runs for ``backend``: hf-sequential's ``HFConfig`` and
    hf-static-cache's at their single point (``hf_point``); hf-batched at the sweep
    ``point``, in batches of its concurrency."""
    if isinstance(backend, HFBatchedBackend):
        if point is None:
            raise ValueError("hf-batched is measured at a sweep point: pass it")
        base = from_spec(spec, backend, point)
        return BaselineConfig("batched", base, batch_size=point.max_concurrency)
    base = from_spec(spec, backend)
    if isinstance(backend, HFStaticCacheBackend):
        return BaselineConfig("static-cache", base, compile_backend=backend.compile_backend)
    return base


def child_argv(
    config: HFConfig | BaselineConfig, python: str, result: str, cpus: str | None = None
) -> list[str]:
    """The child process's argv: ``python`` (the interpreter) running ``config``, writing
    its result JSON to ``result``, owning ``cpus`` when given (else it inherits the
    parent's affinity or ``$SERVEBENCH_CPUS``)."""
    argv = [python, "-m", *config.module, *config.flags(), "--result", result]
    return [*argv, "--cpus", cpus] if cpus is not None else argv


# --------------------------------------------------------------------------- flags -> config


def add_flags(p: argparse.ArgumentParser) -> None:
    """The flags of ``HFConfig`` (``HFConfig.flags`` writes them; ``config_from_args``
    reads them), for every command that runs an HF baseline."""
    p.add_argument("--model", required=True)
    p.add_argument("--revision")
    p.add_argument("--tokenizer")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    p.add_argument("--input-len", type=int, required=True)
    p.add_argument("--output-len", type=int, required=True)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--num-warmups", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attn-implementation", choices=ATTN_IMPLEMENTATIONS)
    p.add_argument(
        "--prompts-file", help='JSONL prompts ({"prompt": ...}) in file order, not random ones'
    )
    p.add_argument(
        "--chat-template", action="store_true", help="apply the chat template to file prompts"
    )


def config_from_args(args: argparse.Namespace) -> HFConfig:
    """The ``HFConfig`` of flags ``add_flags`` parsed."""
    return HFConfig(
        model=args.model,
        revision=args.revision,
        tokenizer=args.tokenizer,
        trust_remote_code=args.trust_remote_code,
        dtype=args.dtype,
        input_len=args.input_len,
        output_len=args.output_len,
        num_prompts=args.num_prompts,
        num_warmups=args.num_warmups,
        seed=args.seed,
        attn_implementation=args.attn_implementation,
        prompts_file=args.prompts_file,
        chat_template=args.chat_template,
    )


def add_baseline_flags(p: argparse.ArgumentParser) -> None:
    """The flags of ``BaselineConfig``: the kind, ``add_flags``' and its own two."""
    p.add_argument("kind", choices=["batched", "static-cache"])
    add_flags(p)
    p.add_argument("--batch-size", type=int, default=1, help="hf-batched: requests per batch")
    p.add_argument(
        "--compile-backend", default="inductor", choices=COMPILE_BACKENDS, help="hf-static-cache"
    )


def baseline_from_args(args: argparse.Namespace) -> BaselineConfig:
    """The ``BaselineConfig`` of flags ``add_baseline_flags`` parsed."""
    return BaselineConfig(
        kind=args.kind,
        hf=config_from_args(args),
        batch_size=args.batch_size,
        compile_backend=args.compile_backend,
    )

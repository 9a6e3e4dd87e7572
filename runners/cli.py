"""``python -m runners``: run, validate and inspect benchmarks without the portal.

    python -m runners run SPEC.yaml --out result.json
    python -m runners run --preset seed --report URL        # token in SERVEBENCH_RUN_TOKEN
    python -m runners validate SPEC.yaml                     # errors name the field; exit 2
    python -m runners schema | env [SPEC] | presets [NAME] | tiny-model DIR
    python -m runners hf --model M --input-len 1024 ...     # the HF baseline on its own
    python -m runners gpu-check [--out F] [--record F]      # self-test of a new GPU node

Exit codes: 0 every measurement succeeded, 1 some or all failed, 2 usage error or
invalid spec, 130 interrupted (SIGINT, SIGTERM or SIGHUP; see ``stop_on_signals``).

The run token is read from SERVEBENCH_RUN_TOKEN (preferred: arguments show up in
``ps`` and in Kubernetes pod specs) or ``--token``.

``run`` and ``hf`` own their cores (``runners.conditions``): ``--cpus 2-7`` or
SERVEBENCH_CPUS gives them a core set, else every core the process may run on; the
process pins itself to them and sizes its threads to them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from runners import conditions, endpoint, placement, tiny_model
from runners.choices import ChoiceParser
from runners.environment import capture
from runners.fingerprint import fingerprint
from runners.hf import run as run_hf
from runners.hf_config import add_flags as add_hf_flags
from runners.hf_config import config_from_args as hf_config_from_args
from runners.progress import Progress
from runners.report import Reporter
from runners.runner import ExitCode, Interrupted, Runner
from runners.spec import PRESETS, Spec, SpecError, dump_spec, json_schema, loads_spec, preset

TOKEN_ENV = "SERVEBENCH_RUN_TOKEN"  # noqa: S105 (the variable's name, not a secret)


class UsageError(Exception):
    """Bad arguments or an invalid spec: exit code 2 with a message."""


def _load_spec(source: str | None, preset_name: str | None) -> Spec:
    if (source is None) == (preset_name is None):
        raise UsageError("give a spec file (or '-' for stdin) or --preset NAME, not both")
    if preset_name is not None:
        try:
            return preset(preset_name)
        except KeyError as exc:
            raise UsageError(exc.args[0]) from None
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read the spec: {exc}") from None
    try:
        return loads_spec(text)
    except SpecError as exc:
        lines = [f"  {e['field'] or '(spec)'}: {e['message']}" for e in exc.errors]
        raise UsageError("invalid spec:\n" + "\n".join(lines)) from None


# --------------------------------------------------------------------------- commands


def _own_cores(requested: str | None) -> conditions.Cores:
    """Resolve and pin the cores this command owns (before any child is started)."""
    try:
        cores = conditions.own_cores(requested)
        conditions.pin(cores)
    except (conditions.CoreError, OSError) as exc:
        raise UsageError(f"cannot own the cores: {exc}") from None
    return cores


def cmd_run(args: argparse.Namespace) -> int:
    spec = _load_spec(args.spec, args.preset)
    cores = _own_cores(args.cpus)
    try:
        placement.split_for(cores.ids)  # a bad SERVEBENCH_SERVER_CPUS stops it here, not later
    except conditions.CoreError as exc:
        raise UsageError(f"cannot split the cores: {exc}") from None
    reporter = None
    # Taken out of the environment so the children (vLLM server, HF baseline, bench client,
    # and any trust_remote_code model code in them) never see the run's token.
    env_token = os.environ.pop(TOKEN_ENV, None)
    # Endpoint API keys likewise: read once, then gone from what children inherit.
    api_keys = endpoint.take_keys(spec)
    if args.report:
        token = env_token or args.token
        if not token:
            raise UsageError(f"--report needs a run token: set {TOKEN_ENV} (or pass --token)")
        reporter = Reporter(args.report, token)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="servebench-run-"))
    out = Path(args.out) if args.out else None
    if out is None and reporter is None:
        out = workdir / "result.json"
    progress = Progress(quiet=args.quiet)
    progress.say(
        f"servebench: {spec.total_measurements()} measurements; logs in {workdir}"
        + (f"; result -> {out}" if out else "")
    )
    progress.say(f"servebench: {cores.summary()}")

    stop_on_signals()
    runner = Runner(
        spec,
        workdir=workdir,
        out=out,
        reporter=reporter,
        progress=progress,
        cores=cores,
        api_keys=api_keys,
    )
    code = runner.run()
    progress.say(f"servebench: done, exit code {int(code)}" + (f"; result in {out}" if out else ""))
    return code


def stop_on_signals() -> None:
    """Make SIGINT, SIGTERM and SIGHUP end the run (``Interrupted``), whatever this process
    inherited. A parent may have left SIGINT ignored (a shell's background job, some CI
    harnesses); Python then installs no Ctrl-C handler, and a run that ignores SIGINT goes
    on measuring until something kills it, which leaves its children behind. SIGHUP (the
    terminal closed) stops the run too, unless it was ignored on purpose (``nohup``)."""

    def on_signal(signum: int, frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_signal)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, on_signal)


def cmd_validate(args: argparse.Namespace) -> int:
    spec = _load_spec(args.spec, None)
    points = spec.points()
    at_points = len(spec.served_backends) + len(spec.batched_backends)
    search = (
        f", an SLA search of up to {spec.sla_search.max_points} points" if spec.sla_search else ""
    )
    print(
        f"ok: {spec.total_measurements()} measurements "
        f"({len(points)} points x {at_points} backends measured at each, "
        f"{len(spec.hf_backends)} HF baselines at one point{search}, {spec.repeats} repeats)"
    )
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(), indent=2))
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    if args.spec is None and args.preset is None:
        print(json.dumps({"environment": capture(None)}, indent=2))
        return 0
    spec = _load_spec(args.spec, args.preset)
    env = capture(spec)
    print(json.dumps({"environment": env, "fingerprint": fingerprint(spec, env)}, indent=2))
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    if args.name:
        try:
            print(dump_spec(preset(args.name)), end="")
        except KeyError as exc:
            raise UsageError(exc.args[0]) from None
        return 0
    for name, entry in sorted(PRESETS.items()):
        print(f"{name}: {entry['title']}\n    {entry['description']}")
    return 0


def cmd_tiny_model(args: argparse.Namespace) -> int:
    try:
        path = tiny_model.build(args.dir)
    except FileExistsError as exc:
        raise UsageError(str(exc)) from None
    print(path)
    return 0


def cmd_hf(args: argparse.Namespace) -> int:
    cores = _own_cores(args.cpus)
    conditions.set_thread_env(cores)  # before torch is imported: OpenMP reads it once
    config = hf_config_from_args(args)
    try:
        data = run_hf(config, cores).to_json()
        code = 0
    except Exception as exc:  # reported to the parent runner as the measurement's reason
        traceback.print_exc()
        data, code = {"error": f"the HF baseline failed: {type(exc).__name__}: {exc}"}, 1
    text = json.dumps(data)
    if args.result:
        Path(args.result).write_text(text + "\n", encoding="utf-8")
    else:
        print(json.dumps(data.get("metrics", data), indent=2))
    return code


def cmd_gpu_check(args: argparse.Namespace) -> int:
    from runners import gpucheck

    cores = _own_cores(args.cpus)
    conditions.set_thread_env(cores)
    return gpucheck.run(
        out=Path(args.out) if args.out else None,
        record=Path(args.record) if args.record else None,
        shape=args.shape,
        require_gpu=args.require_gpu,
        cores=cores,
    )


# --------------------------------------------------------------------------- parser


def _spec_source(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("spec", nargs=None if required else "?", help="YAML/JSON spec file, '-' = stdin")
    if not required:
        p.add_argument("--preset", help="a built-in spec instead of a file (see `presets`)")


def _cpus_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cpus",
        metavar="LIST",
        help=f"the cores this benchmark owns, e.g. 2-7 or 0,2 (default: ${conditions.CPUS_ENV}, "
        "else every core this process may run on); it pins itself and sizes threads to them",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = ChoiceParser(
        prog="python -m runners",
        description="servebench runner: HF sequential baseline vs vLLM sweeps.",
        epilog="Exit codes: 0 all succeeded, 1 some failed, 2 usage/invalid spec, 130 interrupted.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run a benchmark spec")
    _spec_source(p)
    p.add_argument("--out", help="write the result document here (updated after each point)")
    p.add_argument("--report", metavar="URL", help="the portal's ingestion URL for this run")
    p.add_argument("--token", help=f"run token (prefer the {TOKEN_ENV} environment variable)")
    p.add_argument("--workdir", help="logs and raw client output (default: a new temp dir)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    _cpus_flag(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("validate", help="check a spec; errors name the field (exit 2)")
    _spec_source(p, required=True)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("schema", help="print the spec's JSON Schema")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("env", help="print the captured environment as JSON")
    _spec_source(p)
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("presets", help="list presets, or print one as YAML")
    p.add_argument("name", nargs="?")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("tiny-model", help="build the tiny test model into DIR (offline)")
    p.add_argument("dir")
    p.set_defaults(func=cmd_tiny_model)

    p = sub.add_parser("hf", help="run only the HF sequential baseline")
    add_hf_flags(p)
    p.add_argument("--result", help="write the result JSON here instead of printing metrics")
    _cpus_flag(p)
    p.set_defaults(func=cmd_hf)

    p = sub.add_parser(
        "gpu-check",
        help="self-test of a GPU node: NVML, environment, HF baseline, roofline (< 5 min)",
    )
    p.add_argument("--out", help="write every check's details here (JSON)")
    p.add_argument("--record", help="write the raw NVML readings around the baseline here")
    p.add_argument(
        "--shape",
        choices=["qwen3-0.6b", "tiny"],
        default="qwen3-0.6b",
        help="the baseline's model: Qwen3-0.6B-shaped random weights (default), or the tiny one",
    )
    p.add_argument("--require-gpu", action="store_true", help="fail when no CUDA GPU is seen")
    _cpus_flag(p)
    p.set_defaults(func=cmd_gpu_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED

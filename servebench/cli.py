"""The ``servebench`` command: submit a benchmark, wait for it, compare it with a reference run,
and turn the verdict into an exit code a CI job can gate on.

    servebench submit spec.yaml --wait --compare-to latest:main --summary comment.md
    servebench compare BASE CANDIDATE --metric output_throughput --metric p99_ttft_ms
    servebench compare base.json candidate.json       # offline: two runner result files
    servebench label RUN main

Exit codes (the contract CI scripts rely on):

- 0: done; for ``compare`` and ``submit --compare-to``: nothing regressed.
- 1: ``compare`` / ``submit --compare-to`` found a regression (beyond threshold and noise).
- 2: a usage error, or the portal could not do it: unreachable, token refused, spec
  invalid (with its field), run failed (with its reason), wait timed out; or the two runs
  are not comparable (they measured different workloads or hardware: the table is
  printed, no change judged); or, with ``--refuse-contended``, either run was measured
  under CPU contention. One line on stderr says which and what to do next.

Two runs of one workload on one kind of hardware are comparable whatever else differs:
a changed engine flag, model variant, quantization or engine version is the change
being judged, listed as "what changed" above the verdict.

A change whose run-to-run noise was not measured (one repeat, no history of the series)
is reported as ``noise not measured`` and never fails the build (``servebench.verdict``).

The portal URL comes from ``--url`` or ``SERVEBENCH_URL``; the token from ``--token`` or
``SERVEBENCH_TOKEN``. A RUN argument is a run id, a unique prefix of one (the 8-character
short id pages and logs show), a run's page URL, or ``latest:<label>``
(``latest:<label>@<user>`` for another user's public runs): the newest succeeded run of
the series (fingerprint + label), resolved by the portal against the other run's
fingerprint.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from runners.choices import argparse_message
from servebench import __version__, render
from servebench.client import ApiError, Client, ServebenchError, TransientError
from servebench.compare import Comparison, History, compare_documents
from servebench.verdict import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_CONFIDENCE,
    DEFAULT_METRICS,
    DEFAULT_THRESHOLD,
    parse_metric,
    parse_threshold,
)

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

FINAL = ("succeeded", "failed", "cancelled")
# How long --wait rides out an unreachable portal (a restart, a deploy) before giving up.
UNREACHABLE_GRACE_S = 300.0
HEARTBEAT_S = 300.0
# While queued, the position in the queue every this often (a queue is where a CI job
# waits longest without anything else to show).
QUEUED_HEARTBEAT_S = 30.0
_RUN_URL = re.compile(r"/runs/([a-z0-9]{1,40})/?(?:[?#].*)?\Z")
RUN_ID_LENGTH = 20  # a full public id; anything shorter may be a prefix of one


class UsageError(ServebenchError):
    """Bad arguments: exit 2 with one line."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (and exit 2), like every error."""

    def error(self, message: str) -> NoReturn:
        message = argparse_message(message)  # "did you mean", as every choice error says
        raise UsageError(f"{message} (see {self.prog} --help)")


# --------------------------------------------------------------------------- arguments


def duration(text: str) -> float:
    """``90``, ``45s``, ``30m``, ``2h`` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; write 45s, 30m or 2h")
    value, unit = float(match.group(1)), match.group(2)
    return value * {"": 1, "s": 1, "m": 60, "h": 3600}[unit]


def fraction(text: str) -> float:
    try:
        return parse_threshold(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def confidence(text: str) -> float:
    value = parse_threshold(text) if text.strip().endswith("%") else float(text)
    if not 0.5 <= value < 1:
        raise argparse.ArgumentTypeError(f"confidence {text!r}: use e.g. 95% or 0.95")
    return value


def _common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument("--url", default=default, help="portal root URL (default: $SERVEBENCH_URL)")
    parser.add_argument(
        "--token", default=default, help="API token, sb_ci_... (default: $SERVEBENCH_TOKEN)"
    )


def _verdict_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metric",
        action="append",
        default=None,
        metavar="KEY",
        help="metric to judge, vLLM's key (repeatable, or comma-separated; default: "
        + ", ".join(DEFAULT_METRICS)
        + ")",
    )
    parser.add_argument(
        "--threshold",
        action="append",
        default=None,
        metavar="PCT",
        help="smallest change that counts, e.g. 5%% (default); METRIC=PCT for one metric, "
        "e.g. p99_ttft_ms=10%% (repeatable)",
    )
    parser.add_argument(
        "--confidence",
        type=confidence,
        default=DEFAULT_CONFIDENCE,
        help="interval coverage (default 95%%)",
    )
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=DEFAULT_BOOTSTRAP,
        metavar="N",
        help=f"bootstrap resamples (default {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument(
        "--refuse-contended",
        action="store_true",
        help="exit 2 instead of judging when either run was measured under CPU contention",
    )
    parser.add_argument(
        "--summary",
        metavar="FILE",
        help="also write the Markdown summary (for a PR comment) to FILE",
    )


def build_parser() -> Parser:
    parser = Parser(
        prog="servebench",
        description=(
            "Submit LLM-serving benchmarks to a servebench portal, wait, compare with a "
            "reference run. Exit 0: ok / no regression; 1: regression; 2: error."
        ),
    )
    parser.add_argument("--version", action="version", version=f"servebench {__version__}")
    _common(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    p = sub.add_parser("submit", help="submit a spec; print the run's permalink")
    _common(p, suppress=True)
    p.add_argument("spec", nargs="?", help="spec file (YAML or JSON)")
    p.add_argument("--preset", help="submit a preset instead of a file (see: servebench presets)")
    p.add_argument("--name", help="run name (default: the spec's name)")
    p.add_argument("--public", action="store_true", help="readable by anyone with the link")
    p.add_argument("--wait", action="store_true", help="wait for the end, then print results")
    p.add_argument(
        "--timeout", type=duration, default=None, help="give up waiting after this (e.g. 2h)"
    )
    p.add_argument(
        "--poll", type=duration, default=10.0, help="seconds between checks (default 10s)"
    )
    p.add_argument(
        "--compare-to",
        dest="baseline",
        metavar="RUN",
        help="with --wait: compare with RUN or latest:<label> and exit 1 on a regression",
    )
    p.add_argument("--baseline", dest="baseline", help=argparse.SUPPRESS)  # the old name
    p.add_argument(
        "--label",
        dest="set_baseline",
        metavar="LABEL",
        help="with --wait: once it succeeded, label the run (a series: latest:LABEL finds it)",
    )
    p.add_argument("--set-baseline", dest="set_baseline", help=argparse.SUPPRESS)  # old name
    _verdict_options(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", help="a run's status and progress")
    _common(p, suppress=True)
    p.add_argument("run", metavar="RUN")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("results", help="a run's measurements")
    _common(p, suppress=True)
    p.add_argument("run", metavar="RUN")
    p.add_argument("--format", choices=("table", "json", "csv", "markdown"), default="table")
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("cancel", help="cancel a queued or running run")
    _common(p, suppress=True)
    p.add_argument("run", metavar="RUN")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("presets", help="the spec presets the portal offers")
    _common(p, suppress=True)
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("validate", help="check a spec offline (the API's rules and messages)")
    p.add_argument("spec", help="spec file (YAML or JSON)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "compare",
        help="compare CANDIDATE with BASE (runs, or result files offline); exit 1 on a regression",
    )
    _common(p, suppress=True)
    p.add_argument(
        "base",
        metavar="BASE",
        help="run id, page URL, latest:<label>, or a result file (python -m runners run --out)",
    )
    p.add_argument(
        "candidate",
        metavar="CANDIDATE",
        help="run id, page URL, latest:<label>, or a result file",
    )
    p.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    p.add_argument("--markdown", action="store_true", help="same as --format markdown")
    _verdict_options(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "label", help="label a run (latest:LABEL is then the newest labelled run of a workload)"
    )
    _common(p, suppress=True)
    p.add_argument("run", metavar="RUN")
    p.add_argument("label", metavar="LABEL", help="e.g. the branch name: main")
    p.add_argument("--unset", action="store_true", help="remove the label instead")
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser("labels", help="list labelled runs")
    _common(p, suppress=True)
    p.add_argument("--label", default="")
    p.add_argument("--fingerprint", default="")
    p.add_argument("--owner", default="", help="'me' or a username")
    p.set_defaults(func=cmd_baselines)

    # The old names of `label` and `labels` ("baseline" is the HF baselines' word now).
    p = sub.add_parser("baseline", help=argparse.SUPPRESS)
    _common(p, suppress=True)
    p.add_argument("run", metavar="RUN")
    p.add_argument("--label", required=True)
    p.add_argument("--unset", action="store_true")
    p.set_defaults(func=cmd_baseline)
    p = sub.add_parser("baselines", help=argparse.SUPPRESS)
    _common(p, suppress=True)
    p.add_argument("--label", default="")
    p.add_argument("--fingerprint", default="")
    p.add_argument("--owner", default="")
    p.set_defaults(func=cmd_baselines)
    return parser


# --------------------------------------------------------------------------- helpers


def make_client(args: argparse.Namespace) -> Client:
    return Client.from_env(getattr(args, "url", None), getattr(args, "token", None))


def err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_id_of(ref: str) -> str:
    """A run id from an id, a page URL (``.../runs/<id>/``) or ``latest:...`` (unchanged)."""
    ref = ref.strip()
    match = _RUN_URL.search(ref)
    return match.group(1) if match and "://" in ref else ref


def resolve(client: Client, ref: str, *, fingerprint: str = "", before: str = "") -> dict:
    """The run ``ref`` names (see module doc), as the API lists it."""
    ref = run_id_of(ref)
    owner = ""
    if ref.startswith("latest:") and "@" in ref:
        ref, owner = ref.rsplit("@", 1)
    try:
        return client.resolve(ref, fingerprint=fingerprint, before=before, owner=owner)
    except ApiError as exc:
        if exc.status != 404 or ref.startswith("latest:") or len(ref) >= RUN_ID_LENGTH:
            raise
    # A short id that names no single run: the run's own endpoint says whether the prefix
    # starts no run the token may read (404) or several (400 ambiguous_id), in one line.
    return client.resolve(client.run(ref)["id"], fingerprint=fingerprint, before=before)


def is_latest(ref: str) -> bool:
    return run_id_of(ref).startswith("latest:")


def resolve_pair(client: Client, base_ref: str, cand_ref: str) -> tuple[dict, dict]:
    """(base, candidate). A ``latest:`` side is resolved in the other run's series; a
    ``latest:`` base is also older than the candidate, so a run marked under the same
    label never becomes its own reference."""
    if not is_latest(cand_ref) or is_latest(base_ref):
        cand = resolve(client, cand_ref)
        base = resolve(client, base_ref, fingerprint=cand.get("fingerprint") or "",
                       before=cand["id"] if is_latest(base_ref) else "")  # fmt: skip
        return base, cand
    base = resolve(client, base_ref)
    cand = resolve(client, cand_ref, fingerprint=base.get("fingerprint") or "")
    return base, cand


def require_succeeded(run: dict, role: str) -> None:
    status = run.get("status")
    if status == "succeeded":
        return
    page = (run.get("links") or {}).get("page", "")
    if status in FINAL:
        reason = render.failure(run)
        raise ServebenchError(
            f"{role} run {run.get('id')} {status}: {reason} ({page}); compare needs two "
            "succeeded runs"
        )
    raise ServebenchError(
        f"{role} run {run.get('id')} is still {status} ({render.progress(run)}); wait for it "
        f"(servebench status {run.get('id')}) or use submit --wait"
    )


def compare_url(base: dict, cand: dict) -> str:
    page = (cand.get("links") or {}).get("page", "")
    origin = page.split("/runs/")[0] if "/runs/" in page else ""
    return f"{origin}/compare/?runs={base['id']},{cand['id']}&reference={base['id']}"


def metrics_of(args: argparse.Namespace) -> list[str]:
    names = [n.strip() for chunk in (args.metric or []) for n in chunk.split(",") if n.strip()]
    names = names or list(DEFAULT_METRICS)
    try:
        return [parse_metric(n).key for n in names]
    except ValueError as exc:
        raise UsageError(f"--metric: {exc}") from None


def thresholds_of(args: argparse.Namespace) -> tuple[float, dict[str, float]]:
    default, per_metric = DEFAULT_THRESHOLD, {}
    for raw in args.threshold or []:
        metric, sep, value = raw.partition("=")
        try:
            if sep:
                per_metric[parse_metric(metric).key] = parse_threshold(value)
            else:
                default = parse_threshold(raw)
        except ValueError as exc:
            raise UsageError(f"--threshold: {exc}") from None
    return default, per_metric


def run_comparison(
    client: Client, args: argparse.Namespace, base: dict, cand: dict
) -> tuple[Comparison, str]:
    """Fetch both result documents and judge; (comparison, compare page URL)."""
    require_succeeded(base, "base")
    require_succeeded(cand, "candidate")
    if args.bootstrap < 100:
        raise UsageError("--bootstrap: use at least 100 resamples (2000 is the default)")
    threshold, per_metric = thresholds_of(args)
    comparison = compare_documents(
        client.result(base["id"]),
        client.result(cand["id"]),
        metrics_of(args),
        threshold=threshold,
        thresholds=per_metric,
        confidence=args.confidence,
        n_boot=args.bootstrap,
        seed=args.seed,
        history=series_history(client, base, cand),
    )
    return comparison, compare_url(base, cand)


def series_history(client: Client, base: dict, cand: dict) -> History | None:
    """The base's series' earlier runs (before the candidate), whose spread is the
    run-to-run noise when the runs have one repeat; None for runs of different series."""
    fingerprint, owner = base.get("fingerprint") or "", base.get("owner") or ""
    if not fingerprint or fingerprint != cand.get("fingerprint") or not owner:
        return None
    body = client.noise_history(
        fingerprint, owner, cand["id"], base.get("config_fingerprint") or ""
    )
    out: dict[tuple[str, str], dict[str, list[float]]] = {}
    for item in body.get("series") or []:
        key = (str(item.get("backend")), str(item.get("point")))
        out.setdefault(key, {})[str(item.get("metric"))] = list(item.get("values") or [])
    return out


def not_comparable(comparison: Comparison, base: dict, cand: dict) -> str:
    """The one error line when the runs measured different things."""
    what = "; ".join(comparison.differences[:3]) or "their fingerprints differ"
    return (
        f"runs {base['id']} and {cand['id']} are not comparable ({what}): they measured "
        "different workloads or hardware, so no change between them is judged. Compare with "
        "a run of the same workload on the same GPUs (latest:<label> finds one), or label a "
        "run of this workload (servebench label RUN LABEL)"
    )


def judged(comparison: Comparison, args: argparse.Namespace, base: dict, cand: dict) -> int:
    """The exit code of a comparison (module doc), saying on stderr why it is 2."""
    if not comparison.comparable:
        err(f"servebench: error: {not_comparable(comparison, base, cand)}")
        return EXIT_ERROR
    if comparison.is_contended:
        text = comparison.contention_text()
        if getattr(args, "refuse_contended", False):
            err(
                f"servebench: error: not judged (--refuse-contended): {text} Run it again "
                "on a machine that runs nothing else, or give the runner cores of its own "
                "(resources / SERVEBENCH_CPUS)."
            )
            return EXIT_ERROR
        err(f"servebench: warning: {text}")
    return EXIT_REGRESSION if comparison.regressed else EXIT_OK


def write_summary(path: str | None, text: str) -> None:
    if not path:
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ServebenchError(f"cannot write the summary to {path}: {exc.strerror}") from None


def wait_for(
    client: Client,
    run_id: str,
    *,
    timeout: float | None,
    poll: float,
    out: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict:
    """Poll the run until it ends; progress lines on stderr (on change, and a heartbeat:
    every QUEUED_HEARTBEAT_S with the queue position while queued, else HEARTBEAT_S).

    An unreachable portal is ridden out for UNREACHABLE_GRACE_S. Returns the final run;
    ServebenchError on timeout (the run keeps going) and for a failed or cancelled run.
    """
    out = out or sys.stderr
    start = clock()
    last_line, last_print, last_ok = "", start, start
    while True:
        try:
            run = client.run(run_id)
            last_ok = clock()
        except TransientError as exc:
            if clock() - last_ok > UNREACHABLE_GRACE_S:
                raise
            print(f"[{_elapsed(clock() - start)}] {exc} (still waiting)", file=out, flush=True)
            time.sleep(min(max(poll, 1.0), 30.0))
            continue
        line = f"run {run['id'][:8]} {run['status']}: {render.progress(run)} done"
        queue = run.get("queue") if run["status"] == "queued" else None
        if isinstance(queue, dict) and queue.get("position"):
            line += f"; position {queue['position']} in the queue: {queue.get('message', '')}"
        beat = QUEUED_HEARTBEAT_S if run["status"] == "queued" else HEARTBEAT_S
        now = clock()
        if line != last_line or now - last_print >= beat:
            print(f"[{_elapsed(now - start)}] {line}", file=out, flush=True)
            last_line, last_print = line, now
        if run["status"] in FINAL:
            break
        if timeout is not None and now - start >= timeout:
            raise ServebenchError(
                f"timed out after {_elapsed(timeout)} waiting for run {run['id']} "
                f"({run['status']}, {render.progress(run)}); it keeps running: "
                f"{run['links']['page']} (stop it with: servebench cancel {run['id']})"
            )
        time.sleep(poll)
    if run["status"] != "succeeded":
        raise ServebenchError(
            f"run {run['id']} {run['status']}: {render.failure(run)} ({run['links']['page']})"
        )
    return run


def _elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def read_spec_text(path: str) -> str:
    """The spec file's text, checked to be YAML/JSON here (the portal checks the rest)."""
    import yaml

    from runners.spec import YAMLFieldError, safe_yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ServebenchError(f"cannot read the spec {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ServebenchError(f"cannot read the spec {path}: not UTF-8 text") from None
    try:
        safe_yaml(text)
    except YAMLFieldError as exc:  # a key given twice, a YAML 1.1 scalar: say which
        raise ServebenchError(f"invalid spec {path}: {exc.field}: {exc.message}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ServebenchError(f"invalid spec {path}: not valid YAML or JSON{where}") from None
    return text


# --------------------------------------------------------------------------- commands


def cmd_submit(args: argparse.Namespace) -> int:
    if bool(args.spec) == bool(args.preset):
        raise UsageError("give a spec file or --preset NAME (one of them)")
    if (args.baseline or args.set_baseline) and not args.wait:
        raise UsageError("--compare-to and --label need --wait")
    # Usage errors before anything is queued.
    metrics_of(args)
    thresholds_of(args)
    client = make_client(args)
    text = read_spec_text(args.spec) if args.spec else None
    run = client.submit(text, preset=args.preset, name=args.name, public=args.public)
    print(run["links"]["page"], flush=True)
    err(
        f"submitted run {run['id']} ({run['progress']['total']} measurements); "
        f"follow it with: servebench status {run['id']}"
    )
    for warning in run.get("warnings") or []:  # queued, but the executor may not give it
        err(f"servebench: warning: {warning.get('field', 'spec')}: {warning.get('message', '')}")
    if not args.wait:
        return EXIT_OK
    run = wait_for(client, run["id"], timeout=args.timeout, poll=args.poll)
    document = client.result(run["id"])
    print()
    print(render.results_table(document))
    summary, code = render.results_markdown(run, document), EXIT_OK
    if args.set_baseline:
        client.mark_baseline(run["id"], args.set_baseline)
        err(f"labelled run {run['id']} {args.set_baseline!r}: latest:{args.set_baseline}")
    if args.baseline:
        base = resolve(
            client, args.baseline, fingerprint=run.get("fingerprint") or "", before=run["id"]
        )
        comparison, url = run_comparison(client, args, base, run)
        print()
        print(render.comparison_table(comparison, base, run), end="")
        summary = render.comparison_markdown(comparison, base, run, url)
        code = judged(comparison, args, base, run)
    write_summary(args.summary, summary)
    return code


def cmd_status(args: argparse.Namespace) -> int:
    print(render.run_status(resolve(make_client(args), args.run)))
    return EXIT_OK


def cmd_results(args: argparse.Namespace) -> int:
    client = make_client(args)
    run = resolve(client, args.run)
    document = client.result(run["id"])
    if run["status"] not in FINAL:
        err(f"run {run['id']} is still {run['status']} ({render.progress(run)}): results so far")
    elif run["status"] != "succeeded":
        err(f"run {run['id']} {run['status']}: {render.failure(run)}")
    if args.format == "json":
        print(json.dumps(document, indent=2))
    elif args.format == "csv":
        print(render.results_csv(document), end="")
    elif args.format == "markdown":
        print(render.results_markdown(run, document), end="")
    else:
        print(render.results_table(document))
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    client = make_client(args)
    run = resolve(client, args.run)
    cancelled = client.cancel(run["id"])
    print(f"cancelled run {cancelled['id']} ({cancelled.get('failure_reason') or 'cancelled'})")
    return EXIT_OK


def cmd_presets(args: argparse.Namespace) -> int:
    presets = make_client(args).presets()
    print(json.dumps(presets, indent=2) if args.format == "json" else render.presets_table(presets))
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    """Offline, with the runners' spec model: the API's rules and field names (``spec.``
    prefixed, as ``POST /api/v1/runs/`` reports them)."""
    from runners import spec as rs

    try:
        text = Path(args.spec).read_text(encoding="utf-8")
    except OSError as exc:
        raise ServebenchError(f"cannot read the spec {args.spec}: {exc.strerror}") from None
    try:
        spec = rs.loads_spec(text)
    except rs.SpecError as exc:
        errors = [
            {"field": f"spec.{e['field']}" if e["field"] else "spec", "message": e["message"]}
            for e in exc.errors
        ]
        err(f"servebench: error: invalid spec {args.spec}: {rs.SpecError(errors)}")
        for e in errors[1:]:
            err(f"  {e['field']}: {e['message']}")
        return EXIT_ERROR
    points = len(spec.points())
    backends = ", ".join(b.name for b in spec.backends)
    print(
        f"{args.spec}: valid: {spec.total_measurements()} measurements "
        f"({backends}; {points} sweep points x {spec.repeats} repeats)"
    )
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    metrics_of(args)  # usage errors before any request
    thresholds_of(args)
    files = [is_result_file(ref) for ref in (args.base, args.candidate)]
    if all(files):
        return compare_files(args)
    if any(files):
        raise UsageError(
            "give two result files, or two runs: a file and a run cannot be mixed (download "
            "the run's result first: servebench results RUN --format json > run.json)"
        )
    client = make_client(args)
    base, cand = resolve_pair(client, args.base, args.candidate)
    if base["id"] == cand["id"]:
        raise UsageError(f"BASE and CANDIDATE are the same run {base['id']}")
    comparison, url = run_comparison(client, args, base, cand)
    show_comparison(args, comparison, base, cand, url)
    return judged(comparison, args, base, cand)


def show_comparison(
    args: argparse.Namespace, comparison: Comparison, base: dict, cand: dict, url: str
) -> None:
    fmt = "markdown" if args.markdown else args.format
    if fmt == "json":
        print(render.comparison_json(comparison, base, cand, url), end="")
    elif fmt == "markdown":
        print(render.comparison_markdown(comparison, base, cand, url), end="")
    else:
        print(render.comparison_table(comparison, base, cand), end="")
    write_summary(args.summary, render.comparison_markdown(comparison, base, cand, url))


def is_result_file(ref: str) -> bool:
    """A compare argument that names a result file rather than a run: a path that exists,
    or one that ends in .json (so a mistyped file name is not sent to a portal as a run
    id)."""
    if ref.startswith("latest:") or "://" in ref:
        return False
    return ref.endswith(".json") or Path(ref).is_file()


def read_document(path: str, role: str) -> dict:
    """A result document (``python -m runners run --out``) from ``path``, or a one-line
    error naming the file and what is wrong with it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{role}: cannot read {path}: {exc.strerror}") from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{role}: {path} is not JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("measurements"), list):
        raise UsageError(
            f"{role}: {path} is not a result document (python -m runners run --out FILE "
            "writes one; GET /api/v1/runs/ID/result gives one)"
        )
    status = document.get("status")
    if status not in (None, "succeeded"):
        raise ServebenchError(
            f"{role} {path} is {status}: compare needs two succeeded runs "
            f"({render.first_error(document)})"
        )
    return document


def compare_files(args: argparse.Namespace) -> int:
    """``servebench compare base.json candidate.json``: the same verdict and exit codes
    without a portal (no series history: the noise comes from the runs' repeats)."""
    if args.bootstrap < 100:
        raise UsageError("--bootstrap: use at least 100 resamples (2000 is the default)")
    documents = [read_document(args.base, "BASE"), read_document(args.candidate, "CANDIDATE")]
    refs = [
        {"id": Path(path).name, "name": str((doc.get("spec") or {}).get("name") or "")}
        for path, doc in zip((args.base, args.candidate), documents, strict=True)
    ]
    threshold, per_metric = thresholds_of(args)
    comparison = compare_documents(
        documents[0],
        documents[1],
        metrics_of(args),
        threshold=threshold,
        thresholds=per_metric,
        confidence=args.confidence,
        n_boot=args.bootstrap,
        seed=args.seed,
    )
    show_comparison(args, comparison, refs[0], refs[1], "")
    return judged(comparison, args, refs[0], refs[1])


def cmd_baseline(args: argparse.Namespace) -> int:
    client = make_client(args)
    run = resolve(client, args.run)
    if args.unset:
        client.unmark_baseline(run["id"], args.label)
        print(f"run {run['id']} no longer has the label {args.label!r}")
        return EXIT_OK
    client.mark_baseline(run["id"], args.label)
    later = (
        ""
        if run["status"] == "succeeded"
        else f" (it counts once it succeeds; now {run['status']})"
    )
    print(
        f"run {run['id']} is labelled {args.label!r} for its workload "
        f"(fingerprint {str(run.get('fingerprint'))[:12]}){later}; compare with "
        f"--compare-to latest:{args.label}"
    )
    return EXIT_OK


def cmd_baselines(args: argparse.Namespace) -> int:
    page = make_client(args).baselines(
        label=args.label, fingerprint=args.fingerprint, owner=args.owner
    )
    rows = [
        [
            m["label"],
            m["run"]["id"],
            m["run"]["status"],
            m["run"]["name"],
            (m["run"].get("fingerprint") or "")[:12],
            m["run"]["created_at"],
            m.get("set_by") or "-",
        ]
        for m in page.get("results", [])
    ]
    print(render.table(["label", "run", "status", "name", "fingerprint", "created", "by"], rows))
    if page.get("next"):
        err(f"more: {page['next']}")
    return EXIT_OK


# --------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (see module doc)."""
    args: argparse.Namespace | None = None
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except ServebenchError as exc:
        err(f"servebench: error: {exc}")
        summary = getattr(args, "summary", None)
        if summary:
            # The pipeline's comment step posts the summary whatever happened: say why.
            try:
                write_summary(summary, f"### 🔴 servebench: error\n\n{exc}\n")
            except ServebenchError as again:
                err(f"servebench: error: {again}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        err("servebench: interrupted; a submitted run keeps going (servebench cancel RUN)")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `servebench results X | head`: not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK

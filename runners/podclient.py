"""``python -m runners.podclient --rendezvous URL --index I [--key-env NAME] -- COMMAND``.

What a client Pod runs (``runners.clientpods``): ``COMMAND`` (``runners.bench_client``
with this client's share of the point) with the start barrier at the runner's rendezvous
``URL``, then the client's result, report and log uploaded to the runner, and the
command's exit code as its own. ``--key-env NAME``: the endpoint's API key is in the
variable ``NAME`` (a Kubernetes Secret's, as in the runner's Pod) and the client reads it
as ``OPENAI_API_KEY``; no key is ever on a command line. The log's last lines also go to
the Pod's own log (``kubectl logs``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from runners.bench_client import REPORT_ENV
from runners.loadgen import BARRIER_ENV, INDEX_ENV

UPLOAD_TRIES = 6
UPLOAD_EXIT = 3  # the command ran but the runner never got its files


def result_file(command: Sequence[str]) -> Path | None:
    """The result file ``vllm bench serve`` writes (``--result-dir``/``--result-filename``)."""
    args = list(command)
    try:
        folder = args[args.index("--result-dir") + 1]
        name = args[args.index("--result-filename") + 1]
    except (ValueError, IndexError):
        return None
    return Path(folder) / name


def upload(url: str, index: int, kind: str, path: Path) -> None:
    """PUT one file to the runner, tried again with backoff while the network blinks."""
    body = path.read_bytes()
    for attempt in range(UPLOAD_TRIES):
        request = urllib.request.Request(  # noqa: S310 (the runner's http:// rendezvous)
            f"{url}/file/{index}/{kind}", data=body, method="PUT",
            headers={"Content-Type": "application/octet-stream"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310
                if answer.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                raise RuntimeError(f"the runner refused the {kind} file: HTTP {exc.code}") from None
        except OSError:
            pass
        time.sleep(min(2**attempt, 10))
    raise RuntimeError(f"the runner at {url.rsplit('/', 1)[0]} never took the {kind} file")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.podclient")
    parser.add_argument("--rendezvous", required=True, help="the runner's rendezvous URL")
    parser.add_argument("--index", type=int, required=True, help="this client's index")
    parser.add_argument("--key-env", default=None, help="the variable holding the API key")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the client's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    result = result_file(command)
    workdir = result.parent if result is not None else Path.cwd()
    workdir.mkdir(parents=True, exist_ok=True)
    report, log = workdir / "report.json", workdir / "client.log"
    env = dict(os.environ)
    env |= {BARRIER_ENV: args.rendezvous, INDEX_ENV: str(args.index), REPORT_ENV: str(report)}
    env.pop("OPENAI_API_KEY", None)
    if args.key_env:
        env["OPENAI_API_KEY"] = env.pop(args.key_env, "")
    with open(log, "w") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    sys.stdout.write("".join(log.read_text(errors="replace").splitlines(True)[-40:]))
    try:
        for kind, path in (("result", result), ("report", report), ("log", log)):
            if path is not None and path.exists():
                upload(args.rendezvous, args.index, kind, path)
    except RuntimeError as exc:
        print(f"servebench: {exc}; the point fails without this client's numbers", flush=True)
        return code or UPLOAD_EXIT
    return code


if __name__ == "__main__":
    raise SystemExit(main())

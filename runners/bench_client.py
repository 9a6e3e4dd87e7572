"""``python -m runners.bench_client ARGS``: vLLM's own ``vllm bench serve``, unchanged.

These are exactly the modules behind the ``vllm bench serve`` console command (parser,
flags, ``main``); the console script itself cannot start where vLLM is installed under
another distribution name (the CPU build). The runner runs this in a child process so
the client's event loop, tokenizer and GC settings never share a process with the
runner's metrics sampler, and an interrupted point can be killed as a group.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    bench_main(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

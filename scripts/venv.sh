#!/usr/bin/env bash
# Create (once) and print the path of the project's virtualenv.
#
# The venv lives outside the repo, keyed by a hash of the pinned requirements, so fresh
# clones (CI runs in one) reuse it and a change to the pins builds a new one.
# Override with SERVEBENCH_VENV=/some/dir.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_PIN="torch==2.13.0"   # CPU wheel on dev machines; install it first (docs/development.md)
key=$( { echo "$TORCH_PIN"; cat requirements/dev.lock; python3 --version; } | sha256sum | cut -c1-12)
cache="${SERVEBENCH_CACHE:-$HOME/.cache/servebench}"
venv="${SERVEBENCH_VENV:-$cache/venv-$key}"

if [ ! -f "$venv/.complete" ]; then
  mkdir -p "$cache"
  # One builder at a time (make test's steps, parallel shells): the others wait for it.
  exec 9>"$venv.lock"
  flock 9
fi
if [ ! -f "$venv/.complete" ]; then
  echo "servebench: building the virtualenv in $venv (a few minutes, once)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q "$TORCH_PIN" >&2
  "$venv/bin/pip" install -q -r requirements/dev.lock >&2
  # PyPI's torchvision/torchaudio break transformers' imports beside this torch.
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "$venv/bin/python" -c "import django, celery, transformers, vllm" >&2
  touch "$venv/.complete"
fi
echo "$venv"

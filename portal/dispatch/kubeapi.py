"""One connection to the Kubernetes API per process, and one way to call it.

Why a module of its own: the executor is constructed per call (``get_executor()``), but
loading a kubeconfig or the in-cluster token and building a connection pool is not free,
and a Celery prefork child must not reuse a socket pool its parent opened. So the
``ApiClient`` is built once per (process, config source) and cached here.

Config source, first match wins:

1. ``SERVEBENCH_K8S_KUBECONFIG`` (and ``SERVEBENCH_K8S_CONTEXT``): that file. An explicit
   file wins even inside a pod, so a portal can drive a cluster other than its own.
2. ``KUBERNETES_SERVICE_HOST`` is set: in-cluster (the pod's service account token).
3. Otherwise the client's default kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``).

Every call goes through ``Kube.call``: it always passes ``_request_timeout`` (a hung API
server must never hang a Celery task or a web request), retries transient failures (HTTP
429 and 5xx, connection errors, timeouts) with exponential backoff and full jitter, and
turns what is left into the executor's two exceptions with a sentence a person can act on:
``ExecutorUnavailable`` (transient: try again later) or ``ExecutorError`` (permanent: the
request is wrong or not allowed). 404 and 409 are returned to the caller as ``ApiException``
because they mean something there ("gone", "already submitted").
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from portal.dispatch.executors.base import ExecutorError, ExecutorUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

IN_CLUSTER_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

# Statuses worth another try: throttling, and the API server or a proxy in front of it
# being briefly away. Everything else in 4xx is about the request itself.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
# Returned to the caller, who knows what they mean (gone / already exists / not ready).
PASSTHROUGH_STATUSES = frozenset({404, 409})


@dataclass(frozen=True)
class Connection:
    """A configured API client plus what messages and defaults need to know about it."""

    api_client: client.ApiClient
    namespace: str  # the config source's default namespace
    source: str  # "in-cluster" or "kubeconfig PATH (context NAME)", for messages
    host: str


_connections: dict[tuple[int, str, str, bool], Connection] = {}
_lock = threading.Lock()


def _kubeconfig_namespace(path: str | None, context: str | None) -> str:
    try:
        contexts, active = config.list_kube_config_contexts(config_file=path)
    except (ConfigException, OSError):
        return "default"
    chosen = active
    if context:
        chosen = next((c for c in contexts if c.get("name") == context), active)
    return (chosen or {}).get("context", {}).get("namespace") or "default"


def _build(kubeconfig: str, context: str) -> Connection:
    cfg = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(
                config_file=kubeconfig, context=context or None, client_configuration=cfg
            )
            namespace = _kubeconfig_namespace(kubeconfig, context or None)
            source = f"kubeconfig {kubeconfig}" + (f" (context {context})" if context else "")
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
            try:
                namespace = IN_CLUSTER_NAMESPACE_FILE.read_text(encoding="utf-8").strip()
            except OSError:
                namespace = "default"
            source = "in-cluster service account"
        else:
            config.load_kube_config(context=context or None, client_configuration=cfg)
            namespace = _kubeconfig_namespace(None, context or None)
            source = "the default kubeconfig" + (f" (context {context})" if context else "")
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        raise ExecutorError(
            f"the Kubernetes executor has no usable cluster configuration ({exc}); set "
            "SERVEBENCH_K8S_KUBECONFIG to a kubeconfig file, or run the portal in a pod "
            "with a service account"
        ) from None
    # Our own retry loop (Kube.call) is the only one: urllib3's silent retries would
    # multiply the timeouts a caller waits for.
    cfg.retries = False
    return Connection(client.ApiClient(cfg), namespace or "default", source, cfg.host)


def connection(kubeconfig: str = "", context: str = "") -> Connection:
    """The process's connection for this config source, built on first use."""
    in_cluster = not kubeconfig and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    key = (os.getpid(), kubeconfig, context, in_cluster)
    conn = _connections.get(key)
    if conn is None:
        with _lock:
            conn = _connections.get(key)
            if conn is None:
                conn = _connections[key] = _build(kubeconfig, context)
    return conn


def api_message(exc: ApiException) -> str:
    """The API server's own sentence from a Status body (falls back to the HTTP reason)."""
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if body:
        try:
            status = json.loads(body)
        except (TypeError, ValueError):
            return str(body).strip()[:500]
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"])
    return f"HTTP {exc.status} {exc.reason or ''}".strip()


@dataclass
class Kube:
    """Calls with a timeout, retries and readable errors (see the module docstring)."""

    conn: Connection
    timeout: float = 10.0
    attempts: int = 4
    backoff: float = 0.5
    max_backoff: float = 8.0

    @property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.conn.api_client)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.conn.api_client)

    def call(
        self,
        what: str,
        fn: Callable[..., T],
        *args: Any,
        attempts: int | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> T:
        """``fn(*args, **kwargs, _request_timeout=...)`` with retries. ``what`` names the
        operation in errors ("create Job ns/name"). Raises ApiException for 404/409 only."""
        tries = max(1, attempts if attempts is not None else self.attempts)
        limit = timeout if timeout is not None else self.timeout
        # (connect, read): a dead address fails fast; a slow answer gets the full budget.
        kwargs["_request_timeout"] = (min(limit, 5.0), limit)
        problem = ""
        for attempt in range(1, tries + 1):
            try:
                return fn(*args, **kwargs)
            except ApiException as exc:
                if exc.status in PASSTHROUGH_STATUSES:
                    raise
                if exc.status not in TRANSIENT_STATUSES:
                    raise ExecutorError(self._permanent(what, exc)) from None
                problem = f"HTTP {exc.status}: {api_message(exc)}"
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                problem = f"{exc.__class__.__name__}: {exc}"
            if attempt < tries:
                # Full jitter: many workers retrying together do not stampede the server.
                delay = random.uniform(0, min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))  # noqa: S311
                log.info(
                    "kubernetes: %s failed (%s); retry %d in %.1f s", what, problem, attempt, delay
                )
                time.sleep(delay)
        raise ExecutorUnavailable(
            f"the Kubernetes API ({self.conn.host}, {self.conn.source}) did not answer "
            f"{what} after {tries} attempt{'s' if tries > 1 else ''}: {problem}"
        )

    def _permanent(self, what: str, exc: ApiException) -> str:
        message = api_message(exc)
        if exc.status in (401, 403):
            return (
                f"the Kubernetes API refused to {what} (HTTP {exc.status}: {message}); give "
                f"the portal's service account the servebench Role in that namespace "
                f"(the Helm chart's rbac.create) or fix the credentials of {self.conn.source}"
            )
        if exc.status == 422:
            return f"the Kubernetes API rejected {what}: {message}"
        return f"the Kubernetes API could not {what} (HTTP {exc.status}): {message}"

"""Fixtures for the Kubernetes tests: helm, kubectl, and a real control plane.

- ``helm``, ``kubectl``: the official static binaries ``scripts/kube-binaries.sh`` caches
  in ``$SERVEBENCH_CACHE/kube/bin`` (``make kube``).
- ``control_plane`` (session): a real etcd + kube-apiserver + kube-controller-manager
  v1.20.2 from the same cache, on free ports in a temporary directory, stopped as soon as
  this directory's last test ends (``k8s_support.start_control_plane``). Secure port
  only (1.20 has no insecure port), static tokens, a fresh service-account key pair, RBAC
  (the tests' token is in system:masters; a second one authenticates as the chart's
  ServiceAccount in ``CHART_NAMESPACE``, so a test checks what the chart's Role really allows),
  ``TTLAfterFinished`` on, and the controllers job, garbagecollector, ttl-after-finished,
  namespace and serviceaccount. No scheduler and no kubelet: ``kubelet`` patches Pods.
- ``namespace`` (session): a namespace of this session's own.
- The portal's fixtures (PostgreSQL, Redis, factories, ``personas``, ``celery_worker``)
  from ``tests/portal/conftest.py``, loaded here under a module name of its own, so these
  tests use the same services the same way.

Without the binaries these tests skip with the command that provides them (``need``); in
CI (``CI=true``) they fail instead.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_support import (
    CHART_NAMESPACE,
    CHART_RELEASE,
    HOW,
    REPO,
    RUNNER_ACCOUNT,
    RUNNER_NAMESPACE,
    ControlPlane,
    Kubelet,
    create_namespace,
    start_control_plane,
    tool,
)

# --------------------------------------------------------------------------- portal fixtures


def _load_portal_conftest() -> Any:
    path = REPO / "tests" / "portal" / "conftest.py"
    spec = importlib.util.spec_from_file_location("servebench_tests_portal_conftest", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_portal = _load_portal_conftest()
for _name in dir(_portal):
    _value = getattr(_portal, _name)
    if type(_value).__name__ == "FixtureFunctionDefinition":  # what @pytest.fixture makes
        globals()[_name] = _value


def pytest_configure(config: pytest.Config) -> None:
    _portal.pytest_configure(config)


# --------------------------------------------------------------------------- binaries


@pytest.fixture(scope="session")
def helm(need: Callable[..., None]) -> str:
    path = tool("helm")
    need(path, "helm 3", HOW)
    return str(path)


@pytest.fixture(scope="session")
def kubectl(need: Callable[..., None]) -> str:
    path = tool("kubectl")
    need(path, "kubectl", HOW)
    return str(path)


# --------------------------------------------------------------------------- control plane


@pytest.fixture(scope="session")
def control_plane(need: Callable[..., None], early_stop: Any) -> Iterator[ControlPlane]:
    """etcd, kube-apiserver and kube-controller-manager for tests/k8s; stopped as soon as
    this directory's last test ends (``early_stop``), not with the whole session."""
    binaries = {n: tool(n) for n in ("etcd", "kube-apiserver", "kube-controller-manager")}
    missing = [n for n, path in binaries.items() if not path]
    need(not missing, f"a Kubernetes control plane ({', '.join(missing)} missing)", HOW)
    portal = f"system:serviceaccount:{CHART_NAMESPACE}:{CHART_RELEASE}"
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{CHART_NAMESPACE}"]
    runner = f"system:serviceaccount:{RUNNER_NAMESPACE}:{RUNNER_ACCOUNT}"
    runner_groups = ["system:serviceaccounts", f"system:serviceaccounts:{RUNNER_NAMESPACE}"]
    users = {"portal": (portal, groups), "runner": (runner, runner_groups)}
    try:
        cp = start_control_plane({n: str(p) for n, p in binaries.items()}, users=users)
    except RuntimeError as exc:
        pytest.fail(f"the test control plane did not start: {exc}", pytrace=False)

    def stop() -> None:
        cp.stop()
        shutil.rmtree(cp.dir, ignore_errors=True)

    stop_once = early_stop(Path(__file__).parent, stop)
    yield cp
    stop_once()


@pytest.fixture(scope="session")
def kube_api(control_plane: ControlPlane) -> Any:
    return control_plane.api_client()


@pytest.fixture(scope="session")
def namespace(kube_api: Any) -> str:
    return create_namespace(kube_api, f"sb-test-{uuid.uuid4().hex[:6]}")


@pytest.fixture
def kubelet(kube_api: Any, namespace: str) -> Kubelet:
    return Kubelet(kube_api, namespace)


@pytest.fixture(scope="session")
def test_database_url(django_db_setup: None, django_db_blocker: Any) -> str:
    """DATABASE_URL of this session's test database, for processes the tests start.
    Only for tests marked ``django_db``: pytest-django creates the database for those."""
    with django_db_blocker.unblock():
        return _portal.database_url_for_tests()

"""Executors run a run's runner somewhere and report on it; see ``base.Executor``.

``get_executor(name)`` returns the configured implementation: ``local`` (a subprocess on
the worker's machine, ``local.LocalExecutor``) or ``kubernetes`` (a batch/v1 Job,
``kubernetes.KubernetesExecutor``, added in its own module with the same interface).
"""

from portal.dispatch.executors.base import (
    Executor,
    ExecutorError,
    ExecutorState,
    ExecutorStatus,
    ExecutorUnavailable,
    get_executor,
    report_url,
)

__all__ = [
    "Executor",
    "ExecutorError",
    "ExecutorState",
    "ExecutorStatus",
    "ExecutorUnavailable",
    "get_executor",
    "report_url",
]

"""``at_once(work, n)``: run ``work`` in ``n`` threads released together, each with its own
database connection (closed after), and return what each returned or raised: how a test
shows that two workers, beats or submits at the same moment do a thing once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


def at_once(work: Callable[[], Any], n: int, timeout: float = 60) -> list[Any]:
    barrier = threading.Barrier(n)
    outcomes: list[Any] = []

    def one() -> None:
        try:
            barrier.wait(timeout=10)
            outcomes.append(work())
        except Exception as exc:  # the outcome under test (a refusal), kept for the test
            outcomes.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    return outcomes

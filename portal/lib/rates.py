"""A rate from the environment: ``"600/min"`` -> (600, 60 s), loudly.

The settings module reads the API's throttle rates and the sign-in limits with it
(``rate(name, default)``); ``portal.api.throttling`` and ``portal.accounts.signin`` count
against the result. ``0`` or ``off`` means no limit (``None``).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured

from portal.lib import env

PERIODS = {"s": 1, "sec": 1, "second": 1, "min": 60, "minute": 60, "h": 3600, "hour": 3600}
PERIODS |= {"d": 86400, "day": 86400}


@dataclass(frozen=True)
class Rate:
    """``count`` events per ``seconds``."""

    count: int
    seconds: int

    def __str__(self) -> str:
        names = {1: "second", 60: "minute", 3600: "hour", 86400: "day"}
        return f"{self.count} per {names.get(self.seconds, f'{self.seconds} s')}"


def parse(text: str, name: str = "rate") -> Rate | None:
    """``N/period`` (period: s, min, hour, day, or a number of seconds) -> Rate; ``0`` or
    ``off`` -> None (no limit). ImproperlyConfigured naming ``name`` otherwise."""
    value = text.strip().lower()
    if value in ("0", "off", "none"):
        return None
    count, slash, period = value.partition("/")
    seconds = PERIODS.get(period.strip()) if slash else None
    if seconds is None and period.strip().isdigit():
        seconds = int(period.strip())
    if not count.strip().isdigit() or not seconds or int(count) < 1:
        raise ImproperlyConfigured(
            f"{name}={text!r} is not a rate; use N/period with period s, min, hour or day "
            "(e.g. 600/min), or 0 for no limit"
        )
    return Rate(int(count), seconds)


def rate(name: str, default: str) -> Rate | None:
    """The rate in variable ``name`` (``parse``), ``default`` when unset."""
    return parse(env.string(name, default), name)

"""Typed, loud environment readers for the settings module.

Every reader takes the variable's name and a default. A variable ``NAME_FILE`` holding a
path is read instead of ``NAME`` (Kubernetes/Docker secrets). A value that does not parse
raises ``ImproperlyConfigured`` naming the variable, the value's problem and an example,
so a typo fails at start-up instead of at the first request.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from runners.choices import choice_message


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def raw(name: str) -> str | None:
    """The variable's text: NAME_FILE's contents (stripped) if set, else NAME, else None."""
    file_var = f"{name}_FILE"
    path = os.environ.get(file_var)
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ImproperlyConfigured(
                f"{file_var}={path!r} cannot be read ({exc.strerror}); point it at a readable "
                f"file or set {name} directly"
            ) from None
    return os.environ.get(name)


def _missing(name: str, example: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(
        f"{name} is not set; set it (e.g. {name}={example}) or {name}_FILE=/path/to/file"
    )


def string(name: str, default: str | _Required = REQUIRED, example: str = "...") -> str:
    value = raw(name)
    if value is None or value == "":
        if isinstance(default, _Required):
            raise _missing(name, example)
        return default
    return value


def boolean(name: str, default: bool) -> bool:
    value = raw(name)
    if value is None:
        return default
    low = value.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean; use true/false or 1/0")


def integer(name: str, default: int, minimum: int | None = None) -> int:
    value = raw(name)
    if value is None or value.strip() == "":
        return default
    try:
        number = int(value.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer (e.g. {default})") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below the minimum {minimum}")
    return number


def strings(name: str, default: list[str]) -> list[str]:
    """A comma-separated list; blanks are dropped."""
    value = raw(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = string(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={choice_message(value, choices)}")
    return value


def url(name: str, default: str | _Required = REQUIRED, example: str = "https://...") -> str:
    """An http(s) base URL without a trailing slash."""
    value = string(name, default, example)
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ImproperlyConfigured(f"{name}={value!r} must be an http(s) URL, e.g. {example}")
    return value.rstrip("/")


def database(value: str, name: str = "DATABASE_URL") -> dict[str, object]:
    """A Django DATABASES entry from a postgres URL.

    Accepts ``postgres://`` and ``postgresql://``: ``postgres://user:pass@host:5432/db``,
    and unix sockets as ``postgresql://user@/db?host=/run/postgresql`` (what the embedded
    server reports). Other query parameters become psycopg connection options
    (``sslmode=require``).
    """
    parts = urlsplit(value)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ImproperlyConfigured(
            f"{name} must be a PostgreSQL URL (postgres://user:password@host:5432/dbname); "
            f"got scheme {parts.scheme!r}. servebench supports PostgreSQL only."
        )
    dbname = unquote(parts.path.lstrip("/"))
    if not dbname:
        raise ImproperlyConfigured(f"{name} names no database: add /dbname to the URL")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    host = query.pop("host", None) or (parts.hostname or "")
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"{name} has an invalid port") from None
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": dbname,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(port or ""),
        "OPTIONS": query,
    }


def broker(value: str, name: str = "REDIS_URL") -> str:
    """A Celery broker URL: redis://, rediss:// or redis+socket:///path/to/socket."""
    parts = urlsplit(value)
    if parts.scheme not in ("redis", "rediss", "redis+socket"):
        raise ImproperlyConfigured(
            f"{name} must be redis://host:6379/0, rediss://... or redis+socket:///path/redis.sock;"
            f" got scheme {parts.scheme!r}"
        )
    if parts.scheme == "redis+socket" and not parts.path:
        raise ImproperlyConfigured(f"{name}: redis+socket:// needs the socket's path")
    return value


_SSL_CERT_REQS = {"CERT_REQUIRED": "required", "CERT_OPTIONAL": "optional", "CERT_NONE": "none"}


def cache_location(broker_url: str, name: str = "REDIS_URL") -> str:
    """The URL redis-py (Django's Redis cache) takes for a broker URL (``broker``):
    redis+socket:///p?virtual_host=N becomes unix:///p?db=N; kombu's ssl_cert_reqs
    spellings (CERT_REQUIRED...) become redis-py's (required...). Other options pass."""
    parts = urlsplit(broker_url)
    query = []
    for key, values in parse_qs(parts.query, keep_blank_values=True).items():
        for value in values:
            if key == "virtual_host":
                if not value.strip("/").isdigit():
                    raise ImproperlyConfigured(f"{name}: virtual_host must be a database number")
                key, value = "db", value.strip("/")
            elif key == "ssl_cert_reqs":
                value = _SSL_CERT_REQS.get(value.upper(), value)
            query.append(f"{key}={value}")
    tail = f"?{'&'.join(query)}" if query else ""
    if parts.scheme == "redis+socket":
        return f"unix://{parts.path}{tail}"
    return f"{parts.scheme}://{parts.netloc}{parts.path}{tail}"

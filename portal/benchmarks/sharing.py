"""Who a run is shared with, and what its readers see.

A run is private to its owner (and staff), or public to anyone with the link; permalinks
are the run's unguessable public id either way (``queries.run_access`` is the rule).

Readers who do not manage a run never see what its runner printed: failure reasons and
measurement errors often end with the last lines of a log (paths, hosts, environment),
so for them each is its first line, at most ``PUBLIC_REASON_CHARS`` long.

Credentials (``scheme://user:password@host``, tokens, values of keys that name a secret)
are removed once, when text is stored (``scrub`` / ``scrub_value``: the runner's events,
measurements and environment at ingestion, a failure reason at its transition; migration
0008 scrubbed the rows stored before), so every reader reads stored text as it is. Text
that is never stored, a runner's live log tail, is scrubbed as it is read
(``portal.dispatch.runlog``).
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.utils import timezone

from portal.benchmarks import queries
from portal.benchmarks.models import Run

PUBLIC_REASON_CHARS = 300
REDACTED = "[redacted]"

# user:password@ (or a token as the user) in a URL; bearer-ish tokens (ours, Hugging
# Face's, OpenAI-style keys).
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@]+@")
_TOKENS = re.compile(r"\b(sb_[a-z]+_|hf_|sk-)[A-Za-z0-9_\-]{8,}")
_SECRET_KEY = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|AUTH", re.I)


def can_share(user: AbstractBaseUser | AnonymousUser, run: Run) -> bool:
    """The owner (or staff) decides; the same people who manage it."""
    return queries.may_manage(user, run)


def set_public(run: Run, user: AbstractBaseUser | AnonymousUser, public: bool) -> bool:
    """Make ``run`` public or private; PermissionError unless ``user`` may share it.
    Returns whether anything changed."""
    if not can_share(user, run):
        raise PermissionError("only the run's owner can change who sees it")
    changed = (
        Run.objects.filter(pk=run.pk)
        .exclude(is_public=public)
        .update(is_public=public, updated_at=timezone.now())
    )
    run.is_public = public
    return changed == 1


# --------------------------------------------------------------------------- redaction


def scrub(text: str) -> str:
    """``text`` with credentials in URLs and token-looking strings replaced."""
    if not text:
        return text
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    return _TOKENS.sub(REDACTED, text)


def scrub_value(value: Any, key: str = "") -> Any:
    """A JSON value with ``scrub`` applied to every string, and the value of any key that
    names a secret (``*_TOKEN``, ``PASSWORD``...) replaced."""
    if isinstance(value, dict):
        return {k: scrub_value(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_value(v, key) for v in value]
    if isinstance(value, str):
        if key and _SECRET_KEY.search(key) and value:
            return REDACTED
        return scrub(value)
    return value


def one_line(text: str | None, limit: int = PUBLIC_REASON_CHARS) -> str:
    """The first non-empty line of ``text``, scrubbed, at most ``limit`` characters."""
    if not text:
        return ""
    first = next((line.strip() for line in str(text).splitlines() if line.strip()), "")
    if len(first) > limit:
        first = first[: limit - 1].rstrip() + "…"
    more = len(str(text).strip()) > len(first) and "\n" in str(text).strip()
    return f"{first} (details for the run's owner)" if more else first


def failure_reason_for(user: AbstractBaseUser | AnonymousUser | None, run: Run) -> str:
    """The run's failure reason as ``user`` may see it: whole for who manages the run,
    one line for everyone else."""
    if queries.may_manage(user, run):
        return run.failure_reason
    return one_line(run.failure_reason)


def storage_notice(user: AbstractBaseUser | AnonymousUser | None, run: Run) -> str:
    """While the portal cannot store the run's measurements (``Run.storage_problem``): since
    when, what failed and what to do; the storage's name and error only for who manages
    the run (others learn that nothing is lost). Empty when all is well or the run ended."""
    if not run.storage_problem or run.is_final:
        return ""
    since = run.storage_problem_since
    when = f"Since {since:%H:%M:%S} UTC: " if since else ""
    if queries.may_manage(user, run):
        return when + run.storage_problem
    return (
        when + "the portal cannot store this run's measurements right now. The runner keeps "
        "them and retries, so nothing is lost; the run goes on once the storage answers."
    )


def error_for(manager: bool, text: str | None) -> str:
    """A runner's error text as a reader sees it (``manager``: may manage the run)."""
    if not text:
        return text or ""
    return text if manager else one_line(text)


def document_for(user: AbstractBaseUser | AnonymousUser | None, run: Run, doc: dict) -> dict:
    """A result document (``documents.result_document``) as ``user`` may see it: for who
    does not manage the run, errors are one line each (credentials were removed when the
    document's parts were stored)."""
    manager = queries.may_manage(user, run)
    doc = dict(doc)
    doc["errors"] = [
        {**e, "message": error_for(manager, e.get("message"))} if isinstance(e, dict) else e
        for e in doc.get("errors") or []
    ]
    doc["measurements"] = [
        {**m, "error": error_for(manager, m.get("error")) or None} if isinstance(m, dict) else m
        for m in doc.get("measurements") or []
    ]
    return doc

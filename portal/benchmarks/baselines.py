"""Baselines: mark a run under a label, list the marks, and resolve ``latest:<label>``.

A **series** is the runs that share a fingerprint (``Run.fingerprint``: model and its
revision, dtype and context length, workload, sweeps, every backend's engine config, GPU
type and count; not the name, repeats, image or vLLM version) *and* were marked with the
same label. A CI pipeline marks each run of its main branch (``label="main"``) and every
pull request compares against ``latest:main``: the newest succeeded run of the series that
has the candidate's fingerprint.

Who sees what:

- Only the run's owner (or staff) marks or unmarks it; a public run is readable by all,
  never markable by all.
- ``latest:<label>`` resolves among the runs of **one owner**: the requesting user unless
  ``owner`` names someone else (whose runs must then be visible: public). A stranger's
  public run can therefore never become your CI's baseline by surprise, which would let
  anyone make a regression pass by marking a slow run.
- A run id is also a valid reference (``resolve(user, "k3j...")``), so clients resolve
  every RUN argument through one call.

Every error is a ``BaselineError`` with an HTTP status, a code, the parameter at fault and
a message that says what to do next.
"""

from __future__ import annotations

import re

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from portal.benchmarks import queries
from portal.benchmarks.models import BASELINE_LABEL_MAX, Baseline, Run, RunStatus

LATEST = "latest:"
# Branch-name-like: "main", "release/1.2", "nightly-h100". No ':' or '@' (they delimit
# references) and no whitespace.
LABEL_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._/+-]{{0,{BASELINE_LABEL_MAX - 1}}}\Z")
_RUN_ID_RE = re.compile(r"^[a-z0-9]{1,40}\Z")

# A run in these states never becomes a useful baseline.
_UNMARKABLE = (RunStatus.FAILED, RunStatus.CANCELLED)


class BaselineError(Exception):
    """A refusal: HTTP ``status``, machine ``code``, the ``field`` at fault, and what to do."""

    def __init__(self, status: int, code: str, message: str, field: str = ""):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field


def validate_label(label: object, field: str = "label") -> str:
    """The label if it is one (see LABEL_RE), else BaselineError(400) naming ``field``."""
    if not isinstance(label, str) or not label.strip():
        raise BaselineError(400, "invalid", "give a label, e.g. the branch name: main", field)
    label = label.strip()
    if not LABEL_RE.match(label):
        raise BaselineError(
            400,
            "invalid",
            f"{label[:40]!r} is not a label: use up to {BASELINE_LABEL_MAX} letters, digits and "
            "'._/+-', starting with a letter or digit (a branch name such as main or release/1.2)",
            field,
        )
    return label


def can_mark(user: AbstractBaseUser | AnonymousUser, run: Run) -> bool:
    """The owner (or staff): the same people who may cancel or share the run."""
    return queries.can_cancel(user, run)


def mark(run: Run, user: AbstractBaseUser, label: str) -> tuple[Baseline, bool]:
    """Mark ``run`` as a baseline under ``label``: (mark, created). Marking twice is a no-op.

    PermissionError if ``user`` may not; BaselineError(409) for a failed or cancelled run
    (an active run may be marked: it counts once it succeeds).
    """
    label = validate_label(label)
    if not can_mark(user, run):
        raise PermissionError("only the run's owner can mark it as a baseline")
    if run.status in _UNMARKABLE:
        reason = f" ({run.failure_reason})" if run.failure_reason else ""
        raise BaselineError(
            409,
            "run_not_succeeded",
            f"run {run.short_id} is {run.status}{reason}; only a succeeded run (or one still "
            "running) can be a baseline. Mark a succeeded run of the series instead.",
            "run",
        )
    existing = Baseline.objects.filter(run=run, label=label).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            mark = Baseline.objects.create(run=run, label=label, set_by=user)
            _touch(run)
            return mark, True
    except IntegrityError:  # a concurrent mark of the same (run, label)
        return Baseline.objects.get(run=run, label=label), False


def _touch(run: Run) -> None:
    """A label shows on cached pages (the history's runs): their keys follow the runs'
    ``updated_at``."""
    Run.objects.filter(pk=run.pk).update(updated_at=timezone.now())


def unmark(run: Run, user: AbstractBaseUser, label: str) -> bool:
    """Remove the mark; True if there was one. PermissionError if ``user`` may not."""
    label = validate_label(label)
    if not can_mark(user, run):
        raise PermissionError("only the run's owner can unmark it")
    deleted, _ = Baseline.objects.filter(run=run, label=label).delete()
    if deleted:
        _touch(run)
    return deleted > 0


def visible_marks(
    user: AbstractBaseUser | AnonymousUser,
    *,
    label: str = "",
    fingerprint: str = "",
    owner: str = "",
) -> QuerySet[Baseline]:
    """Marks on runs ``user`` may read, newest run first; filters are exact matches.

    ``owner`` is ``"me"`` or a username.
    """
    marks = Baseline.objects.filter(run__in=queries.visible_runs(user))
    if label:
        marks = marks.filter(label=validate_label(label))
    if fingerprint:
        marks = marks.filter(run__fingerprint=fingerprint)
    if owner == "me":
        marks = marks.filter(run__owner=user) if user.is_authenticated else marks.none()
    elif owner:
        marks = marks.filter(run__owner__username=owner)
    return marks.select_related("run__owner", "set_by").order_by(
        "-run__created_at", "-run__id", "label"
    )


def parse_ref(ref: object) -> tuple[str, str]:
    """``("latest", label)`` for ``latest:<label>``, ``("run", id)`` for a run id."""
    if not isinstance(ref, str) or not ref.strip():
        raise BaselineError(400, "invalid", "give ref=<run id> or ref=latest:<label>", "ref")
    ref = ref.strip()
    if ref.startswith(LATEST):
        return "latest", validate_label(ref[len(LATEST) :], "ref")
    if _RUN_ID_RE.match(ref):
        return "run", ref
    raise BaselineError(
        400,
        "invalid",
        f"{ref[:40]!r} is neither a run id nor latest:<label> (e.g. latest:main)",
        "ref",
    )


def _owner(user: AbstractBaseUser | AnonymousUser, owner: str) -> AbstractBaseUser:
    if owner and owner != "me":
        found = get_user_model().objects.filter(username=owner).first()
        if found is None:
            raise BaselineError(
                404, "not_found", f"no user {owner[:60]!r}; check the owner parameter", "owner"
            )
        return found
    if not user.is_authenticated:
        raise BaselineError(
            401,
            "not_authenticated",
            "latest:<label> resolves among your own runs: send your token "
            "(Authorization: Bearer sb_ci_...), or name whose runs with owner=<username>",
            "ref",
        )
    return user


def resolve(
    user: AbstractBaseUser | AnonymousUser,
    ref: str,
    *,
    fingerprint: str = "",
    before: str = "",
    owner: str = "",
) -> Run:
    """The run ``ref`` names, for ``user``.

    - a run id: that run, if ``user`` may read it.
    - ``latest:<label>``: the newest (by creation) succeeded run of ``owner`` (default: the
      user) marked ``label``, among the runs ``user`` may read; with ``fingerprint``, of
      that series only; with ``before`` (a run id), created before that run, so a
      candidate marked under the same label never resolves to itself. Without a
      fingerprint the label must name one series (else 409 ``ambiguous_ref``).
    """
    kind, value = parse_ref(ref)
    if kind == "run":
        try:
            return queries.get_visible_run(user, value)
        except Run.DoesNotExist:
            raise BaselineError(
                404,
                "not_found",
                f"no run {value!r} that you can see; check the id, or sign in as its owner",
                "ref",
            ) from None
    label = value
    who = _owner(user, owner)
    marks = Baseline.objects.filter(label=label, run__owner=who, run__in=queries.visible_runs(user))
    if before:
        try:
            anchor = queries.get_visible_run(user, before)
        except Run.DoesNotExist:
            raise BaselineError(
                404, "not_found", f"no run {before[:40]!r} that you can see", "before"
            ) from None
        marks = marks.filter(run__created_at__lt=anchor.created_at).exclude(run=anchor)
    candidates = marks.filter(run__status=RunStatus.SUCCEEDED)
    if fingerprint:
        candidates = candidates.filter(run__fingerprint=fingerprint)
    else:
        series = set(candidates.values_list("run__fingerprint", flat=True).distinct()[:3])
        if len(series) > 1:
            raise BaselineError(
                409,
                "ambiguous_ref",
                f"label {label!r} marks runs of several series (different workloads or GPUs); "
                "pass fingerprint=<the run's fingerprint>, or compare "
                "against a run so its fingerprint is used",
                "fingerprint",
            )
    found = candidates.select_related("run__owner").order_by("-run__created_at", "-run__id").first()
    if found is not None:
        return found.run
    raise BaselineError(404, "no_baseline", _why_none(marks, label, fingerprint, who), "ref")


def _why_none(
    marks: QuerySet[Baseline], label: str, fingerprint: str, who: AbstractBaseUser
) -> str:
    """Why ``latest:<label>`` found nothing, and what to do about it."""
    whose = f"{who.get_username()}'s"
    fix = f"label one: servebench label RUN {label}"
    same_series = marks.filter(run__fingerprint=fingerprint) if fingerprint else marks
    if same_series.exists():
        return (
            f"{whose} runs marked {label!r} in this series have not succeeded (yet); "
            f"wait for one, or {fix}"
        )
    others = marks.exclude(run__fingerprint=fingerprint).values("run__fingerprint").distinct()
    count = others.count() if fingerprint else 0
    if count:
        return (
            f"no run of {whose} labelled {label!r} measured this workload on this hardware "
            f"(fingerprint {fingerprint[:12]}); {count} other series carry the label: their "
            "workload, sweep points or GPU differ (a changed model or engine flag would not "
            f"differ). Compare with an explicit run id, or {fix}"
        )
    return f"no run of {whose} is marked {label!r}; {fix}"


def labels_of(run_ids: list[int]) -> dict[int, list[str]]:
    """Each run's labels, sorted (one query, over the (run, label) unique index)."""
    out: dict[int, list[str]] = {}
    rows = Baseline.objects.filter(run_id__in=run_ids).order_by("label")
    for run_id, label in rows.values_list("run_id", "label"):
        out.setdefault(run_id, []).append(label)
    return out

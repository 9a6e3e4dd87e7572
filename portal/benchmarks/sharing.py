"""Who a run is shared with: private to its owner (and staff), or public to anyone with
the link. Permalinks are the run's unguessable public id either way."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.utils import timezone

from portal.benchmarks import queries
from portal.benchmarks.models import Run


def can_share(user: AbstractBaseUser | AnonymousUser, run: Run) -> bool:
    """The owner (or staff) decides; the same people who may cancel it."""
    return queries.can_cancel(user, run)


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

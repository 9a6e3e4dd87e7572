"""Subscribing to a labelled series: the rules the alerts page and the API share.

- ``subscribe(user, ...)``: validate and store; returns the subscription and, for a
  webhook, its signing secret (shown once). ``SubscriptionError`` names the field.
- Whose series: your own by default; another user's only when you can read at least one
  of their runs with that label (a public one), and alerts about it reach you only for
  runs you can read when they are judged. Nobody learns of a private run this way.
- Targets: webhooks through ``egress.check_url`` (the admin's allow-list, no internal
  addresses); email to your own address, or one in ``SERVEBENCH_ALERT_EMAIL_DOMAINS``, and
  only where the portal sends mail (``SERVEBENCH_EMAIL_HOST``).
- ``unsubscribe(user, public_id)``: only the subscriber (or staff) removes one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db.models import QuerySet

from portal.alerts import egress, signing
from portal.alerts.models import Channel, Delivery, Subscription
from portal.benchmarks import baselines, queries
from portal.benchmarks.models import Baseline
from runners.choices import choice_message

MAX_PER_USER = 50
_FINGERPRINT = re.compile(r"^[0-9a-f]{64}\Z")


class SubscriptionError(ValueError):
    """A refused subscription: ``field`` at fault, HTTP ``status``."""

    def __init__(self, field: str, message: str, status: int = 400):
        super().__init__(message)
        self.field = field
        self.status = status


@dataclass(frozen=True)
class Subscribed:
    subscription: Subscription
    secret: str | None  # the webhook's signing secret: shown once


def email_enabled() -> bool:
    return bool(settings.EMAIL_HOST)


def _series_owner(user: Any, owner: str) -> Any:
    if not owner or owner == "me" or owner == user.get_username():
        return user
    found = get_user_model().objects.filter(username=owner).first()
    if found is None:
        raise SubscriptionError("owner", f"no user {owner[:60]!r}", 404)
    return found


def _check_target(user: Any, channel: str, target: str) -> str:
    target = (target or "").strip()
    if channel in (Channel.WEBHOOK, Channel.SLACK):
        try:
            egress.check_url(target)
        except egress.Refused as exc:
            raise SubscriptionError("target", str(exc)) from None
        return target
    if not email_enabled():
        raise SubscriptionError(
            "channel", "this portal sends no email (SERVEBENCH_EMAIL_HOST is not set)"
        )
    target = target or user.email
    try:
        validate_email(target)
    except ValidationError:
        raise SubscriptionError("target", f"{target[:80]!r} is not an email address") from None
    domain = target.rpartition("@")[2].lower()
    own = (user.email or "").lower()
    if target.lower() != own and domain not in settings.SERVEBENCH_ALERT_EMAIL_DOMAINS:
        allowed = ", ".join(settings.SERVEBENCH_ALERT_EMAIL_DOMAINS) or "none"
        raise SubscriptionError(
            "target",
            f"alerts mail your own address ({own or 'none on your account'}) or one in an "
            f"allowed domain ({allowed}; SERVEBENCH_ALERT_EMAIL_DOMAINS)",
            403,
        )
    return target


def subscribe(
    user: Any,
    *,
    label: str,
    channel: str,
    target: str = "",
    owner: str = "",
    fingerprint: str = "",
) -> Subscribed:
    """Store a subscription of ``user`` (SubscriptionError naming the field otherwise)."""
    try:
        label = baselines.validate_label(label)
    except baselines.BaselineError as exc:
        raise SubscriptionError("label", exc.message) from None
    if channel not in Channel.values:
        raise SubscriptionError("channel", choice_message(channel, Channel.values, "channel"))
    fingerprint = (fingerprint or "").strip()
    if fingerprint and not _FINGERPRINT.match(fingerprint):
        raise SubscriptionError("fingerprint", "a fingerprint is 64 lowercase hex digits")
    series_owner = _series_owner(user, owner)
    if series_owner.pk != user.pk:
        visible = Baseline.objects.filter(
            label=label, run__owner=series_owner, run__in=queries.visible_runs(user)
        )
        if fingerprint:
            visible = visible.filter(run__fingerprint=fingerprint)
        if not visible.exists():
            raise SubscriptionError(
                "label",
                f"no run of {series_owner.get_username()}'s labelled {label!r} that you can "
                "see; subscribe to your own series, or to one with public runs",
                404,
            )
    if Subscription.objects.filter(user=user).count() >= MAX_PER_USER:
        raise SubscriptionError("label", f"at most {MAX_PER_USER} subscriptions per user", 409)
    target = _check_target(user, channel, target)
    salt = signing.new_salt() if channel == Channel.WEBHOOK else ""
    subscription = Subscription.objects.create(
        user=user,
        series_owner=series_owner,
        label=label,
        fingerprint=fingerprint,
        channel=channel,
        target=target,
        secret_salt=salt,
    )
    return Subscribed(subscription, signing.signing_secret(salt) if salt else None)


def mine(user: Any) -> QuerySet[Subscription]:
    return Subscription.objects.filter(user=user).select_related("series_owner")


def get_mine(user: Any, public_id: str) -> Subscription:
    """The user's subscription ``public_id`` (staff: anyone's); DoesNotExist otherwise."""
    found = Subscription.objects.select_related("series_owner", "user")
    if not (user.is_staff or user.is_superuser):
        found = found.filter(user=user)
    return found.get(public_id=public_id)


def unsubscribe(user: Any, public_id: str) -> bool:
    try:
        subscription = get_mine(user, public_id)
    except Subscription.DoesNotExist:
        return False
    subscription.delete()
    return True


def recent_deliveries(user: Any, limit: int = 50) -> QuerySet[Delivery]:
    return (
        Delivery.objects.filter(subscription__user=user)
        .select_related("subscription", "run")
        .defer("payload")
        .order_by("-created_at")[:limit]
    )

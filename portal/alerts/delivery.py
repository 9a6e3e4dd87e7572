"""Sending one delivery: a signed webhook, a Slack-compatible webhook, or an email.

``attempt(delivery_id)`` makes one try and records it on the row:

- **delivered**: a 2xx answer (the mail server accepted the message).
- **retry** (``Transient``): no answer, a timeout, 408, 429 or a 5xx, a mail server that
  was unreachable. The task retries after ``backoff(attempt)``: exponential from
  ``SERVEBENCH_WEBHOOK_RETRY_SECONDS`` (30 s),
  capped at 10 minutes, with jitter (a receiver that comes back is not hit by every
  queued delivery at once), up to ``SERVEBENCH_WEBHOOK_ATTEMPTS`` tries; then failed.
- **failed**: a destination the allow-list refuses now (``egress.Refused``), a redirect
  (never followed), any other 4xx, a refused recipient. Retrying would not help.

Bodies: the webhook gets the delivery's JSON payload (``event``, ``series``, ``run``,
``previous``, ``compare_url``, ``verdicts``, ``worse``, ``text``) with the signature
headers of ``portal.alerts.signing``; the Slack-compatible one gets ``{"text": ...}``;
email gets the text. The payload is stored with the delivery, so every retry sends the
same body under the same delivery id.
"""

from __future__ import annotations

import json
import logging
import random
import smtplib
from datetime import timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.utils import timezone

from portal.alerts import egress, signing
from portal.alerts.models import Channel, Delivery, DeliveryStatus

log = logging.getLogger(__name__)

USER_AGENT = "servebench-alerts/1"
# Below the broker's visibility timeout (SERVEBENCH_BROKER_VISIBILITY_TIMEOUT, 900 s): a
# retry waiting longer would be delivered twice.
MAX_DELAY = 600.0


class Transient(Exception):
    """The destination did not take it this time; try again later."""


class Permanent(Exception):
    """The destination will not take it; do not retry."""


def backoff(attempt: int, rng: random.Random | None = None) -> float:
    """Seconds before retry number ``attempt`` (1 = the first retry): drawn between half
    and all of an exponential ceiling (jitter, so receivers are not hit all at once)."""
    first = float(settings.SERVEBENCH_WEBHOOK_RETRY_SECONDS)
    ceiling = min(MAX_DELAY, first * (2 ** max(0, attempt - 1)))
    return (rng or random).uniform(ceiling / 2, ceiling)


def _webhook(delivery: Delivery) -> int:
    sub = delivery.subscription
    if delivery.channel == Channel.SLACK:
        body = json.dumps({"text": delivery.payload.get("text", "")}).encode()
        headers = {"X-Servebench-Delivery": str(delivery.pk)}
    else:
        body = json.dumps(
            {**delivery.payload, "delivery": str(delivery.pk)}, separators=(",", ":")
        ).encode()
        secret = signing.signing_secret(sub.secret_salt)
        headers = signing.headers(secret, str(delivery.pk), delivery.event, body)
    headers |= {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    try:
        answer = egress.post(sub.target, body, headers, settings.SERVEBENCH_WEBHOOK_TIMEOUT)
    except egress.Refused as exc:
        raise Permanent(str(exc)) from None
    except Exception as exc:  # OSError, urllib3's errors: no answer
        raise Transient(f"no answer: {type(exc).__name__}: {exc}") from None
    status = answer.status
    if 200 <= status < 300:
        return status
    detail = f"HTTP {status}" + (f": {answer.body[:200].strip()}" if answer.body.strip() else "")
    if 300 <= status < 400:
        raise Permanent(f"{detail}; redirects are not followed (point the URL at the final place)")
    if status in (408, 429) or status >= 500:
        raise Transient(detail)
    raise Permanent(detail)


def _email(delivery: Delivery) -> int:
    payload = delivery.payload
    subject = {
        "regression": "servebench: regression in {series}",
        "schedule_refused": "servebench: a scheduled run of {series} was refused",
    }.get(delivery.event, "servebench: {series}")
    series = payload.get("series") or {}
    name = f"{series.get('owner', '?')}:{series.get('label', '?')}"
    try:
        send_mail(
            subject.format(series=name)[:200],
            payload.get("text", ""),
            settings.DEFAULT_FROM_EMAIL,
            [delivery.subscription.target],
        )
    except (smtplib.SMTPRecipientsRefused, smtplib.SMTPSenderRefused) as exc:
        raise Permanent(f"the mail server refused it: {exc}") from None
    except (OSError, smtplib.SMTPException) as exc:
        raise Transient(f"mail not sent: {type(exc).__name__}: {exc}") from None
    return 250


def attempt(delivery_id: str) -> str:
    """One try of a pending delivery: ``delivered``, ``retry``, ``failed`` or ``gone``
    (not pending any more: delivered by a duplicate task, or deleted)."""
    delivery = (
        Delivery.objects.select_related("subscription")
        .filter(pk=delivery_id, status=DeliveryStatus.PENDING)
        .first()
    )
    if delivery is None:
        return "gone"
    tries = delivery.attempts + 1
    # Taken by this try (a duplicate task that read the same row finds nothing to update).
    if not Delivery.objects.filter(
        pk=delivery.pk, status=DeliveryStatus.PENDING, attempts=delivery.attempts
    ).update(attempts=tries, next_attempt_at=timezone.now() + timedelta(minutes=15)):
        return "gone"
    now = timezone.now()
    try:
        sent = _email(delivery) if delivery.channel == Channel.EMAIL else _webhook(delivery)
    except Transient as exc:
        if tries >= settings.SERVEBENCH_WEBHOOK_ATTEMPTS:
            _record(delivery, DeliveryStatus.FAILED, f"gave up after {tries} tries: {exc}")
            return "failed"
        delay = backoff(tries)
        Delivery.objects.filter(pk=delivery.pk).update(
            last_error=str(exc)[:2000], next_attempt_at=now + timedelta(seconds=delay)
        )
        log.info("alerts: delivery %s try %d: %s; again in %.0f s", delivery.pk, tries, exc, delay)
        raise Retry(delay) from None
    except Permanent as exc:
        _record(delivery, DeliveryStatus.FAILED, str(exc))
        return "failed"
    _record(delivery, DeliveryStatus.DELIVERED, "", sent)
    return "delivered"


class Retry(Exception):
    """Raised by ``attempt`` so the task retries after ``delay`` seconds."""

    def __init__(self, delay: float):
        super().__init__(f"retry in {delay:.0f} s")
        self.delay = delay


def _record(delivery: Delivery, status: str, error: str, response: int | None = None) -> None:
    now = timezone.now()
    Delivery.objects.filter(pk=delivery.pk).update(
        status=status,
        last_error=error[:2000],
        response_status=response if delivery.channel != Channel.EMAIL else None,
        delivered_at=now if status == DeliveryStatus.DELIVERED else None,
    )
    log.info("alerts: delivery %s %s%s", delivery.pk, status, f": {error}" if error else "")

"""Alerts: a new run of a labelled series judged worse than the previous one notifies the
series' subscribers, through a real local webhook receiver, a real SMTP server and a real
Celery worker with beat; webhook destinations pass the admin's allow-list, never an
internal address, and a redirect is never followed."""

from __future__ import annotations

import json
from typing import Any

import pytest
import webdata
from django.test import Client
from receivers import SMTPReceiver, WebhookReceiver

from portal.alerts import delivery, egress, evaluate, signing
from portal.alerts.models import Delivery, DeliveryStatus, SeriesCheck, Subscription
from portal.benchmarks import baselines
from portal.benchmarks.models import Run

SUBS = "/api/v1/alerts/subscriptions/"


@pytest.fixture
def receiver() -> Any:
    found = WebhookReceiver().start()
    yield found
    found.stop()


@pytest.fixture
def webhooks(settings: Any, receiver: WebhookReceiver) -> WebhookReceiver:
    """The receiver's host allowed, loopback included (an internal address: the admin's
    explicit choice here, off by default)."""
    settings.SERVEBENCH_WEBHOOK_HOSTS = ["127.0.0.1"]
    settings.SERVEBENCH_WEBHOOK_ALLOW_PRIVATE = True
    settings.SERVEBENCH_WEBHOOK_RETRY_SECONDS = 1
    return receiver


def subscribe(client: Client, **body: Any) -> Any:
    return client.post(SUBS, json.dumps(body), content_type="application/json")


def labelled(owner: Any, peak: float, seed: int, label: str = "main", public: bool = False) -> Run:
    """A finished run of the series (three repeats: the verdict engine measures the noise)."""
    run = webdata.make_sweep_run(owner, [1, 4], peak=peak, seed=seed, repeats=3, public=public)
    baselines.mark(run, owner, label)
    return run


def only_delivery() -> Delivery:
    (found,) = Delivery.objects.select_related("subscription")
    return found


@pytest.mark.django_db
def test_a_regression_reaches_the_webhook_signed_once(personas, webhooks):
    owner = personas["owner"]
    made = subscribe(owner.client, label="main", channel="webhook", target=webhooks.url())
    assert made.status_code == 201, made.content
    secret = made.json()["secret"]
    assert secret.startswith("whsec_")
    assert "secret" not in owner.client.get(SUBS).json()[0]  # shown once
    good = labelled(owner.user, peak=2000, seed=3)
    bad = labelled(owner.user, peak=1000, seed=4)

    report = evaluate.scan()
    assert sorted(report["judged"]) == sorted(
        [f"{good.public_id}:main:first", f"{bad.public_id}:main:worse"]
    )
    check = SeriesCheck.objects.get(run=bad)
    assert check.reference_id == good.pk and check.counts["worse"] >= 1
    found = only_delivery()
    assert delivery.attempt(str(found.pk)) == "delivered"

    (request,) = webhooks.requests
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert headers["x-servebench-event"] == "regression"
    assert headers["x-servebench-delivery"] == str(found.pk)
    assert signing.verify(
        secret, request.body, headers["x-servebench-timestamp"], headers["x-servebench-signature"]
    )
    assert not signing.verify("whsec_other", request.body, headers["x-servebench-timestamp"],
                              headers["x-servebench-signature"])  # fmt: skip
    body = json.loads(request.body)
    assert body["delivery"] == str(found.pk) and body["event"] == "regression"
    assert body["run"]["id"] == bad.public_id and body["previous"]["id"] == good.public_id
    assert body["series"] == {"owner": "owner", "label": "main", "fingerprint": bad.fingerprint}
    assert body["verdicts"]["worse"] >= 1
    assert {row["metric"] for row in body["worse"]} & {"output_throughput", "request_throughput"}
    assert f"runs={good.public_id},{bad.public_id}" in body["compare_url"]
    # Judged once: a second scan (or a second beat) finds nothing to do.
    assert evaluate.scan()["judged"] == []
    assert Delivery.objects.count() == 1


@pytest.mark.django_db
def test_a_run_no_worse_than_the_last_alerts_nobody(personas, webhooks):
    owner = personas["owner"]
    subscribe(owner.client, label="main", channel="webhook", target=webhooks.url())
    labelled(owner.user, peak=1000, seed=3)
    better = labelled(owner.user, peak=2000, seed=4)
    evaluate.scan()
    assert SeriesCheck.objects.get(run=better).verdict == "ok"
    assert not Delivery.objects.exists()


@pytest.mark.django_db
def test_a_failing_receiver_is_retried_with_backoff_under_one_delivery_id(personas, webhooks):
    webhooks.answers = [(503, {}), (200, {})]
    owner = personas["owner"]
    subscribe(owner.client, label="main", channel="webhook", target=webhooks.url())
    labelled(owner.user, peak=2000, seed=3)
    labelled(owner.user, peak=1000, seed=4)
    evaluate.scan()
    found = only_delivery()
    with pytest.raises(delivery.Retry) as wait:
        delivery.attempt(str(found.pk))
    assert 0.5 <= wait.value.delay <= 1.0  # the first retry: jitter over 1 s
    found.refresh_from_db()
    assert (found.status, found.attempts, found.last_error) == ("pending", 1, "HTTP 503: ok")
    assert delivery.attempt(str(found.pk)) == "delivered"
    first, second = webhooks.requests
    assert first.body == second.body
    assert first.headers["X-Servebench-Delivery"] == second.headers["X-Servebench-Delivery"]
    assert delivery.attempt(str(found.pk)) == "gone"  # a duplicate task sends nothing
    assert [delivery.backoff(n) <= min(600, 2 ** (n - 1)) for n in range(1, 12)] == [True] * 11


@pytest.mark.django_db
def test_a_redirect_is_never_followed(personas, webhooks):
    elsewhere = f"http://127.0.0.1:{webhooks.port}/elsewhere"
    webhooks.answers = [(302, {"Location": elsewhere})]
    owner = personas["owner"]
    subscribe(owner.client, label="main", channel="slack", target=webhooks.url())
    labelled(owner.user, peak=2000, seed=3)
    labelled(owner.user, peak=1000, seed=4)
    evaluate.scan()
    found = only_delivery()
    assert delivery.attempt(str(found.pk)) == "failed"
    found.refresh_from_db()
    assert "redirects are not followed" in found.last_error
    (request,) = webhooks.requests  # nothing went to the Location
    assert request.path == "/hook"
    assert set(json.loads(request.body)) == {"text"}  # Slack-compatible: a text body
    assert "is worse than the previous run" in json.loads(request.body)["text"]


@pytest.mark.django_db
def test_webhooks_go_only_where_the_admin_allows(personas, settings):
    settings.SERVEBENCH_WEBHOOK_HOSTS = ["hooks.example.com", "127.0.0.1", "localhost"]
    settings.SERVEBENCH_WEBHOOK_ALLOW_PRIVATE = False
    owner = personas["owner"].client
    refused = subscribe(owner, label="main", channel="webhook", target="https://evil.example/x")
    assert refused.status_code == 400
    assert refused.json()["error"]["field"] == "target"
    assert "SERVEBENCH_WEBHOOK_HOSTS" in refused.json()["error"]["message"]
    internal = subscribe(owner, label="main", channel="webhook", target="http://127.0.0.1:9/x")
    assert internal.status_code == 400 and "internal address" in internal.json()["error"]["message"]
    for url in (
        "http://user:pw@hooks.example.com/x",
        "ftp://hooks.example.com/x",
        "http://hooks.example.com/x\r\nHost: evil",
        "http://169.254.169.254/latest/meta-data",
    ):
        with pytest.raises(egress.Refused):
            egress.check_url(url)
    # A name is checked at send time, every address it resolves to: localhost is loopback.
    target = egress.check_url("http://localhost:9/x")
    with pytest.raises(egress.Refused, match="internal address"):
        egress.resolve(target)


@pytest.mark.django_db
def test_who_may_subscribe_to_whose_series(personas, webhooks):
    owner, other, anon = personas["owner"], personas["other"], personas["anon"]
    run = labelled(owner.user, peak=2000, seed=3)
    body = {"label": "main", "channel": "webhook", "target": webhooks.url(), "owner": "owner"}
    assert subscribe(owner.client, **body).status_code == 201
    assert subscribe(other.client, **body).status_code == 404  # private runs: no series seen
    assert subscribe(anon.client, **body).status_code == 401
    Run.objects.filter(pk=run.pk).update(is_public=True)
    teammate = subscribe(other.client, **body)
    assert teammate.status_code == 201
    sub_id = teammate.json()["id"]
    assert other.client.get(f"{SUBS}{sub_id}/").status_code == 200
    assert owner.client.get(f"{SUBS}{sub_id}/").status_code == 404  # not theirs
    assert owner.client.delete(f"{SUBS}{sub_id}/").status_code == 404
    assert [s["owner"] for s in other.client.get(SUBS).json()] == ["owner"]
    assert other.client.get("/api/v1/alerts/deliveries/").json() == []
    assert other.client.delete(f"{SUBS}{sub_id}/").status_code == 204
    assert not Subscription.objects.filter(public_id=sub_id).exists()


@pytest.mark.django_db
def test_a_private_regression_reaches_only_who_may_read_it(personas, webhooks):
    owner, other = personas["owner"], personas["other"]
    first = labelled(owner.user, peak=2000, seed=3, public=True)
    subscribe(owner.client, label="main", channel="webhook", target=webhooks.url())
    made = subscribe(other.client, label="main", channel="webhook", target=webhooks.url(),
                     owner="owner")  # fmt: skip
    assert made.status_code == 201
    assert first.is_public
    labelled(owner.user, peak=1000, seed=4, public=False)  # the regression is private
    evaluate.scan()
    assert [d.subscription.user.username for d in Delivery.objects.all()] == ["owner"]


@pytest.mark.django_db
def test_email_alerts_go_through_a_real_smtp_server(personas, settings):
    mail = SMTPReceiver().start()
    try:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", mail.port
        owner = personas["owner"]
        owner.user.email = "owner@team.example"
        owner.user.save()
        foreign = subscribe(owner.client, label="main", channel="email", target="x@else.example")
        assert foreign.status_code == 403
        settings.SERVEBENCH_ALERT_EMAIL_DOMAINS = ["team.example"]
        assert subscribe(owner.client, label="main", channel="email").status_code == 201
        assert (
            subscribe(
                owner.client, label="main", channel="email", target="perf@team.example"
            ).status_code
            == 201
        )
        labelled(owner.user, peak=2000, seed=3)
        labelled(owner.user, peak=1000, seed=4)
        evaluate.scan()
        for found in Delivery.objects.all():
            assert delivery.attempt(str(found.pk)) == "delivered"
        assert sorted(m.recipients[0] for m in mail.box) == [
            "owner@team.example",
            "perf@team.example",
        ]
        assert "Subject: servebench: regression in owner:main" in mail.box[0].data
        assert "is worse than the previous run" in mail.box[0].data
    finally:
        mail.stop()


@pytest.mark.django_db
def test_the_alerts_page_lists_adds_and_removes(personas, webhooks):
    owner = personas["owner"]
    browser = Client()
    browser.force_login(owner.user)
    page = browser.get("/alerts/")
    assert page.status_code == 200 and "No subscriptions yet." in page.content.decode()
    made = browser.post(
        "/alerts/", {"label": "main", "channel": "webhook", "target": webhooks.url()}
    )
    text = made.content.decode()
    assert made.status_code == 200 and 'id="new-secret"' in text and "whsec_" in text
    assert made["Cache-Control"].startswith("max-age=0") or "no-store" in made["Cache-Control"]
    refused = browser.post(
        "/alerts/", {"label": "main", "channel": "webhook", "target": "http://x.example/"}
    )
    assert refused.status_code == 400 and "SERVEBENCH_WEBHOOK_HOSTS" in refused.content.decode()
    labelled(owner.user, peak=2000, seed=3)
    labelled(owner.user, peak=1000, seed=4)
    evaluate.scan()
    listed = browser.get("/alerts/").content.decode()
    assert 'id="deliveries"' in listed and "regression" in listed and "Pending" in listed
    assert "whsec_" not in listed
    sub = Subscription.objects.get()
    browser.post("/alerts/", {"remove": sub.public_id})
    assert not Subscription.objects.exists()
    assert Client().get("/alerts/").status_code == 302  # sign in first


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_the_worker_and_beat_judge_and_deliver_with_retries(
    personas, webhooks, celery_worker, waiter
):
    webhooks.answers = [(500, {}), (200, {})]
    owner = personas["owner"]
    subscribe(owner.client, label="nightly", channel="webhook", target=webhooks.url())
    good = labelled(owner.user, peak=2000, seed=3, label="nightly")
    bad = labelled(owner.user, peak=1000, seed=4, label="nightly")
    celery_worker(
        beat=True,
        extra_env={
            "SERVEBENCH_TICK_SECONDS": "1",
            "SERVEBENCH_WEBHOOK_HOSTS": "127.0.0.1",
            "SERVEBENCH_WEBHOOK_ALLOW_PRIVATE": "1",
            "SERVEBENCH_WEBHOOK_RETRY_SECONDS": "1",
        },
    )

    def delivered() -> Delivery | None:
        found = Delivery.objects.filter(status=DeliveryStatus.DELIVERED).first()
        return found

    found = waiter(delivered, 120, "the regression's delivery")
    assert found.run_id == bad.pk and found.attempts == 2
    assert len(webhooks.requests) == 2
    assert json.loads(webhooks.requests[1].body)["previous"]["id"] == good.public_id
    assert SeriesCheck.objects.filter(run=bad, verdict="worse").count() == 1

"""Alerts in the REST API (rules in ``portal.alerts.subscriptions``).

- ``GET /api/v1/alerts/subscriptions/``: yours. ``POST`` ``{"label": "main", "channel":
  "webhook", "target": "https://..."}`` (optional ``owner``, ``fingerprint``): 201 with
  the webhook's signing ``secret``, shown this once. 400 naming the field, 403 a target
  the portal may not reach or mail, 404 another user's series you cannot see.
- ``GET`` / ``DELETE /api/v1/alerts/subscriptions/{id}/``: yours only (404 otherwise).
- ``GET /api/v1/alerts/deliveries/``: your recent deliveries and their state.
- ``GET /api/v1/quota/``: your fair-use limits and what you use of them.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.accounts import quotas
from portal.alerts import subscriptions as subs
from portal.alerts.models import Channel, Delivery, Subscription
from portal.api.errors import ApiError
from portal.api.parsers import JSONParser


class SubscriptionRequest(serializers.Serializer):
    label = serializers.CharField(max_length=100, help_text="The series' label (e.g. main).")
    channel = serializers.ChoiceField(choices=Channel.choices)
    target = serializers.CharField(
        max_length=500, required=False, help_text="Webhook URL, or email (default: yours)."
    )
    owner = serializers.CharField(
        max_length=150, required=False, help_text="Whose series: 'me' (default) or a username."
    )
    fingerprint = serializers.CharField(
        max_length=64, required=False, help_text="One series only (default: every series)."
    )


class SubscriptionSerializer(serializers.Serializer):
    id = serializers.CharField()
    owner = serializers.CharField(help_text="Whose series.")
    label = serializers.CharField()
    fingerprint = serializers.CharField()
    channel = serializers.CharField()
    target = serializers.CharField()
    enabled = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    secret = serializers.CharField(
        required=False, help_text="The webhook's signing secret: in the 201 answer only."
    )


class DeliverySerializer(serializers.Serializer):
    id = serializers.CharField()
    subscription = serializers.CharField()
    event = serializers.CharField()
    channel = serializers.CharField()
    run = serializers.CharField(allow_null=True)
    status = serializers.CharField()
    attempts = serializers.IntegerField()
    last_error = serializers.CharField()
    created_at = serializers.DateTimeField()
    delivered_at = serializers.DateTimeField(allow_null=True)


class QuotaSerializer(serializers.Serializer):
    active_runs = serializers.IntegerField()
    active_limit = serializers.IntegerField(allow_null=True)
    gpu_hours = serializers.FloatField(help_text="GPU-hours charged in the last 24 hours.")
    gpu_hours_limit = serializers.IntegerField(allow_null=True)
    priority = serializers.IntegerField()


def subscription_row(sub: Subscription, secret: str | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": sub.public_id,
        "owner": sub.series_owner.get_username(),
        "label": sub.label,
        "fingerprint": sub.fingerprint,
        "channel": sub.channel,
        "target": sub.target,
        "enabled": sub.enabled,
        "created_at": sub.created_at,
    }
    if secret:
        row["secret"] = secret
    return row


def delivery_row(d: Delivery) -> dict[str, Any]:
    return {
        "id": str(d.pk),
        "subscription": d.subscription.public_id,
        "event": d.event,
        "channel": d.channel,
        "run": d.run.public_id if d.run is not None else None,
        "status": d.status,
        "attempts": d.attempts,
        "last_error": d.last_error,
        "created_at": d.created_at,
        "delivered_at": d.delivered_at,
    }


def _error(exc: subs.SubscriptionError) -> ApiError:
    code = {403: "forbidden", 404: "not_found", 409: "conflict"}.get(exc.status, "invalid")
    return ApiError(
        exc.status, code, f"{exc.field}: {exc}", [{"field": exc.field, "message": str(exc)}]
    )


class Subscriptions(APIView):
    parser_classes = [JSONParser]
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(
        operation_id="alerts_subscriptions_list", responses=SubscriptionSerializer(many=True)
    )
    def get(self, request: Request) -> Response:
        return Response([subscription_row(s) for s in subs.mine(request.user)])

    @extend_schema(
        operation_id="alerts_subscriptions_create",
        request=SubscriptionRequest,
        responses={
            201: SubscriptionSerializer,
            403: OpenApiResponse(description="A target this portal may not reach or mail."),
            404: OpenApiResponse(description="Another user's series you cannot see."),
        },
        description=(
            "Subscribe to a labelled series: a regression of a new run (the verdict engine "
            "against the series' previous run) or a refused scheduled run is delivered to "
            "the webhook, Slack-compatible webhook or email. A webhook's signing secret is "
            "in this answer only."
        ),
    )
    def post(self, request: Request) -> Response:
        body = SubscriptionRequest(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            made = subs.subscribe(request.user, **body.validated_data)
        except subs.SubscriptionError as exc:
            raise _error(exc) from None
        return Response(subscription_row(made.subscription, made.secret), status=201)


class SubscriptionDetail(APIView):
    permission_classes = [permissions.IsAuthenticated]

    def _get(self, request: Request, public_id: str) -> Subscription:
        try:
            return subs.get_mine(request.user, public_id)
        except Subscription.DoesNotExist:
            raise ApiError(
                404, "not_found", f"no subscription {public_id[:20]!r} of yours"
            ) from None

    @extend_schema(operation_id="alerts_subscriptions_retrieve", responses=SubscriptionSerializer)
    def get(self, request: Request, public_id: str) -> Response:
        return Response(subscription_row(self._get(request, public_id)))

    @extend_schema(operation_id="alerts_subscriptions_destroy", responses={204: None})
    def delete(self, request: Request, public_id: str) -> Response:
        self._get(request, public_id).delete()
        return Response(status=204)


class Deliveries(APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(operation_id="alerts_deliveries_list", responses=DeliverySerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response([delivery_row(d) for d in subs.recent_deliveries(request.user)])


class Quota(APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(
        operation_id="quota_retrieve",
        responses=QuotaSerializer,
        description="Your fair-use limits (null: none) and what you use of them now.",
    )
    def get(self, request: Request) -> Response:
        return Response(quotas.summary(request.user))

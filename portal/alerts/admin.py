"""Django admin: subscriptions, deliveries (their state and errors) and series checks."""

from django.contrib import admin

from portal.alerts.models import Delivery, SeriesCheck, Subscription


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ("public_id", "user", "series_owner", "label", "channel", "target", "enabled")
    list_filter = ("channel", "enabled")
    search_fields = ("user__username", "series_owner__username", "label", "target")
    list_select_related = ("user", "series_owner")
    raw_id_fields = ("user", "series_owner")
    readonly_fields = ("public_id", "secret_salt", "created_at")


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ("id", "event", "channel", "status", "attempts", "created_at", "delivered_at")
    list_filter = ("status", "channel", "event")
    raw_id_fields = ("subscription", "run")
    readonly_fields = ("id", "dedupe_key", "payload", "created_at")


@admin.register(SeriesCheck)
class SeriesCheckAdmin(admin.ModelAdmin):
    list_display = ("run", "label", "verdict", "reference", "checked_at")
    list_filter = ("verdict",)
    raw_id_fields = ("run", "reference")

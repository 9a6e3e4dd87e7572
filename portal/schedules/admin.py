"""Django admin: schedules (pause, inspect) and their firings."""

from django.contrib import admin

from portal.schedules.models import Firing, Schedule


class FiringInline(admin.TabularInline):
    model = Firing
    extra = 0
    raw_id_fields = ("run",)
    readonly_fields = ("due_at", "fired_at", "run", "refusal")
    can_delete = False


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "label", "cadence", "next_run_at", "enabled", "last_error")
    list_filter = ("enabled", "cadence")
    search_fields = ("name", "owner__username", "label")
    list_select_related = ("owner",)
    raw_id_fields = ("owner", "last_run")
    readonly_fields = ("public_id", "created_at", "last_fired_at")
    inlines = [FiringInline]

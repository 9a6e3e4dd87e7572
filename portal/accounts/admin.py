"""Django admin: API tokens (revoke, fair-use overrides), and per-user quotas and
priorities (on the user's own page, and as a list)."""

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin

from portal.accounts.models import ApiToken, Quota
from portal.accounts.tokens import revoke_token


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = (
        "__str__",
        "user",
        "kind",
        "run",
        "priority",
        "max_active_runs",
        "gpu_hours_per_day",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("kind",)
    search_fields = ("user__username", "name", "lookup")
    list_select_related = ("user", "run")
    raw_id_fields = ("user", "run")
    # Tokens are issued by createtoken / the web page (plaintext shown once), never typed in.
    readonly_fields = ("kind", "lookup", "digest", "created_at", "last_used_at")
    fieldsets = (
        (None, {"fields": ("user", "name", "kind", "run", "lookup", "digest")}),
        (
            "Fair use (empty: SERVEBENCH_QUOTA_TOKEN_* and the owner's priority)",
            {"fields": ("priority", "max_active_runs", "gpu_hours_per_day")},
        ),
        ("Lifetime", {"fields": ("created_at", "last_used_at", "expires_at", "revoked_at")}),
    )
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        count = sum(revoke_token(token) for token in queryset)
        self.message_user(request, f"Revoked {count} token(s).")


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = (
        "user",
        "priority",
        "max_active_runs",
        "gpu_hours_per_day",
        "unlimited",
        "note",
    )
    list_editable = ("priority", "max_active_runs", "gpu_hours_per_day", "unlimited")
    search_fields = ("user__username", "note")
    list_select_related = ("user",)
    raw_id_fields = ("user",)


class QuotaInline(admin.StackedInline):
    model = Quota
    can_delete = True
    max_num = 1
    verbose_name_plural = "Fair use (empty limits: SERVEBENCH_QUOTA_* defaults)"


User = get_user_model()
if admin.site.is_registered(User):
    _base = type(admin.site._registry[User])
    admin.site.unregister(User)
else:  # pragma: no cover - auth's admin is always registered first (INSTALLED_APPS)
    _base = UserAdmin


@admin.register(User)
class UserWithQuotaAdmin(_base):  # type: ignore[valid-type, misc]
    inlines = [*getattr(_base, "inlines", ()), QuotaInline]

from django.contrib import admin

from portal.accounts.models import ApiToken
from portal.accounts.tokens import revoke_token


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("__str__", "user", "kind", "run", "created_at", "last_used_at", "revoked_at")
    list_filter = ("kind",)
    search_fields = ("user__username", "name", "lookup")
    list_select_related = ("user", "run")
    raw_id_fields = ("user", "run")
    # Tokens are issued by createtoken / the web page (plaintext shown once), never typed in.
    readonly_fields = ("kind", "lookup", "digest", "created_at", "last_used_at")
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        count = sum(revoke_token(token) for token in queryset)
        self.message_user(request, f"Revoked {count} token(s).")

from django.contrib import admin

from portal.benchmarks import lifecycle
from portal.benchmarks.models import Baseline, Environment, Measurement, Run


class MeasurementInline(admin.TabularInline):
    model = Measurement
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ("backend", "point_key", "repeat", "status", "output_throughput", "p99_ttft_ms")
    readonly_fields = fields
    exclude = ()

    def get_queryset(self, request):
        return super().get_queryset(request).defer(*Measurement.HEAVY_FIELDS)

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("public_id", "name", "owner", "status", "model_id", "gpu_name", "created_at")
    list_filter = ("status", "is_public", "gpu_name")
    search_fields = ("public_id", "name", "model_id", "owner__username")
    list_select_related = ("owner",)
    date_hierarchy = "created_at"
    raw_id_fields = ("owner",)
    readonly_fields = (
        "public_id",
        "status",
        "created_at",
        "updated_at",
        "dispatched_at",
        "started_at",
        "finished_at",
        "deadline",
        "executor",
        "executor_handle",
        "fingerprint",
    )
    inlines = [MeasurementInline]
    actions = ["cancel"]

    @admin.action(description="Cancel the selected runs")
    def cancel(self, request, queryset):
        count = sum(lifecycle.cancel_run(run, by=request.user) for run in queryset)
        self.message_user(request, f"Cancelled {count} run(s).")


@admin.register(Measurement)
class MeasurementAdmin(admin.ModelAdmin):
    list_display = ("run", "backend", "point_key", "repeat", "status", "output_throughput")
    list_filter = ("backend_kind", "status")
    search_fields = ("run__public_id", "backend", "point_key")
    list_select_related = ("run",)
    raw_id_fields = ("run",)


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ("run", "gpu_name", "gpu_count", "vllm_version", "torch_version", "captured_at")
    search_fields = ("run__public_id", "gpu_name")
    list_select_related = ("run",)
    raw_id_fields = ("run",)


@admin.register(Baseline)
class BaselineAdmin(admin.ModelAdmin):
    list_display = ("label", "run", "set_by", "set_at")
    list_filter = ("label",)
    search_fields = ("label", "run__public_id", "run__fingerprint")
    list_select_related = ("run", "set_by")
    raw_id_fields = ("run", "set_by")

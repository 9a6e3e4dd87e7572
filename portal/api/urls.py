"""/api/v1/ routes."""

from django.urls import path
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerSplitView,
)

from portal.api import (
    alert_views,
    baseline_views,
    compare_views,
    logs_views,
    runner_views,
    schedule_views,
    views,
)

app_name = "api"

urlpatterns = [
    path("runs/", views.RunListCreate.as_view(), name="runs"),
    path("runs/resolve", baseline_views.ResolveRun.as_view(), name="run-resolve"),
    path("runs/<str:public_id>/", views.RunDetail.as_view(), name="run"),
    path("runs/<str:public_id>/result", views.RunResult.as_view(), name="run-result"),
    path("runs/<str:public_id>/spec", views.RunSpec.as_view(), name="run-spec"),
    path("runs/<str:public_id>/cancel", views.RunCancel.as_view(), name="run-cancel"),
    path("runs/<str:public_id>/labels", baseline_views.RunBaseline.as_view(), name="run-labels"),
    path("labels/", baseline_views.BaselineList.as_view(), name="labels"),
    # The old routes of the two above (labels were called baselines), deprecated.
    path(
        "runs/<str:public_id>/baseline",
        baseline_views.OldRunBaseline.as_view(),
        name="run-baseline",
    ),
    path("baselines/", baseline_views.OldBaselineList.as_view(), name="baselines"),
    path("runs/<str:public_id>/logs", logs_views.RunLogs.as_view(), name="run-logs"),
    path("presets/", views.Presets.as_view(), name="presets"),
    path("compare/", compare_views.Compare.as_view(), name="compare"),
    path("history/", compare_views.History.as_view(), name="history"),
    path("spec-schema/", views.SpecSchema.as_view(), name="spec-schema"),
    path("quota/", alert_views.Quota.as_view(), name="quota"),
    path("alerts/subscriptions/", alert_views.Subscriptions.as_view(), name="subscriptions"),
    path(
        "alerts/subscriptions/<str:public_id>/",
        alert_views.SubscriptionDetail.as_view(),
        name="subscription",
    ),
    path("alerts/deliveries/", alert_views.Deliveries.as_view(), name="deliveries"),
    path("schedules/", schedule_views.Schedules.as_view(), name="schedules"),
    path("schedules/<str:public_id>/", schedule_views.ScheduleDetail.as_view(), name="schedule"),
    path(
        "schedules/<str:public_id>/firings",
        schedule_views.ScheduleFirings.as_view(),
        name="schedule-firings",
    ),
    path(
        "runner/runs/<str:public_id>/events",
        runner_views.RunnerEvents.as_view(),
        name="runner-events",
    ),
    path(
        "runner/runs/<str:public_id>/measurements",
        runner_views.RunnerMeasurements.as_view(),
        name="runner-measurements",
    ),
    path(
        "runner/runs/<str:public_id>/samples",
        runner_views.RunnerSamples.as_view(),
        name="runner-samples",
    ),
    path("runs/<str:public_id>/samples", views.RunSamples.as_view(), name="run-samples"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start-up code as a script file of its own, and the
    # Redoc page is ours: no inline script, so the Content-Security-Policy holds here too.
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api:schema"), name="docs"),
    path(
        "redoc/",
        SpectacularRedocView.as_view(url_name="api:schema", template_name="web/redoc.html"),
        name="redoc",
    ),
]

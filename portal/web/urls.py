from django.contrib.auth import views as auth_views
from django.urls import path

from portal.accounts.signin import SignInView
from portal.web.views import alerts, compare, history, runs, schedules, storage, tokens

app_name = "web"

urlpatterns = [
    path("", runs.home, name="home"),
    path("login/", SignInView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="web:home"), name="logout"),
    path("runs/", runs.run_list, name="run-list"),
    path("runs/new/", runs.run_new, name="run-new"),
    path("runs/new/check", runs.run_new_check, name="run-new-check"),
    path("runs/<str:public_id>/", runs.run_detail, name="run-detail"),
    path("runs/<str:public_id>/status.json", runs.run_status, name="run-status"),
    path("runs/<str:public_id>/log.txt", runs.run_log, name="run-log"),
    path("runs/<str:public_id>/spec.yaml", runs.run_spec, name="run-spec"),
    path("runs/<str:public_id>/result.json", runs.run_result, name="run-result"),
    path("runs/<str:public_id>/points.csv", runs.run_points_csv, name="run-points-csv"),
    path("runs/<str:public_id>/points.json", runs.run_points_json, name="run-points-json"),
    path("runs/<str:public_id>/cancel/", runs.run_cancel, name="run-cancel"),
    path("runs/<str:public_id>/rerun/", runs.run_rerun, name="run-rerun"),
    path("runs/<str:public_id>/visibility/", runs.run_visibility, name="run-visibility"),
    path("runs/<str:public_id>/labels/", runs.run_labels, name="run-labels"),
    path("compare/", compare.compare_page, name="compare"),
    path("history/<str:fingerprint>/", history.history_page, name="history"),
    path("tokens/", tokens.tokens, name="tokens"),
    path("alerts/", alerts.alerts_page, name="alerts"),
    path("schedules/", schedules.schedule_list, name="schedules"),
    path("schedules/<str:public_id>/", schedules.schedule_detail, name="schedule"),
    path("schedules/<str:public_id>/action", schedules.schedule_action, name="schedule-action"),
    path("staff/storage/", storage.storage_page, name="storage"),
]

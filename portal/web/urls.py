from django.contrib.auth import views as auth_views
from django.urls import path

from portal.web import views

app_name = "web"

urlpatterns = [
    path("", views.home, name="home"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="web/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(next_page="web:home"), name="logout"),
    path("runs/", views.run_list, name="run-list"),
    path("runs/new/", views.run_new, name="run-new"),
    path("runs/<str:public_id>/", views.run_detail, name="run-detail"),
    path("runs/<str:public_id>/status.json", views.run_status, name="run-status"),
    path("runs/<str:public_id>/spec.yaml", views.run_spec, name="run-spec"),
    path("runs/<str:public_id>/result.json", views.run_result, name="run-result"),
    path("runs/<str:public_id>/cancel/", views.run_cancel, name="run-cancel"),
    path("tokens/", views.tokens, name="tokens"),
]

"""URL map: the API under /api/v1/, the admin, health, and the web pages at the root."""

from django.contrib import admin
from django.urls import include, path

from portal.api.views import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("api/v1/", include("portal.api.urls")),
    path("admin/", admin.site.urls),
    path("", include("portal.web.urls")),
]

# JSON errors under /api/; elsewhere the project's own pages (portal/web/templates/404.html,
# 500.html), never Django's debug page unless DEBUG is on (`make run` leaves it off).
handler400 = "portal.api.views.handler400"
handler404 = "portal.api.views.handler404"
handler500 = "portal.api.views.handler500"

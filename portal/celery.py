"""The Celery app: ``celery -A portal.celery worker`` / ``celery -A portal.celery beat``.

Configuration comes from Django settings (``CELERY_*``): Redis broker, JSON only, late
acks, no result backend, and the beat schedule table. Tasks live in
``portal.dispatch.tasks`` under explicit names (``servebench.dispatch``...); alerts,
schedules and retention in ``portal.alerts.tasks``, ``portal.schedules.tasks`` and
``portal.ops.tasks``.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("servebench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["portal.dispatch", "portal.alerts", "portal.schedules", "portal.ops"])

"""WSGI entry point: ``gunicorn portal.wsgi``."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

application = get_wsgi_application()

from portal.lib import startup  # noqa: E402 - after Django is set up

startup.settle()  # the views imported and the startup heap frozen, before any request

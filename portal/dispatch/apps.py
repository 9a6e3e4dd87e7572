from django.apps import AppConfig


class DispatchConfig(AppConfig):
    name = "portal.dispatch"
    label = "dispatch"
    verbose_name = "Dispatch"

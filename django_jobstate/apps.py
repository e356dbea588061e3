from django.apps import AppConfig
from django.core.signals import setting_changed
from django.db.backends.signals import connection_created


class JobStateConfig(AppConfig):
    name = "django_jobstate"
    verbose_name = "Background jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register the system checks.
        from . import checks, checks_mysql, checks_tasks, schedule_settings  # noqa: F401
        from .conf import reload_settings
        from .receivers import configure_sqlite

        connection_created.connect(configure_sqlite, dispatch_uid="django_jobstate.sqlite")
        setting_changed.connect(reload_settings, dispatch_uid="django_jobstate.settings")

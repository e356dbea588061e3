from django.apps import AppConfig
from django.db.backends.signals import connection_created


class JobStateConfig(AppConfig):
    name = "django_jobstate"
    verbose_name = "Background jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .receivers import configure_sqlite

        connection_created.connect(configure_sqlite, dispatch_uid="django_jobstate.sqlite")

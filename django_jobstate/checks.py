"""System checks for the settings and the TASKS configuration."""

from typing import Any

from django.core.checks import Error, register

from .conf import get_settings


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    errors = []
    conf = get_settings()
    if conf.LOST_AFTER <= conf.HEARTBEAT_INTERVAL:
        errors.append(
            Error(
                f"JOBSTATE_LOST_AFTER ({conf.LOST_AFTER}s) must be longer than "
                f"JOBSTATE_HEARTBEAT_INTERVAL ({conf.HEARTBEAT_INTERVAL}s), or every live worker "
                f"would be taken for lost.",
                hint="Make JOBSTATE_LOST_AFTER at least three heartbeat intervals.",
                id="django_jobstate.E001",
            )
        )
    if conf.POLL_INTERVAL <= 0:
        errors.append(
            Error(
                "JOBSTATE_POLL_INTERVAL must be a positive number of seconds.",
                id="django_jobstate.E002",
            )
        )
    return errors

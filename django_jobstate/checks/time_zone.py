"""The system check of the database's time zone: the times Django writes against the clock
django_jobstate compares them with (E006)."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, register
from django.db import connections, router


def _is_utc(name: str) -> bool:
    """Whether the zone `name` is UTC all year (in winter and in summer)."""
    try:
        zone = zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False  # Django refuses an unknown TIME_ZONE itself
    year = datetime.now(UTC).year
    return all(
        datetime(year, month, 1, tzinfo=zone).utcoffset() == timedelta(0) for month in (1, 7)
    )


@register()
def check_sqlite_time_zone(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """SQLite or MariaDB/MySQL with naive local times: refuse what the app cannot compare.

    These databases keep naive times, which Django writes in UTC only with USE_TZ = True
    and no DATABASES TIME_ZONE. The clock the app compares them with is UTC (SQLite's own,
    UTC_TIMESTAMP() on MariaDB/MySQL: the "now" of rescue_lost(), Run now, prune, stuck
    attempts, and the claim on MariaDB/MySQL): with local times, east of UTC a lost
    worker's attempt would never be rescued, west of it fresh rows would be pruned.
    """
    if not apps.is_installed("django_jobstate"):
        return []
    from ..models import Job

    errors: list[CheckMessage] = []
    for alias in connections:
        connection = connections[alias]
        if connection.vendor not in ("sqlite", "mysql"):
            continue
        if not router.allow_migrate_model(alias, Job):
            continue
        if not (settings.USE_TZ or _is_utc(settings.TIME_ZONE)):
            local, hint = (
                f"USE_TZ = False with TIME_ZONE = {settings.TIME_ZONE!r}",
                'Set USE_TZ = True (Django\'s default), or TIME_ZONE = "UTC".',
            )
        elif settings.USE_TZ and not _is_utc(
            zone := connection.settings_dict.get("TIME_ZONE") or "UTC"
        ):
            local, hint = (
                f"its TIME_ZONE is {zone!r}",
                f"Remove TIME_ZONE from DATABASES[{alias!r}] (Django then stores UTC), or "
                f'set it to "UTC".',
            )
        else:
            continue
        errors.append(
            Error(
                f"DATABASES[{alias!r}] is {connection.display_name}, and {local}: "
                f"django_jobstate would compare local times with the database's clock in "
                f"UTC (lost workers never rescued, fresh jobs pruned, jobs run early or late).",
                hint=hint,
                id="django_jobstate.E006",
            )
        )
    return errors

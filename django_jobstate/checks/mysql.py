"""System check of the MariaDB/MySQL form of the indexes (db/indexes.py, migration 0009)."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.checks import CheckMessage, Error, Tags, register
from django.db import DatabaseError, connections, router

MIGRATION = ("django_jobstate", "0009_mysql")
# The indexes migration 0009 creates on MariaDB/MySQL (it freezes these names).
MYSQL_INDEXES = {
    "jobstate_job_one_live_attempt",
    "jobstate_job_one_job_per_tick",
    "jobstate_job_unique_live",
    "jobstate_job_unique_queued",
    "jobstate_job_one_next_attempt",
    "jobstate_job_claim_order",
}


def missing_mysql_indexes(alias: str) -> set[str]:
    """The indexes of migration 0009 that database `alias` lacks although the migration
    is recorded as applied (a faked migration, a table restored from an older dump)."""
    from django.db.migrations.recorder import MigrationRecorder

    from ..models import Job

    connection = connections[alias]
    if (
        not MigrationRecorder(connection)
        .migration_qs.filter(app=MIGRATION[0], name=MIGRATION[1])
        .exists()
    ):
        return set()  # migrate creates them
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            [Job._meta.db_table],
        )
        return MYSQL_INDEXES - {row[0] for row in cursor.fetchall()}


@register(Tags.database)
def check_mysql_indexes(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """E017: on MariaDB/MySQL, the indexes that guarantee one live attempt per task, one
    job per tick and one live job per unique key exist (migration 0009)."""
    if not apps.is_installed("django_jobstate"):
        return []
    from ..models import Job

    found: list[CheckMessage] = []
    for alias in databases or []:
        connection = connections[alias]
        if connection.vendor != "mysql" or not router.allow_migrate_model(alias, Job):
            continue
        try:
            missing = missing_mysql_indexes(alias)
        except DatabaseError:
            continue  # no such table yet, or no database: migrate's own checks say so
        if missing:
            found.append(
                Error(
                    f"DATABASES[{alias!r}] lacks indexes of django_jobstate's migration "
                    f"0009_mysql, which is recorded as applied: {', '.join(sorted(missing))}. "
                    f"Without them the database does not guarantee one live attempt per "
                    f"task, one job per schedule tick and one live job per unique key, and "
                    f"claims lock every row they scan.",
                    hint="Run that migration for real: manage.py migrate django_jobstate "
                    "0008 --fake, then manage.py migrate django_jobstate.",
                    id="django_jobstate.E017",
                )
            )
    return found

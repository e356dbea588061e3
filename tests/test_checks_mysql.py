"""The indexes' MariaDB/MySQL form: Django's warnings that it ignores them are left out
(migration 0009 creates that form), and E017 says when that migration's indexes are
missing although it is recorded as applied."""

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection
from django.utils.module_loading import import_string

from django_jobstate.checks.mysql import MYSQL_INDEXES
from django_jobstate.models import Job, Schedule

DJANGOS = {"models.W036", "models.W037", "models.W043"}


@pytest.mark.django_db
def test_no_warning_that_an_index_is_ignored():
    found = [m for m in run_checks(databases=["default"]) if m.id in DJANGOS]
    assert found == []


@pytest.mark.django_db
def test_the_indexes_compare_and_migrate_as_djangos_own():
    for obj in [*Job._meta.indexes, *Job._meta.constraints, *Schedule._meta.indexes]:
        path, args, kwargs = obj.deconstruct()
        assert path.startswith("django.db.models."), obj
        plain = import_string(path)(*args, **kwargs)
        assert plain == obj
        assert obj == plain
    call_command("makemigrations", "django_jobstate", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "mysql", reason="migration 0009 is MySQL's")
def test_a_missing_index_of_migration_0009_is_reported():
    assert [
        m for m in run_checks(databases=["default"]) if m.id.startswith("django_jobstate")
    ] == []
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} DROP INDEX `jobstate_job_unique_live`")
    try:
        [error] = [m for m in run_checks(databases=["default"]) if m.id == "django_jobstate.E017"]
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                f"ALTER TABLE {table} ADD UNIQUE INDEX `jobstate_job_unique_live` "
                "(`mysql_unique_live_key`)"
            )
    assert "jobstate_job_unique_live" in error.msg
    assert "0009_mysql, which is recorded as applied" in error.msg
    assert "migrate django_jobstate 0008 --fake" in error.hint
    assert "jobstate_job_unique_live" in MYSQL_INDEXES

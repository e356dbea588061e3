"""On MariaDB and MySQL, drop the two indexes that only repeat the primary key.

models.py's `jobstate_job_succeeded` and `jobstate_job_failed` are partial indexes on
`-id` (one state's rows, newest first), which InnoDB, having no partial index, gets
whole: an index on `id` alone, the primary key's twin. Their plans showed it (EXPLAIN of
the admin's newest-first list of one state, 200,000 rows): the optimizer reads the
primary key backwards with or without them. They only cost each INSERT two more index
entries of the 18 it writes there. PostgreSQL and SQLite keep them: nothing to do.

They stay in the migrations' state, so that models.py and the migrations agree: a later
migration that changes either must not expect it on MariaDB/MySQL.
"""

from typing import Any

from django.db import migrations

TWINS = ["jobstate_job_succeeded", "jobstate_job_failed"]


def _table(apps: Any) -> str:
    return apps.get_model("django_jobstate", "Job")._meta.db_table


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    table = _table(apps)
    with schema_editor.connection.cursor() as cursor:
        present = schema_editor.connection.introspection.get_constraints(cursor, table)
    parts = [f"DROP INDEX `{name}`" for name in TWINS if name in present]
    if parts:
        schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} {', '.join(parts)}")


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    table = schema_editor.quote_name(_table(apps))
    parts = [f"ADD INDEX `{name}` (`id` DESC)" for name in TWINS]
    schema_editor.execute(f"ALTER TABLE {table} {', '.join(parts)}")


class Migration(migrations.Migration):
    dependencies = [("django_jobstate", "0018_workflows")]

    # Not atomic: MariaDB and MySQL cannot roll DDL back (0009's reason).
    operations = [migrations.RunPython(drop, create, atomic=False)]

"""On MariaDB and MySQL, the state columns compare byte for byte.

Their text columns take the table's collation, case-insensitive by default
(utf8mb4_unicode_ci, utf8mb4_0900_ai_ci): the CHECK constraints that keep `state`,
`failure_reason` and `unique_scope` to their values would let 'QUEUED' or 'Failed' in,
and every fence on the state would match them. With utf8mb4_bin they are refused, as on
PostgreSQL and SQLite. Other databases: nothing to do.

Django writes no collation for these fields (they have no db_collation): a later
migration that alters one of them on MySQL must put utf8mb4_bin back.
"""

from typing import Any

from django.db import migrations

# column -> its type and the rest of its definition, as 0001-0008 made them.
COLUMNS = {
    "state": ("varchar(16)", "NOT NULL DEFAULT 'queued'"),
    "failure_reason": ("varchar(16)", "NOT NULL DEFAULT ''"),
    "unique_scope": ("varchar(8)", "NULL"),
}


def modify(schema_editor: Any, collation: str) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    table = schema_editor.quote_name("django_jobstate_job")
    parts = [
        f"MODIFY `{column}` {kind} CHARACTER SET utf8mb4 COLLATE {collation} {rest}"
        for column, (kind, rest) in COLUMNS.items()
    ]
    schema_editor.execute(f"ALTER TABLE {table} {', '.join(parts)}")


def binary(apps, schema_editor):
    modify(schema_editor, "utf8mb4_bin")


def table_default(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT TABLE_COLLATION FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'django_jobstate_job'"
        )
        [(collation,)] = cursor.fetchall()
    modify(schema_editor, collation)


class Migration(migrations.Migration):
    dependencies = [("django_jobstate", "0009_mysql")]

    # Not atomic: MariaDB and MySQL cannot roll DDL back (0009).
    operations = [migrations.RunPython(binary, table_default, atomic=False)]

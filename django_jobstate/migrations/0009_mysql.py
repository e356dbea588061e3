"""On MariaDB and MySQL, the indexes that PostgreSQL and SQLite get from models.py.

InnoDB has no partial index, and Django creates neither a conditional unique constraint
nor (on MariaDB) an index on expressions there. Without them the database would no
longer guarantee one live attempt per task, one next attempt per attempt, one job per
schedule tick and one live (or queued) job per unique key, and the claim would have no
index in its order. Each conditional unique constraint becomes a unique index over a
virtual column that holds the key while the condition holds and NULL otherwise (a
unique index admits any number of NULLs), with the constraint's own name, so that an
error names it as on PostgreSQL. Other databases: nothing to do.
"""

from django.db import migrations

# The unique indexes: name -> (virtual column, its expression, further columns).
# The conditions are models.py's, frozen for this migration (uniqueness.HOLDS_KEY).
UNIQUE = {
    "jobstate_job_one_live_attempt": (
        "mysql_live_result_id",
        "IF(`finished_at` IS NULL, `result_id`, NULL)",
        [],
    ),
    "jobstate_job_one_job_per_tick": (
        "mysql_tick_schedule_name",
        "IF(`attempt` = 1, `schedule_name`, NULL)",
        ["scheduled_for"],
    ),
    "jobstate_job_unique_live": (
        "mysql_unique_live_key",
        "IF(`unique_scope` = 'live' AND `finished_at` IS NULL, `unique_key`, NULL)",
        [],
    ),
    "jobstate_job_unique_queued": (
        "mysql_unique_queued_key",
        "IF(`unique_scope` = 'queued' AND `state` = 'queued', `unique_key`, NULL)",
        [],
    ),
}
# The claim's order within a queue (managers/claim.py), state first: the index holds
# every row, and a claim reads the queued range of one queue.
CLAIM_ORDER = "jobstate_job_claim_order"
# The plain index of the foreign key to the previous attempt, once 0009 is reversed.
PREVIOUS = "jobstate_job_previous"


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    table = schema_editor.quote_name(apps.get_model("django_jobstate", "Job")._meta.db_table)
    parts = []
    for name, (column, expression, more) in UNIQUE.items():
        columns = ", ".join(f"`{c}`" for c in [column, *more])
        parts.append(f"ADD COLUMN `{column}` varchar(255) AS ({expression}) VIRTUAL")
        parts.append(f"ADD UNIQUE INDEX `{name}` ({columns})")
    # NULLs are distinct in a unique index: a plain one is the conditional one's twin (and
    # serves the foreign key to the previous attempt, in place of the index a reverse
    # migration left for it).
    parts.append("ADD UNIQUE INDEX `jobstate_job_one_next_attempt` (`previous_id`)")
    if PREVIOUS in schema_editor.connection.introspection.get_constraints(
        schema_editor.connection.cursor(), apps.get_model("django_jobstate", "Job")._meta.db_table
    ):
        parts.append(f"DROP INDEX `{PREVIOUS}`")
    parts.append(
        f"ADD INDEX `{CLAIM_ORDER}` (`state`, `queue_name`, `priority` DESC, `run_after`, `id`)"
    )
    schema_editor.execute(f"ALTER TABLE {table} {', '.join(parts)}")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    table = schema_editor.quote_name(apps.get_model("django_jobstate", "Job")._meta.db_table)
    parts = [f"DROP INDEX `{name}`" for name in [*UNIQUE, "jobstate_job_one_next_attempt"]]
    # The foreign key to the previous attempt needs an index; InnoDB dropped the one it made
    # for it when the unique index above came.
    parts.append(f"ADD INDEX `{PREVIOUS}` (`previous_id`)")
    parts.append(f"DROP INDEX `{CLAIM_ORDER}`")
    parts += [f"DROP COLUMN `{column}`" for column, _, _ in UNIQUE.values()]
    schema_editor.execute(f"ALTER TABLE {table} {', '.join(parts)}")


class Migration(migrations.Migration):
    dependencies = [("django_jobstate", "0008_schedules")]

    # Not atomic: MariaDB and MySQL cannot roll DDL back, and Django refuses DDL in a
    # transaction there.
    operations = [migrations.RunPython(create, drop, atomic=False)]

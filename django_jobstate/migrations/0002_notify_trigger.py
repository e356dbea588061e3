"""On PostgreSQL, wake listening workers whenever jobs are inserted.

A statement-level trigger: one notification per INSERT statement (a bulk enqueue sends
one), sent when the inserting transaction commits, with no extra round trip for enqueue().
Other databases have no LISTEN; their workers poll.
"""

from django.db import migrations

CHANNEL = "django_jobstate"  # django_jobstate.db.notify.CHANNEL, frozen for this migration


def create_trigger(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("django_jobstate", "Job")._meta.db_table)
    schema_editor.execute(
        f"""
        CREATE FUNCTION django_jobstate_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', '');
            RETURN NULL;
        END $$;
        CREATE TRIGGER django_jobstate_notify AFTER INSERT ON {table}
            FOR EACH STATEMENT EXECUTE FUNCTION django_jobstate_notify();
        """
    )


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("django_jobstate", "Job")._meta.db_table)
    schema_editor.execute(
        f"DROP TRIGGER IF EXISTS django_jobstate_notify ON {table}; "
        "DROP FUNCTION IF EXISTS django_jobstate_notify();"
    )


class Migration(migrations.Migration):
    dependencies = [("django_jobstate", "0001_initial")]

    operations = [migrations.RunPython(create_trigger, drop_trigger)]

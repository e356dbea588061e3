"""Fewer writes per job (issue 6): see the comments on Job's fields and indexes.

Also drops the NOTIFY trigger of 0002: JobManager now sends the notification from the
INSERT of an enqueue itself (wakeup.py); the trigger cost about 6% of a single enqueue.
"""

import django.db.models.deletion
import django.db.models.expressions
from django.db import migrations, models

CHANNEL = "django_jobstate"  # django_jobstate.db.notify.CHANNEL, frozen for this migration


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("django_jobstate", "Job")._meta.db_table)
    schema_editor.execute(
        f"DROP TRIGGER IF EXISTS django_jobstate_notify ON {table}; "
        "DROP FUNCTION IF EXISTS django_jobstate_notify();"
    )


def create_trigger(apps, schema_editor):  # as 0002 did
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


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobstate", "0002_notify_trigger"),
    ]

    operations = [
        migrations.RunPython(drop_trigger, create_trigger),
        migrations.RemoveConstraint(
            model_name="job",
            name="jobstate_job_one_live_attempt",
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="jobstate_job_runnable",
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="jobstate_job_by_state",
        ),
        migrations.AlterField(
            model_name="job",
            name="attempt",
            field=models.IntegerField(
                db_default=1, default=1, editable=False, verbose_name="attempt"
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="backend",
            field=models.CharField(
                db_default="default",
                default="default",
                max_length=100,
                verbose_name="backend alias",
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="backoff",
            field=models.FloatField(db_default=0, default=0, verbose_name="backoff (s)"),
        ),
        migrations.AlterField(
            model_name="job",
            name="error_class",
            field=models.CharField(
                blank=True, db_default="", default="", max_length=255, verbose_name="error class"
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="error_message",
            field=models.TextField(
                blank=True, db_default="", default="", verbose_name="error message"
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="failure_reason",
            field=models.CharField(
                blank=True,
                choices=[
                    ("error", "The task raised an error"),
                    ("timeout", "The task ran past its timeout"),
                    ("lost", "Its worker stopped heartbeating"),
                    ("interrupted", "Its worker was stopped mid-attempt"),
                ],
                db_default="",
                default="",
                max_length=16,
                verbose_name="failure reason",
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="max_attempts",
            field=models.SmallIntegerField(db_default=1, default=1, verbose_name="max attempts"),
        ),
        migrations.AlterField(
            model_name="job",
            name="previous",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                editable=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="django_jobstate.job",
                verbose_name="previous attempt",
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="priority",
            field=models.SmallIntegerField(db_default=0, default=0, verbose_name="priority"),
        ),
        migrations.AlterField(
            model_name="job",
            name="queue_name",
            field=models.CharField(
                db_default="default", default="default", max_length=100, verbose_name="queue"
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="state",
            field=models.CharField(
                choices=[
                    ("queued", "Queued"),
                    ("running", "Running"),
                    ("succeeded", "Succeeded"),
                    ("failed", "Failed"),
                ],
                db_default="queued",
                default="queued",
                editable=False,
                max_length=16,
                verbose_name="state",
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="traceback",
            field=models.TextField(blank=True, db_default="", default="", verbose_name="traceback"),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                django.db.models.expressions.CombinedExpression(
                    models.F("priority"), "*", models.Value(-1)
                ),
                models.F("run_after"),
                models.F("id"),
                condition=models.Q(("state", "queued")),
                name="jobstate_job_runnable",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("state", "succeeded")),
                fields=["-id"],
                name="jobstate_job_succeeded",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("state", "failed")), fields=["-id"], name="jobstate_job_failed"
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(("previous__isnull", False)),
                fields=("previous",),
                name="jobstate_job_one_next_attempt",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(("finished_at__isnull", True)),
                fields=("result_id",),
                name="jobstate_job_one_live_attempt",
            ),
        ),
    ]

"""Schedules made in the admin: Schedule.origin ("settings" for every row that exists, which
sync() wrote), and the definition columns editable in the admin's form (no SQL: editable,
blank and help texts are not in the schema)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_jobstate', '0012_workerheartbeat_console'),
    ]

    operations = [
        migrations.AddField(
            model_name='schedule',
            name='origin',
            field=models.CharField(choices=[('settings', 'settings'), ('admin', 'admin')], default='settings', editable=False, help_text='settings: read-only here; admin: made (and editable) in the admin.', max_length=8, verbose_name='origin'),
        ),
        migrations.AlterField(
            model_name='schedule',
            name='args',
            field=models.JSONField(blank=True, default=list, verbose_name='args'),
        ),
        migrations.AlterField(
            model_name='schedule',
            name='catch_up',
            field=models.CharField(choices=[('latest', 'latest'), ('all', 'all'), ('none', 'none')], default='latest', max_length=8, verbose_name='catch up'),
        ),
        migrations.AlterField(
            model_name='schedule',
            name='cron',
            field=models.CharField(blank=True, max_length=200, verbose_name='cron'),
        ),
        migrations.AlterField(
            model_name='schedule',
            name='every',
            field=models.FloatField(blank=True, null=True, verbose_name='every (s)'),
        ),
        migrations.AlterField(
            model_name='schedule',
            name='kwargs',
            field=models.JSONField(blank=True, default=dict, verbose_name='kwargs'),
        ),
        migrations.AlterField(
            model_name='schedule',
            name='max_lateness',
            field=models.FloatField(default=3600.0, verbose_name='max lateness (s)'),
        ),
        migrations.AlterField(
            model_name='schedule',
            name='name',
            field=models.CharField(max_length=200, primary_key=True, serialize=False, verbose_name='name'),
        ),
        migrations.AlterField(
            model_name='schedule',
            name='priority',
            field=models.SmallIntegerField(default=0, verbose_name='priority'),
        ),
        migrations.AlterField(
            model_name='schedule',
            name='queue_name',
            field=models.CharField(max_length=100, verbose_name='queue'),
        ),
        migrations.AlterField(
            model_name='schedule',
            name='task_path',
            field=models.CharField(max_length=255, verbose_name='task'),
        ),
        migrations.AlterField(
            model_name='schedule',
            name='timezone',
            field=models.CharField(max_length=64, verbose_name='time zone'),
        ),
        migrations.AlterField(
            model_name='schedule',
            name='unique',
            field=models.BooleanField(default=False, verbose_name='unique'),
        ),
    ]

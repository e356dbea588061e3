"""The system checks (`manage.py check`): settings.py checks the settings and `TASKS`,
tasks.py the task modules and `JOBSTATE_TASK_OPTIONS`, mysql.py that MariaDB/MySQL
databases have migration 0009's indexes, time_zone.py that SQLite and MariaDB/MySQL keep
their times in UTC. Importing this package registers them (apps.py)."""

from . import mysql, settings, tasks, time_zone  # noqa: F401  (each registers its checks)

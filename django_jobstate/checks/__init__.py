"""The system checks (`manage.py check`): settings.py checks the settings and `TASKS`,
tasks.py the task modules and `JOBSTATE_TASK_OPTIONS`. Importing this package registers
them (apps.py)."""

from . import settings, tasks  # noqa: F401  (each registers its checks)

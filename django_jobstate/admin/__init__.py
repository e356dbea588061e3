"""The admin: the job list and each job's page (jobs.py, with its actions in actions.py and
retry.py, its filters in filters.py, the page's parts in page.py), the Queues page
(queues.py), the Schedules page (schedules.py) and the Workers page (workers.py, its
reads in held.py)."""

from . import jobs, queues, schedules, workers  # noqa: F401  (each registers its ModelAdmin)

"""The app's own task: prune_jobs, which JOBSTATE_RETENTION's schedule runs hourly.

Defined on the first TASKS alias that uses JobStateBackend (none: no task, and no
retention schedule), so that importing this module never needs an alias the project
does not have.
"""

from __future__ import annotations

from typing import Any

from .schedules.settings import RETENTION_STATES, jobstate_backends
from .tasksapi import task

_backends = jobstate_backends()

if _backends:

    @task(backend=_backends[0].alias)
    def prune_jobs(succeeded: Any = None, failed: Any = None) -> dict[str, int]:
        """Delete the tasks whose final attempt is in that state and older than that age."""
        from .conf import age
        from .models import Job

        ages = dict(zip(RETENTION_STATES, (succeeded, failed), strict=True))
        return {
            state: Job.objects.prune(age(str(kept)), states=[state])
            for state, kept in ages.items()
            if kept is not None
        }

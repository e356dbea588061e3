"""The torture run's record (bench/torture/torture.py): one row per start of a task body.

The `bench` app is installed only by bench/torture/torture_settings.py.
"""

from django.db import models

from django_jobstate.db.clock import Now  # UTC on MariaDB too, as the jobs' times


class Execution(models.Model):
    """A task body started for one attempt; written by the body itself (torture_tasks.py)."""

    result_id = models.UUIDField(db_index=True)
    attempt = models.PositiveIntegerField()  # Job.attempt
    context_attempt = models.PositiveIntegerField()  # TaskContext.attempt, as the body saw it
    pid = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=64)
    # The attempt's state as the INSERT that wrote this row saw it: "running", unless the
    # body started after its attempt had already ended.
    seen_state = models.CharField(max_length=16, blank=True)
    # The database clock, like the Job's started_at/finished_at.
    recorded_at = models.DateTimeField(db_default=Now())
    # Set by a body planned to overrun its timeout that is still alive after it: its
    # process should have been killed at the deadline.
    ended_at = models.DateTimeField(null=True)
    # Set by a fast job of a mixed batch when its body returned (the database clock):
    # its success must be written soon after, whatever else its worker runs.
    returned_at = models.DateTimeField(null=True)
    # Set by a body of a limited task as it ends: time.monotonic() just after its start was
    # recorded and just before it returns (or raises). One clock for every process of the
    # host (network namespaces share it) and no clock skew: which bodies of a concurrency
    # key overlapped, whenever the write itself gets through.
    body_start = models.FloatField(null=True)
    body_end = models.FloatField(null=True)

    class Meta:
        app_label = "bench"

    def __str__(self) -> str:
        return f"{self.result_id} attempt {self.attempt}"

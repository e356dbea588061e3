"""Structured log events: every line of the worker and the supervisor names its `event`
and carries the job's fields in `extra`, so that a JSON formatter writes them as fields.

The events, stable names a log search can rely on:
    worker.started, worker.stopped, worker.orphaned, worker.claim_failed, worker.claimed,
    worker.ended, worker.overdue, worker.released, supervisor.started, supervisor.stopped,
    worker.skipped_locked (job_ids: the runnable jobs a --burst run left, locked),
    worker.released_unknown (attempts of a claim whose reply was lost, handed back),
    supervisor.signal, supervisor.database_unavailable, supervisor.outcomes_unwritten,
    runjobs.database_unavailable, runjobs.unknown_queue, metrics.serving,
    job.succeeded, job.failed, job.snoozed, job.handed_back, job.outcome_discarded, job.no_signal,
    job.settled (failed by a supervisor or rescuer: lost, timeout, released, interrupted),
    database.unavailable, heartbeat.failed, rescue.failed, wakeup.lost, wakeup.restored,
    scheduler.started, scheduler.invalid_schedule, scheduler.database_unavailable,
    scheduler.failed, schedule.tick_enqueued, schedule.tick_taken,
    schedule.tick_enqueued_already, schedule.tick_skipped, schedule.ticks_missed,
    schedule.tick_failed, schedule.failed, schedule.stored, schedule.not_stored,
    schedule.added, schedule.changed, schedules.removed, schedules.kept, schedules.name_clash
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..models import Job

# The attributes every LogRecord has: what is not among them came in `extra`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def job_fields(job: Job, event: str, **fields: Any) -> dict[str, Any]:
    """The `extra` of a log line about `job`: its event and the job's bounded fields."""
    return {
        "event": event,
        "job_id": job.pk,
        "result_id": str(job.result_id),
        "task": job.task_path,
        "queue": job.queue_name,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "worker_id": job.worker_id,
        **fields,
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every `extra` field.

    LOGGING = {"formatters": {"json": {"()": "django_jobstate.telemetry.logs.JsonFormatter"}}, ...}
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)

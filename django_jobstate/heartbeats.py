"""WorkerHeartbeat rows: how workers say they are alive, and how silent ones are forgotten."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import connections, models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .db.clock import Now
from .db.sqlite_turns import without_turns
from .managers.conflicts import retries_conflicts


@dataclass(frozen=True)
class Process:
    """Who beats for a worker: its `runjobs` supervisor (id, pid, --concurrency), or
    nobody for a worker that runs in-process (supervisor ""); its --in-flight."""

    supervisor: str = ""
    supervisor_pid: int | None = None
    concurrency: int | None = None
    in_flight: int = 1


class WorkerHeartbeatManager(models.Manager["WorkerHeartbeat"]):
    """The heartbeats' writes. None waits for a turn at SQLite's write lock
    (db/sqlite_turns.py): a beat is one UPDATE in autocommit, which takes no turn, but
    registering a worker (bulk_create() on Django 5.2) and forgetting one (delete()) are
    transactions, and a beat held up behind a turn while the others land lets a judge take
    the workers it beats for as lost."""

    @retries_conflicts
    def beat(
        self,
        workers: dict[str, int],
        *,
        host: str,
        queues: list[str] | None,
        process: Process | None = None,
    ) -> None:
        """Say that the workers `{worker_id: pid}` are alive now, registering the new ones.

        One UPDATE for all of them; an INSERT only for those that have no row yet (new, or
        forgotten as lost while they could not beat). `process` describes who beats, for
        the Workers page: written with the row, never changed after.
        """
        process = process or Process()
        if self.filter(worker_id__in=workers).update(last_seen=Now()) == len(workers):
            return
        # One INSERT ... ON CONFLICT, not a read then a write: SQLite would refuse that
        # transaction at once ("database is locked") while another process writes.
        now = timezone.now()
        # MariaDB/MySQL name no conflict target: ON DUPLICATE KEY of the primary key.
        target = connections[self.db].features.supports_update_conflicts_with_target
        with without_turns():  # as every write here (the class's docstring)
            self.bulk_create(
                [
                    self.model(
                        worker_id=worker_id,
                        host=host,
                        pid=pid,
                        queues=queues,
                        started_at=now,
                        last_seen=now,
                        supervisor=process.supervisor,
                        supervisor_pid=process.supervisor_pid,
                        concurrency=process.concurrency,
                        in_flight=process.in_flight,
                    )
                    for worker_id, pid in workers.items()
                ],
                update_conflicts=True,
                unique_fields=["worker_id"] if target else None,
                update_fields=["last_seen"],
            )
        # Lost workers are judged by the database clock, whatever this process's says.
        self.filter(worker_id__in=workers).update(last_seen=Now())

    @retries_conflicts
    def forget(self, worker_id: str) -> None:
        """Remove a worker that stopped cleanly."""
        with without_turns():
            self.filter(worker_id=worker_id).delete()

    @retries_conflicts
    def forget_lost(self, lost_after: float) -> None:
        """Remove silent workers that no longer own a running attempt.

        The busy ones are read first, then named: MariaDB/MySQL read a DELETE's subquery
        with locks, and would wait on any running row that another transaction holds, and
        the rescue that calls this with them (runner/liveness.Judge)."""
        from .models import Job

        cutoff = Now() - timedelta(seconds=lost_after)
        busy = set(Job.objects.running().values_list("worker_id", flat=True).distinct())
        with without_turns():
            self.filter(last_seen__lt=cutoff).exclude(worker_id__in=busy).delete()


class WorkerHeartbeat(models.Model):
    """One row per running worker process, refreshed every JOBSTATE_HEARTBEAT_INTERVAL."""

    worker_id = models.CharField(_("worker"), max_length=64, primary_key=True)
    host = models.CharField(_("host"), max_length=255)
    pid = models.PositiveIntegerField(_("pid"))
    queues = models.JSONField(_("queues"), null=True, blank=True, help_text=_("null: all"))
    started_at = models.DateTimeField(_("started at"))
    last_seen = models.DateTimeField(_("last seen"))
    # Who runs the worker (the Workers page): its `runjobs` supervisor, which beats for it,
    # or "" for a worker run in-process (Worker.run()), which beats for itself. Set when
    # the row is inserted; db_default so that a runner of an older version still inserts.
    supervisor = models.CharField(
        _("supervisor"), max_length=64, blank=True, default="", db_default=""
    )
    supervisor_pid = models.PositiveIntegerField(_("supervisor pid"), null=True, blank=True)
    concurrency = models.PositiveIntegerField(
        _("concurrency"), null=True, blank=True, help_text=_("its supervisor's worker processes")
    )
    in_flight = models.PositiveIntegerField(
        _("in flight"), null=True, blank=True, help_text=_("attempts it runs at once, at most")
    )

    objects = WorkerHeartbeatManager()

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")

    def __str__(self) -> str:
        return self.worker_id

"""Pausing and resuming queues: JobQueue rows, written by operators, read by every claim.

A pause is a row in the database, so it holds for every worker, survives restarts and
deploys, and takes effect for the first claim statement that starts after it commits:
the claim itself excludes paused queues (managers/claim.py), no worker caches it.

Which names a pause may name: queue_names.py.
"""

from __future__ import annotations

import logging

from django.db import connections, models, router, transaction
from django.utils.translation import gettext_lazy as _

from .dbclock import Now
from .notify import NOTIFY_QUEUE, queue_payload

logger = logging.getLogger("django_jobstate")


def validate_name(name: str) -> None:
    if not isinstance(name, str) or not name or len(name) > 100:
        raise ValueError(f"A queue name is 1 to 100 characters, not {name!r}.")


class JobQueueManager(models.Manager["JobQueue"]):
    def pause(self, name: str, *, by: str = "") -> JobQueue:
        """Pause queue `name`: no worker claims its jobs until it is resumed.

        Jobs already claimed finish; enqueue still accepts jobs. `by` says who asked
        ("admin:alice", "cli:deploy"); it is stored and logged.
        """
        return self._change(name, paused=True, by=by)

    def resume(self, name: str, *, by: str = "") -> JobQueue:
        """Let workers claim queue `name`'s jobs again (and wake idle ones)."""
        return self._change(name, paused=False, by=by)

    def _change(self, name: str, *, paused: bool, by: str) -> JobQueue:
        validate_name(name)
        db = router.db_for_write(self.model)
        with transaction.atomic(using=db):
            queue, _ = self.using(db).get_or_create(name=name)
            # A pause keeps its first time; only a resume clears it.
            paused_at = models.Case(
                models.When(paused_at__isnull=True, then=Now()), default="paused_at"
            )
            self.using(db).filter(name=name).update(
                paused_at=paused_at if paused else None, changed_by=by[:150], changed_at=Now()
            )
            connection = connections[db]
            if not paused and connection.vendor == "postgresql":
                with connection.cursor() as cursor:  # wake idle workers at the commit
                    cursor.execute(f"SELECT {NOTIFY_QUEUE}", [queue_payload(name)])
        queue.refresh_from_db()
        logger.warning(
            "Queue %r %s by %s", name, "paused" if paused else "resumed", by or "an unnamed caller"
        )
        return queue

    def paused(self) -> models.QuerySet[JobQueue]:
        return self.filter(paused_at__isnull=False)

    def paused_names(self) -> set[str]:
        return set(self.paused().values_list("name", flat=True))


class JobQueue(models.Model):
    """A queue an operator paused (or paused once): no worker claims a paused queue's jobs.

    Queues need no row to exist: a queue without one is not paused.
    """

    name = models.CharField(_("queue"), max_length=100, primary_key=True)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True, editable=False)
    # Who made the last change (pause or resume), and when: "admin:alice", "cli:deploy", ...
    changed_by = models.CharField(_("changed by"), max_length=150, blank=True, editable=False)
    changed_at = models.DateTimeField(_("changed at"), null=True, blank=True, editable=False)

    objects = JobQueueManager()

    class Meta:
        verbose_name = _("queue")
        verbose_name_plural = _("queues")

    def __str__(self) -> str:
        return self.name

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

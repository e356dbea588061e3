"""Pausing and resuming queues: JobQueue rows, written by operators, read by every claim.

A pause is a row in the database, so it holds for every worker, survives restarts and
deploys, and takes effect for the first claim statement that starts after it commits:
the claim itself excludes paused queues (managers/claim.py), no worker caches it.

Which names a pause may name: queue_names.py.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

from django.db import connections, models, router, transaction
from django.utils.translation import gettext_lazy as _

from .db.clock import Now
from .db.notify import NOTIFY_QUEUE, queue_payload
from .limits.queues import QueueLimits, effective, validate

logger = logging.getLogger("django_jobstate")


class Unset(enum.Enum):
    UNSET = "unset"


UNSET = Unset.UNSET


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

    def set_limits(
        self,
        name: str,
        *,
        concurrency: int | Unset | None = UNSET,
        rate: str | Unset = UNSET,
        clear: bool = False,
        by: str = "",
    ) -> JobQueue:
        """Set queue `name`'s limits at run time: they win over QUEUE_LIMITS' until
        cleared (`clear=True`: the settings' apply again). `concurrency=None` or `rate=""`
        lifts that limit (even one the settings set); a value left out keeps the current
        one. Running workers see the change within LIMITS_TTL seconds."""
        validate_name(name)
        if concurrency is not UNSET and concurrency is not None:
            validate(name, {"concurrency": concurrency})
        if isinstance(rate, str) and rate:
            rate = validate(name, {"rate": rate}).rate
        db = router.db_for_write(self.model)
        with transaction.atomic(using=db):
            self.using(db).get_or_create(name=name)
            queue = self.using(db).select_for_update().get(name=name)
            now = effective(name, queue)
            if clear:
                changes: dict[str, Any] = {"limits_set_at": None, "concurrency": None, "rate": ""}
            else:
                changes = {
                    "limits_set_at": Now(),
                    "concurrency": now.concurrency if concurrency is UNSET else concurrency,
                    "rate": now.rate if isinstance(rate, Unset) else rate,
                }
            if changes["rate"] != now.rate:
                changes.update(tokens=None, tokens_at=None)  # a new bucket, full
            self.using(db).filter(name=name).update(
                **changes, changed_by=by[:150], changed_at=Now()
            )
            connection = connections[db]
            if connection.vendor == "postgresql":  # idle workers look again at the commit
                with connection.cursor() as cursor:
                    cursor.execute(f"SELECT {NOTIFY_QUEUE}", [queue_payload(name)])
        queue.refresh_from_db()
        logger.warning(
            "Queue %r limits %s by %s: %s",
            name,
            "cleared" if clear else "set",
            by or "an unnamed caller",
            effective(name, queue).describe(),
        )
        return queue

    def paused(self) -> models.QuerySet[JobQueue]:
        return self.filter(paused_at__isnull=False)

    def paused_names(self) -> set[str]:
        return set(self.paused().values_list("name", flat=True))


class JobQueue(models.Model):
    """A queue an operator paused or limited (or once did): no worker claims a paused
    queue's jobs; a limited one's within its limits (queue_limits.py).

    Queues need no row to exist: a queue without one is not paused, and has the settings'
    limits.
    """

    name = models.CharField(_("queue"), max_length=100, primary_key=True)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True, editable=False)
    # Who made the last change (pause or resume), and when: "admin:alice", "cli:deploy", ...
    changed_by = models.CharField(_("changed by"), max_length=150, blank=True, editable=False)
    changed_at = models.DateTimeField(_("changed at"), null=True, blank=True, editable=False)
    # Limits set at run time (queue_limits.py): they win over the settings' while
    # limits_set_at is set, NULL ones included (an operator lifted a limit).
    concurrency = models.SmallIntegerField(
        _("concurrency limit"), null=True, blank=True, editable=False
    )
    rate = models.CharField(_("rate limit"), max_length=20, blank=True, editable=False)
    limits_set_at = models.DateTimeField(_("limits set at"), null=True, blank=True, editable=False)
    # The rate's token bucket: how many starts it allowed at tokens_at (NULL: full).
    tokens = models.FloatField(null=True, blank=True, editable=False)
    tokens_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = JobQueueManager()

    class Meta:
        verbose_name = _("queue")
        verbose_name_plural = _("queues")
        constraints = [
            models.CheckConstraint(
                condition=models.Q(concurrency=None) | models.Q(concurrency__gte=1),
                name="jobstate_jobqueue_concurrency",
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def limits(self) -> QueueLimits:
        """What limits this queue now: the run-time limits, else the settings'."""
        return effective(self.name, self)

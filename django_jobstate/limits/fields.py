"""The columns, constraints and indexes of concurrency limits (concurrency.py says what
they mean), apart from models.py so that each stays short; Job takes them from here."""

from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from ..db import indexes as db_indexes
from ..states import State
from .concurrency import HOLDS_SLOT, Hold
from .rates import MAX_RATE_LENGTH


class ConcurrencyFields(models.Model):
    """Job's concurrency columns: all NULL for a task without a limit."""

    # NULL for a job without a limit, so that it has no entry in the slot indexes.
    concurrency_key = models.CharField(  # noqa: DJ001
        _("concurrency key"),
        max_length=64,
        null=True,
        blank=True,
        editable=False,
        help_text=_("SHA-256 of the task and the arguments its concurrency is limited by."),
    )
    concurrency_limit = models.SmallIntegerField(
        _("concurrency limit"), null=True, blank=True, editable=False
    )
    # The slot (1..limit) a live keyed row holds; NULL while it waits for one (held).
    concurrency_slot = models.SmallIntegerField(
        _("concurrency slot"), null=True, blank=True, editable=False
    )
    hold = models.CharField(  # noqa: DJ001
        _("held by"), max_length=8, choices=Hold.choices, null=True, blank=True, editable=False
    )
    # The task's rate_limit at enqueue (limits/rates.py), "10/s"; NULL without one.
    rate_limit = models.CharField(  # noqa: DJ001
        _("rate limit"), max_length=MAX_RATE_LENGTH, null=True, blank=True, editable=False
    )

    class Meta:
        abstract = True


class ConcurrencyLock(models.Model):
    """One row per concurrency key, locked (SELECT ... FOR UPDATE) by whoever hands out
    that key's slots, on MariaDB/MySQL only: PostgreSQL takes an advisory lock on the key,
    SQLite's writers hold the database's write lock. A row lock, not GET_LOCK(): InnoDB
    lets it go at COMMIT or ROLLBACK, and when the connection drops."""

    key = models.CharField(_("concurrency key"), max_length=64, primary_key=True)

    class Meta:
        verbose_name = _("concurrency lock")
        verbose_name_plural = _("concurrency locks")

    def __str__(self) -> str:
        return self.key


class TaskRate(models.Model):
    """The token bucket of a rate-limited task (limits/rates.py): one row per task, made
    by the first claim that needs it, locked (FOR UPDATE SKIP LOCKED; SQLite: the write
    lock) by whoever starts the task's attempts, and spent in the same transaction."""

    task_path = models.CharField(_("task"), max_length=255, primary_key=True)
    rate = models.CharField(_("rate"), max_length=MAX_RATE_LENGTH, blank=True, default="")
    tokens = models.FloatField(_("tokens"), null=True, blank=True)
    tokens_at = models.DateTimeField(_("tokens counted at"), null=True, blank=True)

    class Meta:
        verbose_name = _("task rate")
        verbose_name_plural = _("task rates")

    def __str__(self) -> str:
        return f"{self.task_path} ({self.rate})"


CONSTRAINTS = [
    # A limited row has a limit, and a slot within it if any; an unlimited one has none of
    # these. NULL-safe: a CHECK lets an unknown through, so each NOT NULL is said.
    models.CheckConstraint(
        condition=Q(concurrency_key=None, concurrency_limit=None, concurrency_slot=None)
        & (Q(hold=None) | Q(hold__in=[Hold.RATE, Hold.DEPS]))  # its rate's or its deps'
        | Q(
            concurrency_key__isnull=False, concurrency_limit__isnull=False, concurrency_limit__gte=1
        )
        & (
            Q(concurrency_slot=None)
            | Q(concurrency_slot__gte=1, concurrency_slot__lte=F("concurrency_limit"))
        ),
        name="jobstate_job_concurrency",
    ),
    # Held: only a queued limited row without a slot (a cancel clears it); a queued row of
    # a rate-limited task, which only its rate's claim takes; or a queued row waiting for
    # the tasks it depends on (no slot yet: it takes one once they succeeded).
    models.CheckConstraint(
        condition=Q(hold=None)
        | Q(hold=Hold.LIMIT, concurrency_slot=None, state=State.QUEUED)
        | Q(hold=Hold.RATE, rate_limit__isnull=False, state=State.QUEUED)
        | Q(hold=Hold.DEPS, concurrency_slot=None, state=State.QUEUED),
        name="jobstate_job_hold",
    ),
    # A queued row of a rate-limited task never waits in the claim's index: the claim of
    # unlimited jobs would start it past the rate. NOT NULL said: IN lets NULL through.
    models.CheckConstraint(
        condition=Q(rate_limit=None)
        | ~Q(state=State.QUEUED)
        | Q(hold__isnull=False, hold__in=Hold.values),
        name="jobstate_job_rate_hold",
    ),
    # A live limited row holds a slot or waits for one: never neither (claimable, with no
    # slot) nor both.
    models.CheckConstraint(
        condition=Q(concurrency_key=None)
        | Q(state__in=[State.SUCCEEDED, State.FAILED])
        | Q(concurrency_slot__isnull=False) & (Q(hold=None) | Q(hold=Hold.RATE))
        | Q(concurrency_slot=None, hold__isnull=False, hold__in=[Hold.LIMIT, Hold.DEPS]),
        name="jobstate_job_live_slot",
    ),
    # The database refuses over-concurrency by itself: one live row per slot of a key.
    db_indexes.UniqueConstraint(
        fields=["concurrency_key", "concurrency_slot"],
        condition=HOLDS_SLOT,
        name="jobstate_job_concurrency_slot",
    ),
]

INDEXES = [
    # The held rows of a key in claim order: the next to get a freed slot first; and the
    # keys that have held rows, one step each (Limits.release_held). `hold` first, so that
    # MariaDB/MySQL, which make it whole (no partial index), find the held rows together.
    db_indexes.Index(
        fields=["hold", "concurrency_key", "-priority", "run_after", "id"],
        condition=Q(state=State.QUEUED, hold__isnull=False),
        name="jobstate_job_held",
    ),
    # The rows a task's rate holds, per task and queue in claim order (managers/
    # rate_claim.py), and the tasks that have some, one step each. `hold` first, as above.
    db_indexes.Index(
        fields=["hold", "task_path", "queue_name", "-priority", "run_after", "id"],
        condition=Q(state=State.QUEUED, hold=Hold.RATE),
        name="jobstate_job_rated",
    ),
]

"""The Schedule table: one row per periodic job's name, the state its ticks are written by.

Its definition columns are copied from the settings (writes.sync(); origin "settings") or
written by the admin (admin.py; origin "admin"); next_tick_at is the next tick not yet
enqueued, and the compare-and-set on it (with definition_hash) is what lets exactly one
supervisor enqueue each tick (scheduler.py). The definition columns are editable in the
admin's form of an admin row only; the settings' rows stay read-only there.
"""

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from ..db import indexes as db_indexes
from ..payload import PayloadField
from .definitions import CATCH_UP, DEFAULT_MAX_LATENESS


class Origin(models.TextChoices):
    """Who defines a schedule: the settings (writes.sync() keeps the row), or the admin
    (its form writes the row; sync() never touches it)."""

    SETTINGS = "settings", _("settings")
    ADMIN = "admin", _("admin")


class Schedule(models.Model):
    name = models.CharField(_("name"), max_length=200, primary_key=True)
    origin = models.CharField(
        _("origin"),
        max_length=8,
        choices=Origin.choices,
        default=Origin.SETTINGS,
        editable=False,
        help_text=_("settings: read-only here; admin: made (and editable) in the admin."),
    )
    task_path = models.CharField(_("task"), max_length=255)
    cron = models.CharField(_("cron"), max_length=200, blank=True)
    every = models.FloatField(_("every (s)"), null=True, blank=True)
    timezone = models.CharField(_("time zone"), max_length=64)
    args = PayloadField(_("args"), default=list, blank=True)
    kwargs = PayloadField(_("kwargs"), default=dict, blank=True)
    backend = models.CharField(_("backend alias"), max_length=100, editable=False)
    queue_name = models.CharField(_("queue"), max_length=100)
    priority = models.SmallIntegerField(_("priority"), default=0)
    unique = models.BooleanField(_("unique"), default=False)
    catch_up = models.CharField(
        _("catch up"), max_length=8, choices=[(c, c) for c in CATCH_UP], default="latest"
    )
    max_lateness = models.FloatField(_("max lateness (s)"), default=DEFAULT_MAX_LATENESS)
    definition_hash = models.CharField(_("definition hash"), max_length=64, editable=False)
    enabled = models.BooleanField(_("enabled"), default=True)
    next_tick_at = models.DateTimeField(_("next tick"), editable=False)
    last_tick_at = models.DateTimeField(_("last tick"), null=True, blank=True, editable=False)
    last_result_id = models.UUIDField(_("last result id"), null=True, blank=True, editable=False)
    skipped = models.PositiveIntegerField(
        _("skipped"),
        default=0,
        editable=False,
        help_text=_("Ticks skipped: the run before was live."),
    )
    last_skipped_at = models.DateTimeField(_("last skipped"), null=True, blank=True, editable=False)
    missed = models.PositiveIntegerField(
        _("missed"), default=0, editable=False, help_text=_("Ticks not caught up (catch_up).")
    )
    removed_at = models.DateTimeField(
        _("removed at"),
        null=True,
        blank=True,
        editable=False,
        help_text=_("When its name left the settings; it no longer ticks."),
    )

    class Meta:
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")
        indexes = [
            # The scheduler's one query per wake-up: the earliest ticks of the live rows.
            db_indexes.Index(
                fields=["next_tick_at"],
                condition=Q(enabled=True, removed_at=None),
                name="jobstate_schedule_due",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def expression(self) -> str:
        if self.every is not None:
            return f"every {self.every:g} s"
        return f"{self.cron} ({self.timezone})"

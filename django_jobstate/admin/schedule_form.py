"""The form of a schedule made in the admin: the keys of a settings definition, checked by
the same code (schedules/edits.validate: parse() and task_of()), each error beside the
field it is about."""

from dataclasses import replace
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

from ..models import Schedule
from ..schedules.definitions import Definition, ScheduleError
from ..schedules.edits import name_taken, validate

FORM_FIELDS = [
    *["name", "task_path", "cron", "every", "timezone", "args", "kwargs", "queue_name"],
    *["priority", "unique", "catch_up", "max_lateness", "enabled"],
]
# A definition's key (ScheduleError.key) -> the form's field.
FIELD_OF = {
    "task": "task_path",
    "cron": "cron",
    "every": "every",
    "timezone": "timezone",
    "args": "args",
    "kwargs": "kwargs",
    "queue": "queue_name",
    "priority": "priority",
    "unique": "unique",
    "catch_up": "catch_up",
    "max_lateness": "max_lateness",
}
HELP = {
    "task_path": _("The dotted path of a @task of a task module, e.g. reports.tasks.nightly."),
    "cron": _(
        "Five fields: minute hour day month weekday, e.g. 0 3 * * * (in the time zone). "
        "Give this or every."
    ),
    "every": _("Or: seconds between ticks (1 to a year), anchored to the Unix epoch."),
    "timezone": _("An IANA name such as Europe/Paris; empty: the TIME_ZONE setting."),
    "args": _('A JSON list, e.g. [1, "a"]: the positional arguments of each job.'),
    "kwargs": _('A JSON object, e.g. {"limit": 100}: the keyword arguments of each job.'),
    "queue_name": _("One of the QUEUES of the task's backend; empty: default (or its first)."),
    "priority": _("-100 to 100; higher runs first."),
    "unique": _("Skip a tick while the schedule's last job is still queued or running."),
    "catch_up": _(
        "Ticks missed while no runjobs ran: latest enqueues the most recent, all every "
        "one, none none."
    ),
    "max_lateness": _("Seconds: a tick later than that is never enqueued."),
}


class ScheduleForm(forms.ModelForm):
    definition: Definition  # clean() sets it: what the admin stores (edits.add, edits.edit)

    class Meta:
        model = Schedule
        fields = FORM_FIELDS
        help_texts = HELP

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("timezone", "queue_name"):
            if name in self.fields:
                self.fields[name].required = False
        for name in ("args", "kwargs"):
            if name in self.fields:
                self.fields[name].widget.attrs.update(rows=2, cols=60)

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if not name:
            raise ValidationError(_("A schedule needs a name."))
        if why := name_taken(name):
            raise ValidationError(why)
        return name

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data  # each field's own error first
        raw: dict[str, Any] = {
            "task": data["task_path"].strip(),
            "args": [] if data.get("args") is None else data["args"],
            "kwargs": {} if data.get("kwargs") is None else data["kwargs"],
            "priority": data.get("priority") or 0,
            "unique": bool(data.get("unique")),
            "catch_up": data.get("catch_up") or "latest",
            "max_lateness": data["max_lateness"],
        }
        if data.get("cron", "").strip():
            raw["cron"] = data["cron"].strip()
        if data.get("every") is not None:
            raw["every"] = data["every"]
        for key, field in (("timezone", "timezone"), ("queue", "queue_name")):
            if value := (data.get(field) or "").strip():
                raw[key] = value
        if not isinstance(raw["args"], list):
            self.add_error("args", _("The args must be a JSON list, e.g. [1, 2]."))
        if not isinstance(raw["kwargs"], dict):
            self.add_error("kwargs", _('The kwargs must be a JSON object, e.g. {"a": 1}.'))
        if self.errors:
            return data
        name = data.get("name") or self.instance.name
        try:
            definition = validate(name, raw)
        except ScheduleError as exc:
            self.add_error(FIELD_OF.get(exc.key), str(exc))
            return data
        self.definition = replace(definition, enabled=bool(data.get("enabled")))
        return data

    def validate_unique(self) -> None:
        """clean_name() says why a name is taken (the settings', the admin's)."""

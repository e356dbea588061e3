"""The "Start a task" page of the job list: any task of the project, arguments as JSON.

It needs the `django_jobstate.enqueue_task` permission (superusers have it; grant it to
others by hand): starting any task with any arguments is more than changing jobs. The
checks are `manage.py enqueue`'s (handmade.py), and each start is in the admin log.
"""

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..handmade import RUN_AFTER_FORMAT, Call, NotStarted, prepare, project_tasks, start
from ..loading import import_errors
from ..models import Job

if TYPE_CHECKING:
    from django.contrib import admin

    _Base = admin.ModelAdmin[Job]
else:
    _Base = object

PERMISSION = "django_jobstate.enqueue_task"


class StartTaskForm(forms.Form):
    task = forms.ChoiceField(label=gettext_lazy("Task"))
    args = forms.CharField(
        label=gettext_lazy("Arguments"),
        required=False,
        initial="[]",
        widget=forms.Textarea(attrs={"rows": 3, "class": "vLargeTextField"}),
        help_text=gettext_lazy('A JSON list: ["report", 3]'),
    )
    kwargs = forms.CharField(
        label=gettext_lazy("Keyword arguments"),
        required=False,
        initial="{}",
        widget=forms.Textarea(attrs={"rows": 3, "class": "vLargeTextField"}),
        help_text=gettext_lazy('A JSON object: {"to": "ops@example.com"}'),
    )
    queue = forms.CharField(
        label=gettext_lazy("Queue"),
        required=False,
        help_text=gettext_lazy("Empty: the task's own."),
    )
    priority = forms.IntegerField(
        label=gettext_lazy("Priority"),
        required=False,
        help_text=gettext_lazy("-100 to 100; empty: the task's own."),
    )
    run_after = forms.CharField(
        label=gettext_lazy("Run after"),
        required=False,
        help_text=gettext_lazy("Empty: now. Or %(format)s.") % {"format": RUN_AFTER_FORMAT},
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [("", "---------"), *project_tasks()]
        self.fields["task"].choices = choices  # type: ignore[attr-defined]
        self.call: Call | None = None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            self.call = prepare(
                data["task"],
                args=data["args"],
                kwargs=data["kwargs"],
                queue=data["queue"],
                priority=data["priority"],
                run_after=data["run_after"],
            )
        except NotStarted as exc:
            self.add_error(exc.field, str(exc))
        return data


class StartTaskAdmin(_Base):
    """JobAdmin's part for the page: its URL, its permission, the list's button."""

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_start"
        view = self.admin_site.admin_view(self.start_view)
        return [path("start/", view, name=name), *super().get_urls()]

    def has_enqueue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PERMISSION)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if self.has_enqueue_permission(request):
            url = reverse(f"{self.admin_site.name}:django_jobstate_job_start")
            extra_context = {**(extra_context or {}), "start_task_url": url}
        return super().changelist_view(request, extra_context)

    def start_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_enqueue_permission(request):
            raise PermissionDenied
        form = StartTaskForm(request.POST if request.method == "POST" else None)
        if form.is_valid() and form.call is not None:
            try:
                started = start(form.call)
            except NotStarted as exc:
                form.add_error(None, str(exc))
            else:
                return self._started(request, form.call, started.result.id, new=started.new)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Start a task"),
            "opts": Job._meta,
            "form": form,
            "import_errors": sorted(import_errors().items()),
        }
        return TemplateResponse(request, "admin/django_jobstate/job/start_task.html", context)

    def _started(
        self, request: HttpRequest, call: Call, result_id: Any, *, new: bool
    ) -> HttpResponse:
        job = Job.objects.attempts_of(result_id).first()
        site = self.admin_site.name
        back = reverse(f"{site}:django_jobstate_job_start")
        if job is None:  # a task of another backend: no row to link to
            what = {"task": call.task.module_path, "id": result_id}
            self.message_user(request, _("Enqueued %(task)s: result id %(id)s.") % what)
            return HttpResponseRedirect(back)
        url = reverse(f"{site}:django_jobstate_job_change", args=[job.pk])
        if new:
            self.log_addition(request, job, call.describe())
            text = format_html(
                '{} <a href="{}">{} #{}</a> ({}).',
                _("Started %(task)s:") % {"task": call.task.module_path},
                url,
                _("job"),
                job.pk,
                _("result id %(id)s") % {"id": result_id},
            )
            self.message_user(request, text, messages.SUCCESS)
        else:
            text = format_html(
                '{} <a href="{}">{} #{}</a>.',
                _("Nothing new was started: %(task)s is unique, and a live job holds the key:")
                % {"task": call.task.module_path},
                url,
                _("job"),
                job.pk,
            )
            self.message_user(request, text, messages.WARNING)
        # Its page, for who may see it; the form again for the others.
        return HttpResponseRedirect(url if self.has_view_permission(request, job) else back)

"""The django.tasks backend: enqueue as a Job row, read results as a view over attempts."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import OperationalError

from .conf import Settings
from .loading import check_loadable
from .loading import load_task as load_task  # re-exported: worker.py imports it from here
from .task_options import JobStateTask as JobStateTask  # the public path of the task class
from .task_options import validate_options, validate_queue, with_settings
from .task_options.plan import Plan, Plans, make_plan
from .task_results import EnqueuedResults, queued_result, to_task_result
from .task_results import JobStateTaskResult as JobStateTaskResult  # its public path before
from .tasksapi import (
    BaseTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    audible,
    reported_by_the_backport,
    send,
    task_enqueued,
)
from .testing import DummyBackend as DummyBackend  # the test settings' backends
from .testing import ImmediateBackend as ImmediateBackend

if TYPE_CHECKING:
    from .models import Job

# PostgreSQL's "could not serialize access": an ON CONFLICT under REPEATABLE READ that met
# a row committed after the snapshot.
SERIALIZATION_FAILURE = "40001"

_NOT_INSTALLED = (
    "TASKS[{alias!r}] uses JobStateBackend, but django_jobstate is not in INSTALLED_APPS, "
    "so it has no table to store jobs in."
)
_INSTALL = "Add 'django_jobstate' to INSTALLED_APPS and run migrate."


class JobStateBackend(BaseTaskBackend):
    task_class = JobStateTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: Task) -> None:
        # E003 at the task's definition too: Django runs no check of TASKS unless something
        # imported django.tasks before the checks began, so a project that imports its
        # tasks only from its URLconf would otherwise learn of it at the first enqueue().
        if apps.apps_ready and not apps.is_installed("django_jobstate"):
            raise ImproperlyConfigured(
                f"{_NOT_INSTALLED.format(alias=self.alias)} {_INSTALL} (django_jobstate.E003)"
            )
        validate_queue(self, task)
        super().validate_task(task)
        validate_options(task)

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult:
        plan = self._plans.get(task, self._plan)
        if plan.plain is not None:  # no key, limit, time, link or trace: no Job to build
            task = plan.task
            written = self._job.objects.enqueue_one(
                task.module_path, plan.plain, args, kwargs, plan.statements
            )
            if written is not None:
                result = queued_result(task, written)
                if audible(task_enqueued, type(self), logging.DEBUG):
                    send(task_enqueued, type(self), task_result=result)
                return result
        return self.bulk_enqueue(task, [(args, kwargs)])[0]

    def bulk_enqueue(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]
    ) -> EnqueuedResults:
        """Enqueue many calls of `task` at once, all or none: `[(args, kwargs), ...]`.

        Not part of django.tasks: a fast path for enqueueing thousands of jobs. Returns a
        sequence of their TaskResults, in the calls' order, each built when first read.
        """
        plan = self._plans.get(task, self._plan)
        task = plan.task
        from .models import Job

        calls = list(calls)
        if plan.tracing:
            from .telemetry.tracing import producer_span

            with producer_span(task, len(calls)) as (span, trace_context):
                jobs = self._enqueue(plan, calls, trace_context)
                if len(jobs) == 1:
                    span.set_attribute("messaging.message.id", str(jobs[0].result_id))
        else:
            jobs = self._enqueue(plan, calls, None)
        # Django's receiver logs each at DEBUG: the signal is sent only if anything hears it.
        announce = audible(task_enqueued, type(self), logging.DEBUG)
        built: dict[int, TaskResult] = {}  # the rest are built when read (EnqueuedResults)
        if not (plan.unique or announce):  # no duplicate to look up, no one to tell
            return EnqueuedResults(jobs, task, built)
        for i, job in enumerate(jobs):
            if job.deduplicated:  # the live task that holds the key, with all its attempts
                attempts = (
                    [job] if job.attempt == 1 else list(Job.objects.attempts_of(job.result_id))
                )
                same = job.task_path == task.module_path  # an explicit key may be another's
                built[i] = to_task_result(attempts, task if same else None)
            elif announce:
                built[i] = result = to_task_result([job], task)
                send(task_enqueued, type(self), task_result=result)
        return EnqueuedResults(jobs, task, built)

    @cached_property
    def _plans(self) -> Plans:
        return Plans()

    @cached_property
    def _job(self) -> type[Job]:
        """The Job model, once the apps are loaded (this module is imported before they
        are): no import at every enqueue()."""
        from .models import Job

        return Job

    def _plan(self, task: Task, settings: Settings) -> Plan:
        """Check `task` (with JOBSTATE_TASK_OPTIONS applied) and work out its options: once
        per task object and settings (task_plan.py)."""
        task = with_settings(task)  # JOBSTATE_TASK_OPTIONS' options win over @task's
        self.validate_task(task)
        check_loadable(task)
        if not apps.is_installed("django_jobstate"):
            raise ImproperlyConfigured(_NOT_INSTALLED.format(alias=self.alias))
        return make_plan(task, settings, self.alias)

    def _enqueue(
        self,
        plan: Plan,
        calls: list[tuple[Sequence[Any], dict[str, Any]]],
        trace_context: dict[str, Any] | None,
        links: Any = None,  # managers.deps.Links: depends_on, or a workflow's step
    ) -> Sequence[Job]:
        from .managers.deps import Links, as_result_ids
        from .models import Job

        task = plan.task
        if links is None and (depends_on := getattr(task, "depends_on", None)) is not None:
            links = Links(depends_on=as_result_ids(depends_on))
        try:
            return Job.objects.enqueue_many(
                task.module_path,
                calls,
                **plan.options,
                trace_context=trace_context,
                links=links,
                **plan.per_call(calls),
            )
        except OperationalError as exc:
            if plan.unique and getattr(exc.__cause__, "sqlstate", None) == SERIALIZATION_FAILURE:
                raise OperationalError(
                    f"Enqueueing unique task {task.module_path!r} met a job with its key that "
                    f"another transaction wrote after this transaction's snapshot was taken "
                    f"(REPEATABLE READ or SERIALIZABLE isolation). Retry the whole "
                    f"transaction, or enqueue unique tasks under READ COMMITTED, Django's "
                    f"default. ({exc})"
                ) from exc
            raise

    def get_result(self, result_id: str) -> TaskResult:
        from .models import Job

        try:
            attempts = list(Job.objects.attempts_of(uuid.UUID(str(result_id))))
        except (ValueError, ValidationError):
            attempts = []
        if not attempts:
            raise TaskResultDoesNotExist(result_id)
        return to_task_result(attempts)

    def cancel(self, result_id: str) -> TaskResult:
        """Cancel the task's live attempt and return its TaskResult (read after the cancel).

        Queued (a first attempt, or a retry waiting): it fails as cancelled at once and
        never runs; the result is FAILED. Running: the task is asked to stop (its context
        says so) and is stopped JOBSTATE_CANCEL_GRACE seconds later; the result stays
        RUNNING until then, and is FAILED (or SUCCESSFUL, if the task returned first).
        Finished: nothing changes. Never retried once cancelled.
        """
        from .models import Job

        try:
            Job.objects.cancel_task(uuid.UUID(str(result_id)))
        except (ValueError, ValidationError, Job.DoesNotExist):
            raise TaskResultDoesNotExist(result_id) from None
        return self.get_result(result_id)

    def pause_queue(self, name: str, *, by: str = "") -> None:
        """Stop every worker from claiming queue `name`'s jobs until resume_queue(name);
        stored in the database (survives restarts). Running jobs finish.

        ValueError, naming the known queues, for a queue that no TASKS alias lists, that
        has no queued job and was never paused: a typo would pause nothing.
        """
        from .models import JobQueue
        from .queue_names import check_known

        check_known(name)
        JobQueue.objects.pause(name, by=by or "code")

    def resume_queue(self, name: str, *, by: str = "") -> None:
        """Let workers claim queue `name`'s jobs again (ValueError as for pause_queue())."""
        from .models import JobQueue
        from .queue_names import check_known

        check_known(name)
        JobQueue.objects.resume(name, by=by or "code")

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        if apps.is_installed("django_jobstate") or reported_by_the_backport(self):
            return []
        return [
            Error(
                _NOT_INSTALLED.format(alias=self.alias),
                hint=_INSTALL,
                id="django_jobstate.E003",
            )
        ]

"""JOBSTATE_TASK_OPTIONS: options of tasks you do not own, by path; checked like @task's,
applied at enqueue and by workers, shown in the admin. They win over @task's own."""

import json

import pytest
from django.core.checks import run_checks
from django.test import override_settings
from django.urls import reverse

from django_jobstate.models import Job
from django_jobstate.states import FailureReason, State
from tests import tasks
from tests.models import Execution
from tests.searchapp import tasks as searchapp_tasks

INDEX = "tests.searchlib.tasks.index_page"  # a third-party task, re-exported


def errors(options):
    with override_settings(JOBSTATE_TASK_OPTIONS=options):
        return [
            (m.msg, m.hint)
            for m in run_checks()
            if m.id in ("django_jobstate.E015", "django_jobstate.W002")
        ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "message", "hint"),
    [
        (
            {"tests.tasks.recrd": {"max_attempts": 2}},
            "JOBSTATE_TASK_OPTIONS['tests.tasks.recrd'] names no task workers can run",
            "Did you mean 'tests.tasks.record'?",
        ),
        (
            {"tests.tasks.record": {"max_attempts": 0}},
            "JOBSTATE_TASK_OPTIONS['tests.tasks.record']: max_attempts of task "
            "'tests.tasks.record' must be a number of at least 1, not 0.",
            "Fix the value, as for @task(...).",
        ),
        (
            {"tests.tasks.record": {"max_attemps": 2}},
            "JOBSTATE_TASK_OPTIONS['tests.tasks.record'] sets 'max_attemps', which is not "
            "an option it can set.",
            "Did you mean 'max_attempts'? The options are: max_attempts, backoff, timeout, "
            "atomic, unique, unique_scope, on_duplicate, retry_on, max_snoozes, concurrency, "
            "concurrency_key, rate_limit.",
        ),
        (
            {"tests.tasks.record": {"rate_limit": "10 a second"}},
            "JOBSTATE_TASK_OPTIONS['tests.tasks.record']: rate_limit of task "
            "'tests.tasks.record': A rate is a positive whole number of starts per second, "
            'minute, hour or day, such as "10/s", "100/m" or "1000/h"; not \'10 a second\'.',
            "Fix the value, as for @task(...).",
        ),
        (
            {INDEX: {"unique": ["nope"]}},
            f"JOBSTATE_TASK_OPTIONS['{INDEX}']: unique of task '{INDEX}' names 'nope', which "
            f"is not a parameter of index_page(); its parameters are: label.",
            "Fix the value, as for @task(...).",
        ),
        (
            {"tests.searchapp.tasks.index_page": {"unique": True}},
            "JOBSTATE_TASK_OPTIONS['tests.searchapp.tasks.index_page'] names the task "
            f"'{INDEX}' by another path.",
            f"Name it by its own path: '{INDEX}'.",
        ),
        (
            ["tests.tasks.record"],
            "JOBSTATE_TASK_OPTIONS must be a dict of task paths, not list.",
            'JOBSTATE_TASK_OPTIONS = {"app.tasks.name": {"max_attempts": 3}}',
        ),
    ],
)
def test_bad_options_are_check_errors_naming_the_task_and_the_option(options, message, hint):
    (found,) = errors(options)

    assert found[0].startswith(message), found
    assert found[1] == hint


@pytest.mark.django_db
def test_good_options_pass_the_checks():
    good = {INDEX: {"unique": True, "max_attempts": 3, "timeout": 60, "atomic": True}}

    assert errors(good) == []


@pytest.mark.django_db
def test_the_setting_wins_over_the_tasks_own_options_at_enqueue():
    with override_settings(JOBSTATE_TASK_OPTIONS={"tests.tasks.with_options": {"backoff": 7}}):
        result = tasks.with_options.enqueue()

    job = Job.objects.get(result_id=result.id)
    assert (job.max_attempts, job.backoff, job.timeout) == (3, 7, 5)  # @task: 3, 2, 5


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_unique_from_the_setting_collapses_duplicates(runjobs):
    with override_settings(JOBSTATE_TASK_OPTIONS={INDEX: {"unique": True}}):
        results = [searchapp_tasks.index_page.enqueue("home") for _ in range(3)]
    other = searchapp_tasks.index_page.enqueue("home")  # without the setting: a job of its own

    done = runjobs.run("--burst")

    assert done.returncode == 0, done.stdout
    assert len({r.id for r in results}) == 1
    assert Job.objects.filter(task_path=INDEX).count() == 2
    assert other.id != results[0].id
    assert list(Execution.objects.values_list("label", flat=True)) == ["home", "home"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_timeout_from_the_setting_times_the_attempt_out(runjobs):
    with override_settings(
        JOBSTATE_TASK_OPTIONS={"tests.searchlib.tasks.slow_index": {"timeout": 1}}
    ):
        result = searchapp_tasks.slow_index.enqueue("slow", 120)

    done = runjobs.run("--burst")

    assert done.returncode == 0, done.stdout
    job = Job.objects.get(result_id=result.id)
    assert (job.timeout, job.state, job.failure_reason) == (1, State.FAILED, FailureReason.TIMEOUT)
    assert not Execution.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_atomic_from_the_setting_is_applied_by_the_worker(runjobs):
    options = {"tests.searchlib.tasks.writes_then_fails": {"atomic": True}}
    result = searchapp_tasks.writes_then_fails.enqueue("rolled back")

    done = runjobs.run(
        "--burst", JOBSTATE_TEST_SETTINGS=json.dumps({"JOBSTATE_TASK_OPTIONS": options})
    )

    assert done.returncode == 0, done.stdout
    job = Job.objects.get(result_id=result.id)
    assert (job.state, job.error_class) == (State.FAILED, "builtins.RuntimeError")
    assert not Execution.objects.exists()  # the body's write rolled back with the attempt


@pytest.mark.django_db
def test_a_schedule_enqueues_with_the_settings_options():
    from tests.test_scheduler import every, make_due, scheduled_jobs, scheduler

    with override_settings(JOBSTATE_TASK_OPTIONS={INDEX: {"max_attempts": 4, "timeout": 9}}):
        s = scheduler(every(60, task_path=INDEX, args=["home"]))
        s.run_once()
        make_due()
        s.run_once()

    [job] = scheduled_jobs()
    assert (job.task_path, job.max_attempts, job.timeout) == (INDEX, 4, 9)


@pytest.mark.django_db
def test_the_job_page_says_where_each_option_came_from(admin_client):
    with override_settings(JOBSTATE_TASK_OPTIONS={"tests.tasks.with_options": {"backoff": 7}}):
        job = Job.objects.get(result_id=tasks.with_options.enqueue().id)
        page = admin_client.get(reverse("admin:django_jobstate_job_change", args=[job.pk]))

    text = page.content.decode()
    assert page.status_code == 200
    assert '<code>backoff</code> = 7.0 <span class="help">(JOBSTATE_TASK_OPTIONS)</span>' in text
    assert '<code>max_attempts</code> = 3 <span class="help">(@task)</span>' in text
    assert '<code>atomic</code> = False <span class="help">(default)</span>' in text

"""`manage.py enqueue`: in-process through call_command, and as a real process that waits
for a real `runjobs` to run the task."""

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_jobstate.models import Job
from django_jobstate.states import FailureReason, State
from tests.conftest import ROOT, subprocess_env

pytestmark = pytest.mark.django_db


def enqueue(*args: str) -> tuple[Job, str]:
    """Run the command; return the job it wrote and what it printed on stderr."""
    out, err = StringIO(), StringIO()
    call_command("enqueue", *args, stdout=out, stderr=err)
    result_id = out.getvalue().splitlines()[0]
    return Job.objects.get(result_id=uuid.UUID(result_id)), err.getvalue()


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        call_command("enqueue", *args, stdout=StringIO(), stderr=StringIO())
    assert caught.value.returncode == 2, caught.value
    assert not Job.objects.exists()
    return str(caught.value)


def test_prints_the_result_id_of_a_job_enqueued_with_every_option():
    job, err = enqueue(
        "tests.tasks.boom",
        "--kwargs",
        '{"message": "étoile"}',
        "--queue",
        "reports",
        "--priority",
        "7",
        "--run-after",
        "2030-01-02T03:04:05+00:00",
    )
    assert (job.task_path, job.state, job.attempt) == ("tests.tasks.boom", State.QUEUED, 1)
    assert (job.args, job.kwargs) == ([], {"message": "étoile"})
    assert (job.queue_name, job.priority) == ("reports", 7)
    assert job.run_after == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert err == ""


def test_defaults_are_the_tasks_own_and_a_relative_run_after_counts_from_now():
    before = timezone.now()
    job, _ = enqueue("tests.tasks.email", "--args", '["ops@example.com"]', "--run-after", "5m")
    assert (job.args, job.queue_name, job.priority) == (["ops@example.com"], "emails", 0)
    assert before + timedelta(minutes=5) <= job.run_after <= timezone.now() + timedelta(minutes=5)


def test_a_task_that_takes_context_is_given_its_other_arguments_only():
    assert "fit attempt_number()" in refused("tests.tasks.attempt_number", "--args", "[1]")
    job, _ = enqueue("tests.tasks.attempt_number")
    assert job.task_path == "tests.tasks.attempt_number"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--args", "[1,"], "--args: The arguments are not valid JSON: Expecting value"),
        (["--args", '{"a": 1}'], "--args: The arguments must be a JSON list"),
        (["--args", '"x"'], "not a string"),
        (["--kwargs", "[1]"], "--kwargs: The keyword arguments must be a JSON object"),
        (["--kwargs", "{'a': 1}"], "--kwargs: The keyword arguments are not valid JSON"),
        (["--kwargs", "null"], "not a null"),
        (["--args", "[]"], "The arguments do not fit record(label: str): missing a required"),
        (["--args", '["a", "b"]'], "too many positional arguments"),
        (["--args", '["x"]', "--kwargs", '{"nope": 1}'], "unexpected keyword argument 'nope'"),
        (["--args", '["x"]', "--queue", "nowhere"], "--queue: Queue 'nowhere' is not valid"),
        (["--args", '["x"]', "--priority", "500"], "--priority: priority must be a whole number"),
        (["--args", '["x"]', "--run-after", "soon"], "--run-after: 'soon' is not a delay"),
        (["--args", '["x"]', "--run-after", "30"], "--run-after: '30' has no unit"),
        (["--args", '["x"]', "--run-after", "99999999d"], "is more than 36500 days"),
        (["--args", "[NaN]"], "Task arguments must be JSON: Out of range float values"),
        (["--args", '["x"]', "--timeout", "5"], "--timeout applies to --wait only"),
    ],
)
def test_bad_input_is_refused_clearly_and_nothing_is_enqueued(args, said):
    assert said in refused("tests.tasks.record", *args)


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("tests.tasks.recrod", "module 'tests.tasks' has no 'recrod'"),
        ("tests.tasks.not_a_task", "is a function, not a Task"),
        ("os.path.join", "is a function, not a Task"),
        ("django.contrib.auth.models.User", "is a ModelBase, not a Task"),
        ("jobstate_never_imported.tasks.x", "is not a task module of this project"),
        ("subprocess", "it is not a dotted path to a task"),
        ("  ", "Name a task: its dotted path"),
    ],
)
def test_only_a_task_of_the_projects_task_modules_is_started(path, said):
    message = refused(path)
    assert message.startswith("Not enqueued: --task: ")
    assert said in message
    assert "jobstate_never_imported" not in sys.modules  # nothing imported for the path


def test_a_mistyped_task_is_answered_with_the_closest_names():
    assert "Did you mean tests.tasks.record or " in refused("tests.tasks.recrod")
    listed = refused("zzz.qqq")
    assert "The project's tasks: " in listed
    assert "in all)." in listed


def test_a_unique_tasks_live_job_is_returned_not_duplicated():
    first, _ = enqueue("tests.tasks.unique_record", "--args", '["k"]')
    again, err = enqueue("tests.tasks.unique_record", "--args", '["k"]')
    assert again.pk == first.pk
    assert "Nothing new was enqueued" in err
    assert Job.objects.count() == 1
    assert "JobAlreadyEnqueued" not in err
    enqueue("tests.tasks.unique_or_raise", "--args", '["k"]')
    assert "already" in refused_again("tests.tasks.unique_or_raise", "--args", '["k"]')


def refused_again(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        call_command("enqueue", *args, stdout=StringIO(), stderr=StringIO())
    assert caught.value.returncode == 2
    return str(caught.value)


def test_wait_gives_up_at_its_timeout_with_its_own_exit_code():
    out = StringIO()
    with pytest.raises(CommandError) as caught:
        call_command(
            "enqueue", "tests.tasks.record", "--args", '["x"]', "--wait", "--timeout", "0.2",
            stdout=out, stderr=StringIO(),
        )  # fmt: skip
    assert caught.value.returncode == 3
    result_id = out.getvalue().strip()
    assert str(caught.value) == (
        f"Still queued after 0.2 s: stopped waiting, the task goes on ({result_id})."
    )
    assert Job.objects.get().state == State.QUEUED


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "enqueue", *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_wait_reports_a_real_workers_outcome_in_the_exit_code(runjobs):
    runjobs.start("--queue", "default")
    done = run("tests.tasks.sleep_then_record", "--args", '["by hand", 0.1]', "--wait")
    assert done.returncode == 0, done.stderr
    result_id, outcome = done.stdout.splitlines()
    assert outcome == 'succeeded: "by hand"'
    assert Job.objects.get(result_id=result_id).state == State.SUCCEEDED

    done = run("tests.tasks.boom", "--kwargs", json.dumps({"message": "disk full"}), "--wait")
    assert done.returncode == 1, done.stderr
    result_id, outcome = done.stdout.splitlines()
    assert outcome == "failed (error) on attempt 1 of 1: ValueError: disk full"
    assert "Traceback (most recent call last)" in done.stderr
    job = Job.objects.get(result_id=result_id)
    assert (job.state, job.failure_reason) == (State.FAILED, FailureReason.ERROR)

    done = run("tests.tasks.record", "--args", "[1, 2]")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "CommandError: Not enqueued: --args: The arguments do not fit record" in done.stderr

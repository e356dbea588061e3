"""Writes the database refuses for good (a constraint, a trigger): the attempt fails with
that error, logged with its cause, and nothing retries the write for ever (issue 21)."""

import signal

import pytest
from django.db import connection

from django_jobstate.models import Job
from django_jobstate.states import FailureReason, State
from tests import tasks
from tests.test_runjobs import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

REFUSAL = "a test trigger refuses this write"


@pytest.fixture
def refuse():
    """refuse(condition): the database refuses every UPDATE of a job row for which the SQL
    `condition` (on NEW) holds, with an IntegrityError, until the test ends."""

    def make(condition: str) -> None:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(
                    "CREATE OR REPLACE FUNCTION jobstate_test_refuse() RETURNS trigger "
                    f"LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION '{REFUSAL}' "
                    "USING ERRCODE = 'check_violation'; END $$"
                )
                cursor.execute(
                    "CREATE TRIGGER jobstate_test_refuse BEFORE UPDATE ON django_jobstate_job "
                    f"FOR EACH ROW WHEN ({condition}) EXECUTE FUNCTION jobstate_test_refuse()"
                )
            elif connection.vendor == "mysql":  # SIGNAL: error 1644, an OperationalError
                cursor.execute(
                    "CREATE TRIGGER jobstate_test_refuse BEFORE UPDATE ON django_jobstate_job "
                    f"FOR EACH ROW BEGIN IF {condition} THEN "
                    f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{REFUSAL}'; END IF; END"
                )
            else:
                cursor.execute(
                    "CREATE TRIGGER jobstate_test_refuse BEFORE UPDATE ON django_jobstate_job "
                    f"FOR EACH ROW WHEN {condition} BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END"
                )

    yield make
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("DROP TRIGGER IF EXISTS jobstate_test_refuse ON django_jobstate_job")
            cursor.execute("DROP FUNCTION IF EXISTS jobstate_test_refuse()")
        else:
            cursor.execute("DROP TRIGGER IF EXISTS jobstate_test_refuse")


def failed_with_the_refusal(job: Job, what: str) -> None:
    assert (job.state, job.failure_reason) == (State.FAILED, FailureReason.ERROR)
    # MariaDB/MySQL name a trigger's refusal OperationalError; it is refused for good all
    # the same (managers/conflicts.py MYSQL_PASSING)
    kind = "OperationalError" if connection.vendor == "mysql" else "IntegrityError"
    assert job.error_class == f"django.db.utils.{kind}"
    assert f"The database refused to record {what}, and would refuse it again" in (
        job.error_message
    )
    assert REFUSAL in job.error_message
    assert Job.objects.filter(result_id=job.result_id).count() == 1, "it was retried"


@pytest.mark.parametrize("in_flight", ["1", "4"])
def test_a_success_the_database_refuses_fails_that_attempt_and_the_others_are_written(
    runjobs, refuse, in_flight
):
    results = [tasks.record.enqueue(f"r{i}") for i in range(4)]
    refused = Job.objects.get(result_id=results[1].id)
    refuse(f"NEW.id = {refused.pk} AND NEW.state = 'succeeded'")
    done = runjobs.run("--burst", "--in-flight", in_flight)
    assert done.returncode == 0, done.stdout
    failed_with_the_refusal(Job.objects.get(pk=refused.pk), "its success")
    assert "refused to record its success" in done.stdout  # logged, with its cause
    for result in results[:1] + results[2:]:
        [job] = Job.objects.filter(result_id=result.id)
        assert job.state == State.SUCCEEDED, done.stdout


def test_a_failure_the_database_refuses_fails_that_attempt_with_the_refusal(runjobs, refuse):
    boom = tasks.boom.enqueue("no luck")
    after = tasks.record.enqueue("after")
    refused = Job.objects.get(result_id=boom.id)
    refuse(f"NEW.id = {refused.pk} AND NEW.error_class = 'builtins.ValueError'")
    done = runjobs.run("--burst")
    assert done.returncode == 0, done.stdout
    failed_with_the_refusal(Job.objects.get(pk=refused.pk), "its failure as error")
    assert Job.objects.get(result_id=after.id).state == State.SUCCEEDED
    assert "Traceback" in done.stdout
    assert REFUSAL in done.stdout


def test_a_write_of_the_supervisor_the_database_refuses_is_not_retried_for_ever(runjobs, refuse):
    """The supervisor kills a worker at its attempt's deadline and fails that attempt as
    timed out: refused for good, it fails with the refusal, and the supervisor's other
    writes go on (it stops at once when told to)."""
    late = tasks.sync_sleeps_past_its_timeout.enqueue("late")
    refused = Job.objects.get(result_id=late.id)
    refuse(f"NEW.id = {refused.pk} AND NEW.failure_reason = 'timeout'")
    proc = runjobs.start()
    wait_for(lambda: Job.objects.get(pk=refused.pk).state == State.FAILED, timeout=60)
    failed_with_the_refusal(Job.objects.get(pk=refused.pk), "its failure as timeout")
    after = tasks.record.enqueue("after")
    wait_for(lambda: Job.objects.get(result_id=after.id).state == State.SUCCEEDED, timeout=60)
    output = runjobs.stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, output
    assert "refused to record its failure as timeout" in output
    assert "will retry" not in output

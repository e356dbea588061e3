"""Workflows and depends_on (workflows/, managers/deps.py): held until every upstream
succeeded, failures and cancels passed on, an operator's retry that lets them go on, the
canvas (chain, group, chord), and what completion costs. Jobs run in an in-process
burst Worker; the race with real `runjobs` processes is in test_workflows_race.py."""

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobstate.exceptions import UnknownDependency
from django_jobstate.limits.concurrency import Hold
from django_jobstate.managers.queue_claim import forget_run_time_limits
from django_jobstate.managers.rate_claim import forget_rated_tasks
from django_jobstate.models import Job, JobDependency
from django_jobstate.runner.worker import Worker
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import TaskResultStatus, task_backends
from django_jobstate.workflows import chain, chord, get_workflow, group, step
from tests import workflow_tasks as t
from tests.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def run() -> None:
    """Run every runnable job, and those they release, until none is left."""
    for _ in range(50):
        Worker(burst=True, poll_interval=0.05).run()
        if not Job.objects.runnable().exists():
            return


def labels() -> list[str]:
    return list(Execution.objects.order_by("pk").values_list("label", flat=True))


def newest(result_id: object) -> Job:
    return Job.objects.filter(result_id=result_id).order_by("-attempt").first()


# depends_on


def test_a_job_waits_until_its_upstream_succeeded_never_earlier() -> None:
    a = t.step_value.enqueue(1)
    b = t.step_value.using(depends_on=[a.id]).enqueue(2)
    held = newest(b.id)
    assert (held.hold, held.pending_deps) == (Hold.DEPS, 1)
    assert not Job.objects.runnable().filter(pk=held.pk).exists()  # the claim never sees it
    assert newest(a.id).has_dependents
    run()
    assert labels() == ["value:1", "value:2"]
    assert newest(b.id).state == State.SUCCEEDED


def test_an_upstream_that_already_succeeded_counts_as_done() -> None:
    a = t.step_value.enqueue(1)
    run()
    b = t.step_value.using(depends_on=[a]).enqueue(2)  # a TaskResult is taken too
    assert (newest(b.id).hold, newest(b.id).pending_deps) == (None, 0)
    run()
    assert labels() == ["value:1", "value:2"]


def test_a_job_waits_for_every_upstream() -> None:
    ups = [t.step_value.enqueue(i) for i in range(3)]
    b = t.step_value.using(depends_on=[u.id for u in ups]).enqueue(9)
    assert newest(b.id).pending_deps == 3
    for i, up in enumerate(ups[:2]):
        job = Job.objects.get(result_id=up.id)
        [claimed] = Job.objects.claim("w", limit=1, queues=["default"])
        Job.objects.succeed_many("w", [(claimed, i)])
    assert (newest(b.id).hold, newest(b.id).pending_deps) == (Hold.DEPS, 1)
    run()
    assert labels()[-1] == "value:9"
    assert job is not None


def test_unknown_result_ids_are_a_clear_error_and_nothing_is_written() -> None:
    missing = uuid.uuid4()
    with pytest.raises(UnknownDependency, match=str(missing)):
        t.step_value.using(depends_on=[missing]).enqueue(1)
    with pytest.raises(UnknownDependency, match="neither"):
        t.step_value.using(depends_on=["not an id"])
    assert not Job.objects.exists()


def test_a_retry_that_succeeds_counts_and_the_dependent_runs_once_after_it() -> None:
    a = t.fails_twice.enqueue("a")
    b = t.step_value.using(depends_on=[a.id]).enqueue("after")
    run()
    assert labels() == ["fails_twice:a:1", "fails_twice:a:2", "fails_twice:a:3", "value:after"]
    assert Job.objects.filter(result_id=a.id).count() == 3
    assert newest(b.id).state == State.SUCCEEDED


# failures, cancels, and an operator's retry


def test_an_upstream_that_fails_for_good_fails_what_waits_on_it_transitively() -> None:
    wf = chain(step(t.boom_step, "first"), step(t.step_value, 2), step(t.step_value, 3)).enqueue()
    run()
    assert labels() == ["boom:first"]  # nothing after it ever started
    first, second, third = (Job.objects.get(result_id=s.id) for s in wf.steps)
    for job in (second, third):
        assert job.state == State.FAILED
        assert job.failure_reason == FailureReason.UPSTREAM_FAILED
        assert job.started_at is None
        assert job.worker_id is None
        assert job.error_class.endswith("UpstreamFailed")
        assert f"boom_step (result id {first.result_id}, job {first.pk})" in job.error_message
        assert "first went wrong" in job.error_message
        assert Job.objects.filter(result_id=job.result_id).count() == 1  # never retried
    wf.refresh()
    assert wf.status == TaskResultStatus.FAILED


def test_a_cancelled_upstream_cancels_what_waits_on_it() -> None:
    a = t.step_value.enqueue(1)
    b = t.step_value.using(depends_on=[a.id]).enqueue(2)
    c = t.step_value.using(depends_on=[b.id]).enqueue(3)
    task_backends["default"].cancel(a.id)
    for result in (b, c):
        job = newest(result.id)
        assert (job.state, job.failure_reason) == (State.FAILED, FailureReason.CANCELLED)
        assert job.cancel_requested_at is not None
        assert job.hold is None
        assert "was cancelled" in job.error_message
    run()
    assert labels() == []


def test_a_step_enqueued_after_its_upstream_failed_fails_at_once() -> None:
    a = t.boom_step.enqueue("early")
    run()
    b = t.step_value.using(depends_on=[a.id]).enqueue(2)
    assert b.status == TaskResultStatus.FAILED
    assert newest(b.id).failure_reason == FailureReason.UPSTREAM_FAILED


def test_an_operators_retry_of_the_failed_upstream_lets_the_workflow_go_on() -> None:
    wf = chain(
        step(t.fails_until_allowed, "x"),
        step(t.step_value, 2),
        step(t.step_value, 3).receive("label"),
    ).enqueue()
    run()
    first, second, third = wf.steps
    assert newest(second.id).failure_reason == FailureReason.UPSTREAM_FAILED
    Execution.objects.create(label="allow:x")  # the operator fixes the cause, then Retry
    Job.objects.retry(newest(first.id))
    for result in (second, third):  # back as new attempts, held again
        attempt = newest(result.id)
        assert (attempt.attempt, attempt.state, attempt.hold) == (2, State.QUEUED, Hold.DEPS)
        assert attempt.max_attempts == 2  # the attempt that never ran is not counted
    run()
    assert labels()[-2:] == ["value:2", "2"]  # the third received the second's result
    wf.refresh()
    assert wf.status == TaskResultStatus.SUCCESSFUL
    assert wf.return_value == 3


# the canvas


def test_a_chain_passes_the_previous_result_to_a_step_that_asks_for_it() -> None:
    wf = chain(step(t.step_value, 3), step(t.square).receive("x"), step(t.add, b=1).receive("a"))
    result = wf.enqueue()
    assert {job.workflow_id for job in Job.objects.all()} == {uuid.UUID(result.id)}
    run()
    assert labels() == ["value:3", "square:3", "add:9+1"]
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 10)
    assert get_workflow(result.id).return_value == 10


def test_a_chord_callback_gets_the_group_results_in_order_once() -> None:
    wf = chord(group(step(t.step_value, i) for i in range(6)), step(t.total)).enqueue()
    callback = Job.objects.get(result_id=wf.steps[-1].id)
    assert (callback.hold, callback.pending_deps) == (Hold.DEPS, 6)
    run()
    assert labels().count("total:[0, 1, 2, 3, 4, 5]") == 1
    assert labels()[-1] == "total:[0, 1, 2, 3, 4, 5]"
    assert get_workflow(wf.id).return_value == 15


def test_a_group_returns_its_results_in_order() -> None:
    wf = group(
        step(t.step_value, 1), chain(step(t.step_value, 2), step(t.square).receive("x"))
    ).enqueue()
    run()
    wf.refresh()
    assert wf.return_value == [1, 4]


def test_enqueue_writes_every_step_or_none() -> None:
    with pytest.raises(TypeError):
        chain(step(t.step_value, 1), step(t.step_value, object())).enqueue()
    assert not Job.objects.exists()
    assert not JobDependency.objects.exists()


def test_a_group_of_many_steps_is_written_in_one_insert() -> None:
    with CaptureQueriesContext(connections["default"]) as queries:
        chord(group(step(t.step_value, i) for i in range(500)), step(t.total)).enqueue()
    inserts = [q for q in queries.captured_queries if q["sql"].startswith("INSERT INTO")]
    job_inserts = [
        q
        for q in inserts
        if 'django_jobstate_job"' in q["sql"] or "`django_jobstate_job`" in q["sql"]
    ]
    assert len(job_inserts) == 2, [q["sql"][:80] for q in inserts]  # the group, the callback
    assert Job.objects.count() == 501
    assert JobDependency.objects.count() == 500


def test_completion_costs_the_same_statements_per_step_whatever_the_group_size() -> None:
    def per_step(size: int) -> list[int]:
        Job.objects.all().delete()
        chord(group(step(t.step_value, i) for i in range(size)), step(t.total)).enqueue()
        counts = []
        for claimed in Job.objects.claim("w", limit=size, queues=["default"]):
            with CaptureQueriesContext(connections["default"]) as queries:
                assert Job.objects.succeed_many("w", [(claimed, 0)]) == {claimed.pk}
            counts.append(len(queries.captured_queries))
        return counts

    small, large = per_step(3), per_step(30)
    assert max(large) == max(small), (small, large)  # the last one releases the callback
    assert max(large) <= 16, large  # a constant: MariaDB's forms take a few more


def test_an_ordinary_claim_is_unchanged_by_held_steps() -> None:
    def claim_statements() -> list[str]:
        # Both claims read what a claim caches for a second (the queues' run-time limits, the
        # tasks' rates): however long a loaded machine takes between them.
        forget_run_time_limits()
        forget_rated_tasks()
        with CaptureQueriesContext(connections["default"]) as queries:
            claimed = Job.objects.claim("w", limit=100, queues=["default"])
        assert len(claimed) == 20  # never a held step
        return [q["sql"] for q in queries.captured_queries]

    t.step_value.using().get_backend().bulk_enqueue(t.step_value, [((i,), {}) for i in range(20)])
    alone = claim_statements()
    Job.objects.all().delete()
    chord(group(step(t.step_value, i) for i in range(20)), step(t.total)).enqueue()
    beside_steps = claim_statements()
    assert len(beside_steps) == len(alone)  # the same statements: no scan of other jobs
    assert not any("jobdependency" in sql.lower() for sql in beside_steps)


# with the rest of the package


def test_a_unique_step_that_is_deduplicated_still_holds_its_dependents() -> None:
    holder = t.unique_value.enqueue(7)
    wf = chord(group(step(t.unique_value, 7), step(t.step_value, 1)), step(t.total)).enqueue()
    assert wf.steps[0].id == holder.id  # the live job with the key stands in for the step
    assert Job.objects.filter(task_path__endswith="unique_value").count() == 1
    assert newest(holder.id).has_dependents
    run()
    assert labels().count("unique_value:7") == 1
    assert labels()[-1] == "total:[7, 1]"


def test_cancelling_a_held_step_cancels_what_comes_after_it() -> None:
    wf = chain(step(t.step_value, 1), step(t.step_value, 2), step(t.step_value, 3)).enqueue()
    task_backends["default"].cancel(wf.steps[1].id)
    run()
    assert labels() == ["value:1"]
    third = newest(wf.steps[2].id)
    assert (third.state, third.failure_reason) == (State.FAILED, FailureReason.CANCELLED)
    wf.refresh()
    assert wf.status == TaskResultStatus.FAILED


def test_a_step_cancelled_while_held_and_retried_later_receives_what_it_waited_for() -> None:
    wf = chain(step(t.step_value, 3), step(t.square).receive("x")).enqueue()
    task_backends["default"].cancel(wf.steps[1].id)  # held: it never received x
    run()
    assert labels() == ["value:3"]

    Job.objects.retry(newest(wf.steps[1].id))  # its upstream done: due at once
    run()
    assert labels() == ["value:3", "square:3"]
    assert get_workflow(wf.id).return_value == 9


def test_metadata_of_a_step_is_kept() -> None:
    wf = chain(step(t.step_value.using(metadata={"batch": 4}), 1), step(t.step_value, 2)).enqueue()
    assert newest(wf.steps[0].id).metadata == {"batch": 4}


def test_a_step_released_into_a_paused_queue_waits_for_the_resume() -> None:
    backend = task_backends["default"]
    wf = chain(step(t.step_value, 1), step(t.step_value.using(queue_name="emails"), 2)).enqueue()
    backend.pause_queue("emails", by="test")
    run()
    assert labels() == ["value:1"]
    second = newest(wf.steps[1].id)
    assert (second.state, second.hold) == (State.QUEUED, None)  # released, not claimed
    assert Job.objects.claim("w", queues=["emails"]) == []
    backend.resume_queue("emails", by="test")
    Worker(burst=True, poll_interval=0.05, queues=["emails"]).run()
    assert labels() == ["value:1", "value:2"]


def test_a_step_can_wait_for_a_scheduled_job() -> None:
    """A schedule's tick is a job like any other: a step may depend on its result id."""
    ticked = Job.objects.enqueue(
        "tests.workflow_tasks.step_value",
        args=[5],
        schedule_name="every-minute",
        scheduled_for=timezone.now().replace(microsecond=0),
    )
    after = t.add.using(depends_on=[ticked.result_id]).enqueue(1, 2)
    assert newest(after.id).hold == Hold.DEPS
    run()
    assert labels() == ["value:5", "add:1+2"]


# prunejobs


def test_prune_keeps_a_result_a_waiting_step_receives_and_drops_the_edges_with_the_tasks() -> None:
    backend = task_backends["default"]
    emails = step(t.step_value.using(queue_name="emails"), 2)
    wf = chord(group(step(t.step_value, 1), emails), step(t.total)).enqueue()
    backend.pause_queue("emails", by="test")
    run()
    assert labels() == ["value:1"]
    long_ago = timezone.now() - timedelta(days=30)
    Job.objects.filter(state=State.SUCCEEDED).update(finished_at=long_ago)

    # The callback is still to receive value:1's result: pruned, it would get None.
    assert Job.objects.prune(timedelta(days=7)) == 0
    backend.resume_queue("emails", by="test")
    Worker(burst=True, poll_interval=0.05, queues=["emails"]).run()
    run()
    assert labels() == ["value:1", "value:2", "total:[1, 2]"]
    assert get_workflow(wf.id).return_value == 3

    Job.objects.update(finished_at=long_ago)
    assert Job.objects.prune(timedelta(days=7)) == 3
    assert not JobDependency.objects.exists()  # no edge outlives the tasks it joined


def test_prune_keeps_a_result_a_step_failed_while_held_gets_when_brought_back() -> None:
    wf = chord(group(step(t.step_value, 1), step(t.fails_until_allowed, "x")), step(t.total))
    wf = wf.enqueue()
    run()
    callback = newest(wf.steps[-1].id)
    assert callback.failure_reason == FailureReason.UPSTREAM_FAILED
    Job.objects.update(finished_at=timezone.now() - timedelta(days=30))

    # Successes kept 7 days, failures longer (JOBSTATE_RETENTION): the callback is not
    # live, but the retry of the failed step brings it back, held again, to be given 1.
    assert Job.objects.prune(timedelta(days=7), states=[State.SUCCEEDED]) == 0
    Execution.objects.create(label="allow:x")
    Job.objects.retry(newest(wf.steps[1].id))
    run()
    assert labels()[-1] == "total:[1, 'x']"


def test_a_dependent_written_after_the_prune_chose_its_tasks_keeps_its_upstream() -> None:
    a = t.step_value.enqueue(1)
    run()
    Job.objects.update(finished_at=timezone.now() - timedelta(days=30))
    chosen = list(Job.objects.prunable(timedelta(days=7)).values_list("pk", flat=True))
    b = t.step_value.enqueue(2)
    t.step_value.using(depends_on=[a.id, b.id]).enqueue(3)  # commits before the batch

    assert Job.objects._delete_tasks(connection.alias, chosen) == 0  # the batch checks again
    assert Job.objects.filter(result_id=a.id).exists()


# the race with an upstream that finishes while a dependent is enqueued


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite serializes every writer")
@pytest.mark.parametrize("first", ["success", "enqueue"])
def test_an_upstream_finishing_while_a_dependent_is_enqueued(first: str) -> None:
    """Whichever commits first, the dependent runs exactly once, after its upstream."""
    a = t.step_value.enqueue(1)
    [claimed] = Job.objects.claim("w", queues=["default"])
    inside, go = threading.Event(), threading.Event()
    results = {}

    def hold_open(action) -> None:
        from django.db import transaction

        try:
            with transaction.atomic():
                results[action.__name__] = action()
                inside.set()
                go.wait(30)
        finally:
            connections.close_all()

    def success():
        return Job.objects.succeed_many("w", [(claimed, 1)])

    def enqueue():
        return t.step_value.using(depends_on=[a.id]).enqueue(2)

    one, other = (success, enqueue) if first == "success" else (enqueue, success)
    holder = threading.Thread(target=hold_open, args=(one,))
    holder.start()
    assert inside.wait(30)

    def wait_then_write() -> None:
        try:
            results[other.__name__] = other()
        finally:
            connections.close_all()

    waiter = threading.Thread(target=wait_then_write)
    waiter.start()
    waiter.join(0.5)  # it waits for the holder's row lock
    go.set()
    holder.join(30)
    waiter.join(30)
    assert results["success"] == {claimed.pk}
    b = results["enqueue"]
    run()
    assert labels() == ["value:2"]  # a was claimed by hand: only b ran, once
    assert newest(b.id).state == State.SUCCEEDED


def test_the_admin_says_a_held_step_waits_for_what_it_depends_on() -> None:
    from django_jobstate.admin.holds import held_html

    wf = chain(step(t.step_value, 1), step(t.step_value, 2)).enqueue()
    assert "waits for 1 task(s) it depends on" in held_html(newest(wf.steps[1].id))

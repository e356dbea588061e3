"""The supervisor's one LISTEN connection (relay.py), against the real PostgreSQL: each
worker's pipe gets its supervisor's queues' payloads, a full pipe never blocks it, a killed
connection comes back; and under a real `runjobs`, one listener per supervisor."""

import json
import multiprocessing
import threading
import time
import uuid

import pytest
from django.db import connection

from django_jobstate.db.notify import CHANNEL, queue_payload
from django_jobstate.models import Job
from django_jobstate.runner.relay import CHUNK, WAKE_ALL, Relay, _chunks
from django_jobstate.runner.wakeup import Inbox, Waiter
from tests import tasks
from tests.factories import JobFactory
from tests.waiting import wait_for

POSTGRES = connection.vendor == "postgresql"
pytestmark = [
    pytest.mark.skipif(not POSTGRES, reason="LISTEN/NOTIFY is PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
]


def sql(query, params=()):
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall()


@pytest.fixture
def relay():
    cancels = threading.Event()
    relay = Relay(multiprocessing.get_context("spawn"), ["default", "emails"], cancels.set)
    relay.cancels = cancels
    relay.start()
    assert relay.listening.wait(30), "the relay never listened"
    yield relay
    relay.finish()
    assert not relay.is_alive()


def test_each_worker_hears_its_supervisors_queues_and_cancels_reach_the_monitor(relay):
    inboxes = [Inbox(relay.add(f"w{n}")) for n in range(2)]
    waiters = [Waiter(threading.Event(), queues=["default", "emails"], inbox=i) for i in inboxes]

    tasks.record.using(queue_name="reports").enqueue("not this supervisor's queue")
    tasks.email.using(priority=4).enqueue("ada@example.com")
    for waiter in waiters:
        waiter.wait(30)
        [payload] = waiter.payloads
        assert payload.startswith("emails 4@"), "the relay passed on another queue's job"

    assert not relay.cancels.is_set()
    Job.objects.cancel(JobFactory(running=True))  # its NOTIFY goes to the cancel channel
    assert relay.cancels.wait(30), "the monitor was not told of the cancel request"
    assert all(inbox.receive(0.2) == [] for inbox in inboxes), "a cancel woke the workers"


def jobs_of(payloads: list[str]) -> list[str]:
    """The queue and priority of each payload (an enqueue's says its run_after too)."""
    return [payload.partition("@")[0] for payload in payloads]


def test_a_worker_that_ended_gets_nothing_and_the_others_still_do(relay):
    gone, alive = Inbox(relay.add("gone")), Inbox(relay.add("alive"))
    relay.remove("gone")
    tasks.record.enqueue("after")
    wait_for(lambda: jobs_of(alive.receive(0.1)) == ["default 0"], what="the payload")
    assert gone.receive(0.2) == []
    assert gone.closed


def test_a_full_pipe_drops_wake_ups_and_never_blocks_the_relay(relay):
    busy, idle = Inbox(relay.add("busy")), Inbox(relay.add("idle"))
    relay.queues = None  # this test's queues are not the fixture's
    # 2,000 distinct payloads of ~80 bytes: more than a pipe holds (64 KiB on Linux).
    flood = [queue_payload(f"{n:04d}-{'q' * 70}", 0) for n in range(2000)]
    sql("SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS payload", [CHANNEL, flood])
    wait_for(lambda: relay.dropped > 0, what="a pipe to fill")

    # The busy worker reads nothing, yet the other one hears the next jobs. (At load 20 the
    # relay was still passing the flood to it when the test enqueued: its full pipe
    # dropped that one wake-up, as it should. So each try empties it and enqueues again.)
    def carried_on() -> bool:
        idle.receive(0)
        tasks.record.enqueue("after the flood")
        return "default 0" in jobs_of(idle.receive(2.0) + idle.receive(0.5))

    wait_for(carried_on, what="the relay to carry on")

    # Whole payloads, in order, up to the first that did not fit (and then, maybe, the
    # short one of the next job, if the room left took it).
    flooded = [payload for payload in busy.receive(0) if not payload.startswith("default 0@")]
    assert 0 < len(flooded) < len(flood)
    assert flooded == flood[: len(flooded)]
    tasks.record.enqueue("once read")
    wait_for(
        lambda: "default 0" in jobs_of(busy.receive(0.1)), what="the busy worker's next payload"
    )


def test_a_killed_listen_connection_comes_back_and_wakes_every_worker(relay, caplog):
    inbox = Inbox(relay.add("w"))
    (killed,) = sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
        "current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN %%'"
    )
    assert killed == (True,)
    wait_for(lambda: not relay.listening.is_set(), what="the relay to notice")
    assert relay.listening.wait(30), "the relay did not listen again"
    # It missed what was enqueued meanwhile: every worker looks at the head once.
    wait_for(lambda: WAKE_ALL in inbox.receive(0.1), what="the wake-up after the outage")
    tasks.record.enqueue("after the outage")
    wait_for(lambda: "default 0" in jobs_of(inbox.receive(0.1)), what="the next payload")
    events = [getattr(r, "event", None) for r in caplog.records]
    assert "wakeup.lost" in events
    assert "wakeup.restored" in events


def test_payloads_go_in_whole_chunks_that_a_pipe_takes_or_refuses_whole():
    payloads = [queue_payload(f"{n:03d}" + "q" * 90, n % 200 - 100) for n in range(200)]
    chunks = _chunks([*payloads, "x" * 9000])  # a NOTIFY by hand, too long: wakes every worker
    assert all(len(chunk) <= CHUNK for chunk in chunks)
    received = b"".join(chunks).split(b"\0")
    assert received[-1] == b""
    assert [p.decode() for p in received[:-1]] == [*payloads, WAKE_ALL]


def idle_claimers(application: str) -> int:
    """Worker connections idle after a claim that found nothing (the claim of a worker of
    all queues begins by listing the queues that have jobs, WITH RECURSIVE queue, and,
    once a second, the tasks a rate holds, WITH RECURSIVE pair: managers/rate_claim.py)."""
    return sql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
        "AND state = 'idle' AND (query LIKE '%%WITH RECURSIVE queue%%' "
        "OR query LIKE '%%WITH RECURSIVE pair%%')",
        [application],
    )[0][0]


@pytest.mark.slow
def test_a_supervisor_holds_one_listener_and_one_connection_per_worker(runjobs):
    application = f"jobstate-{uuid.uuid4().hex[:8]}"
    proc = runjobs.start("--concurrency", "4", "--poll-interval", "30", PGAPPNAME=application)

    def count() -> tuple[int, int]:
        return sql(
            "SELECT count(*), count(*) FILTER (WHERE query LIKE 'LISTEN %%') "
            "FROM pg_stat_activity WHERE application_name = %s",
            [application],
        )[0]

    seen = []
    # 4 workers + the relay's LISTEN + the monitor + its heart + its judge + the scheduler;
    # were each worker to LISTEN for itself, as before the relay: 13.
    wait_for(lambda: seen.append(count()) or seen[-1] == (9, 1), timeout=120, what="9 / 1")
    for _ in range(20):
        seen.append(count())
        time.sleep(0.1)
    assert max(total for total, _ in seen) == 9, seen
    assert max(listening for _, listening in seen) == 1, seen

    # Every worker idle until its next poll, 30 s away: a notification must wake one.
    wait_for(lambda: idle_claimers(application) == 4, timeout=60, what="4 idle workers")
    result = tasks.record.enqueue("woken")
    enqueued = time.monotonic()
    wait_for(lambda: tasks.record.get_result(result.id).is_finished, timeout=60)
    assert time.monotonic() - enqueued < 15, "the worker waited for its poll"
    out = runjobs.stop(proc)
    assert proc.returncode == 0, out


@pytest.mark.slow
def test_the_listener_connects_with_the_listen_database_alias(runjobs):
    direct = {**connection.settings_dict, "TEST": {"MIRROR": "default"}}
    settings = {
        "DATABASES": {
            "default": {**direct, "OPTIONS": {"application_name": "jobstate-work"}},
            "listen": {**direct, "OPTIONS": {"application_name": "jobstate-listen"}},
        },
        "JOBSTATE_LISTEN_DATABASE": "listen",
    }
    proc = runjobs.start(
        "--concurrency", "2", "--no-schedules", JOBSTATE_TEST_SETTINGS=json.dumps(settings)
    )

    def listeners() -> list[tuple[str, int]]:
        return sql(
            "SELECT application_name, count(*) FROM pg_stat_activity "
            "WHERE query LIKE 'LISTEN %%' AND application_name LIKE 'jobstate-%%' GROUP BY 1"
        )

    wait_for(lambda: listeners() == [("jobstate-listen", 1)], timeout=60, what="the listener")
    result = tasks.record.enqueue("through the alias")
    wait_for(lambda: tasks.record.get_result(result.id).is_finished, timeout=60)
    out = runjobs.stop(proc)
    assert proc.returncode == 0, out


def test_a_schedule_made_in_the_admin_wakes_the_supervisors_scheduler():
    from django_jobstate.schedules import edits
    from django_jobstate.schedules.definitions import Definition

    schedules = threading.Event()
    relay = Relay(multiprocessing.get_context("spawn"), None, lambda: None, schedules.set)
    relay.start()
    try:
        assert relay.listening.wait(30), "the relay never listened"
        inbox = Inbox(relay.add("w"))
        edits.add(Definition(name="poll", task_path="tests.tasks.noop", every=60))
        assert schedules.wait(30), "the scheduler was not woken"
        assert inbox.receive(0.2) == [], "a schedule's change woke the workers"
    finally:
        relay.finish()

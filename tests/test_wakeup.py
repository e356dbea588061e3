"""The Waiter: what wakes it, what it reports, read from its own LISTEN connection or from
the pipe of a supervisor's relay (its inbox). The relay itself: tests/test_relay.py."""

import multiprocessing
import os
import threading
import time
from datetime import UTC, datetime

import pytest
from django.db import connection

from django_jobstate.db.notify import queue_payload
from django_jobstate.runner.wakeup import Inbox, Waiter
from tests import tasks

POSTGRES = connection.vendor == "postgresql"


@pytest.fixture
def pipe():
    """(inbox, write): a worker's end of a relay pipe, and a writer of bytes to it."""
    reader, writer = multiprocessing.get_context("spawn").Pipe(duplex=False)

    def write(*payloads: str, raw: bytes = b"") -> None:
        os.write(writer.fileno(), b"".join(p.encode() + b"\0" for p in payloads) + raw)

    write.close = writer.close  # type: ignore[attr-defined]
    yield Inbox(reader), write
    writer.close()
    reader.close()


def test_a_waiter_on_an_inbox_wakes_for_its_queues_only(pipe):
    inbox, write = pipe
    waiter = Waiter(threading.Event(), queues=["emails"], inbox=inbox)
    write(queue_payload("default", 0))
    started = time.monotonic()
    waiter.wait(0.3)
    assert time.monotonic() - started >= 0.25, "woken by another queue's job"
    assert waiter.payloads == []

    write(queue_payload("emails", 3), queue_payload("emails", 7))
    waiter.wait(30)
    assert waiter.payloads == ["emails 3"]  # the first; the second waits for ahead()
    assert waiter.ahead(5)
    assert not waiter.ahead(5), "read once"


def test_heard_says_whether_a_job_of_its_queues_came_since_the_last_look(pipe):
    inbox, write = pipe
    waiter = Waiter(threading.Event(), queues=["default"], inbox=inbox)
    assert not waiter.heard()
    write(queue_payload("emails", 50))
    assert not waiter.heard(), "another queue's job"
    write(queue_payload("default", -100), queue_payload("default", 0))
    assert waiter.heard()  # any priority
    assert not waiter.heard(), "consumed"
    write(queue_payload(""))
    assert waiter.heard(), "a payload of no known queue wakes every worker"


def test_ahead_counts_what_woke_the_worker_and_what_heard_read(pipe):
    """A worker that claims from a key learns where to look from the notifications that
    woke it too: wait() and heard() (the --in-flight loop's) read them first."""
    inbox, write = pipe
    waiter = Waiter(threading.Event(), queues=["default"], inbox=inbox)
    write(queue_payload("default", 9))
    waiter.wait(30)
    assert waiter.ahead(0), "the payload that woke wait() was not counted"
    write(queue_payload("default", 9))
    assert waiter.heard()
    assert waiter.ahead(0), "the payload that heard() read was not counted"
    assert not waiter.ahead(0), "read once"


def test_ahead_compares_the_announced_run_after_with_the_key(pipe):
    inbox, write = pipe
    waiter = Waiter(threading.Event(), queues=["default"], inbox=inbox)
    key = datetime(2026, 12, 3, 14, 0, 5, tzinfo=UTC).timestamp()
    write(queue_payload("default", 0, datetime(2026, 12, 3, 14, 0, 6, tzinfo=UTC)))
    assert not waiter.ahead(0, key), "a later job sorts after the key"
    write(queue_payload("default", 0, datetime(2026, 12, 3, 14, 0, 4, 999_999, tzinfo=UTC)))
    assert waiter.ahead(0, key), "a job with an older run_after sorts before the key"
    write(queue_payload("default", 0, datetime(2026, 12, 3, 14, 0, 5, 700_000, tzinfo=UTC)))
    # Rounded down to its second, a job of the key's second is taken as before it (it may
    # be): a look from the head too many, never a job missed.
    assert waiter.ahead(0, key + 0.5)
    write(queue_payload("default", -1, datetime(2020, 1, 1, tzinfo=UTC)))
    assert not waiter.ahead(0, key), "a lower priority sorts after the key, however old"
    write(queue_payload("default", 0))
    assert waiter.ahead(0, key), "a job whose run_after is not said sorts first"
    write(queue_payload("default", 0, datetime(2020, 1, 1, tzinfo=UTC)))
    assert not waiter.ahead(0), "a draining worker's key: a higher priority only"


def test_a_payload_split_across_reads_is_read_whole(pipe):
    inbox, write = pipe
    # Two writes that split one payload: the reader keeps the part until its end comes.
    waiter = Waiter(threading.Event(), queues=["emails"], inbox=inbox)
    write("emails 1", raw=b"ema")
    assert inbox.receive(0) == ["emails 1"]
    write(raw=b"ils 2\0")
    assert waiter.ahead(1)


def test_a_closed_pipe_leaves_the_waiter_to_its_poll_interval_without_spinning(pipe):
    inbox, write = pipe
    waiter = Waiter(threading.Event(), inbox=inbox)
    write.close()  # the supervisor is gone
    cpu, started = time.thread_time(), time.monotonic()
    waiter.wait(1.0)
    assert time.monotonic() - started >= 0.95
    assert time.thread_time() - cpu < 0.2, "it spun instead of sleeping"
    assert inbox.closed
    assert not waiter.heard()


def test_a_stop_ends_the_wait_promptly(pipe):
    inbox, _ = pipe
    stopping = threading.Event()
    waiter = Waiter(stopping, inbox=inbox)
    threading.Timer(0.2, stopping.set).start()
    started = time.monotonic()
    waiter.wait(30)
    assert time.monotonic() - started < 5


@pytest.mark.skipif(not POSTGRES, reason="LISTEN/NOTIFY is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_heard_on_its_own_listen_connection():
    waiter = Waiter(threading.Event(), queues=["default"])
    try:
        waiter.start()
        assert not waiter.heard()
        tasks.email.enqueue("ada@example.com")
        time.sleep(0.2)
        assert not waiter.heard(), "another queue's job"
        tasks.record.using(priority=-7).enqueue("low")
        time.sleep(0.2)
        assert waiter.heard()
        assert not waiter.heard(), "consumed"
    finally:
        waiter.close()


@pytest.mark.skipif(POSTGRES, reason="on PostgreSQL a Waiter listens")
def test_without_postgresql_or_an_inbox_the_waiter_only_sleeps():
    waiter = Waiter(threading.Event())
    waiter.start()
    started = time.monotonic()
    waiter.wait(0.2)
    assert time.monotonic() - started >= 0.15
    assert not waiter.heard()
    assert not waiter.ahead(0)

"""receivers.py: SQLite connections shared by the caller and running workers, never "locked".

With runjobs writing beside it, a transaction that reads and then writes must wait for the
write lock (the busy timeout), not fail at once: the README's own pattern, enqueue inside
your transaction after reading a row.
"""

import time

import pytest
from django.db import OperationalError, connection, transaction

from django_jobstate.models import Job
from django_jobstate.states import State
from tests import tasks
from tests.conftest import keep_a_worker_writing
from tests.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROUNDS = 200


def test_read_then_enqueue_in_a_transaction_beside_a_running_worker(runjobs):
    keep_a_worker_writing(runjobs)
    failures = []
    for i in range(ROUNDS):
        try:
            with transaction.atomic():
                Execution.objects.filter(label__startswith="busy").exists()  # read first
                time.sleep(0.002)  # the caller's own work, while the worker commits
                tasks.email.enqueue(f"user{i}@example.com")
        except OperationalError as exc:
            failures.append(str(exc))
    still_busy = Job.objects.filter(task_path__endswith="sleep_then_record", state=State.QUEUED)

    assert still_busy.exists(), "the worker finished before the rounds did: no contention"
    assert failures == [], f"{len(failures)} of {ROUNDS} transactions failed: {failures[0]}"
    assert Job.objects.filter(queue_name="emails").count() == ROUNDS


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's transaction mode")
def test_a_transaction_mode_the_project_sets_is_kept():
    from django.db import connections

    alias = "default"
    options = connections[alias].settings_dict.setdefault("OPTIONS", {})
    options["transaction_mode"] = "DEFERRED"
    try:
        connections[alias].close()
        connections[alias].ensure_connection()
        assert connections[alias].transaction_mode == "DEFERRED"
    finally:
        del options["transaction_mode"]
        connections[alias].close()
    connections[alias].ensure_connection()
    assert connections[alias].transaction_mode == "IMMEDIATE"

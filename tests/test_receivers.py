"""receivers.py: SQLite connections shared by the caller and running workers, never "locked".

With runjobs writing beside it, a transaction that reads and then writes must wait for the
write lock (the busy timeout), not fail at once: the README's own pattern, enqueue inside
your transaction after reading a row.
"""

import time

import pytest
from django.db import OperationalError, connection, transaction

from django_jobstate.conf import get_settings
from django_jobstate.models import Job
from django_jobstate.receivers import client_check_settings, dead_peer_settings, set_where_accepted
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


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's TCP settings")
@pytest.mark.parametrize("in_flight", ["1", "4"])
def test_runjobs_connections_drop_a_dead_peer_within_the_lost_after_window(runjobs, in_flight):
    """A worker cut off between its outcome's UPDATE and COMMIT would hold the row until
    the server drops its session: the server probes runjobs' connections (a worker's, its
    attempt threads') and drops a dead one well within JOBSTATE_LOST_AFTER."""
    default = dead_peer_settings(30.0)  # JOBSTATE_LOST_AFTER's default: dropped within 15 s
    probes = default["tcp_keepalives_count"] * default["tcp_keepalives_interval"]
    assert default["tcp_keepalives_idle"] + probes <= 15
    assert default["tcp_user_timeout"] == 15_000
    lost_after = get_settings().LOST_AFTER
    # This server (Linux, PostgreSQL 14+) can check for a gone client: it takes the setting.
    expected = {**dead_peer_settings(lost_after), **client_check_settings(lost_after)}
    assert expected["client_connection_check_interval"] == 1000
    result = tasks.shows_settings.enqueue(list(expected))
    done = runjobs.run("--burst", "--in-flight", in_flight)
    assert done.returncode == 0, done.stdout
    shown = Job.objects.get(result_id=result.id).return_value
    assert shown == {name: str(value) for name, value in expected.items()}
    # Not the project's own connections (this one stands for a web process's).
    with connection.cursor() as cursor:
        cursor.execute("SHOW tcp_user_timeout")
        assert cursor.fetchone() == ("0",)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's settings")
@pytest.mark.parametrize(
    "refused",
    [
        {"client_connection_check_interval": -1},  # refused as a platform refuses 1000
        {"jobstate_no_such_setting": 1},  # unknown, as before PostgreSQL 14
    ],
)
def test_a_setting_the_server_refuses_leaves_the_session_as_it_was(refused):
    """Where the server cannot check for a gone client it refuses the check's setting:
    runjobs' connections must still open, with the settings that were accepted."""
    with connection.cursor() as cursor:
        set_where_accepted(cursor, {**refused, "client_connection_check_interval": 700})
        cursor.execute("SELECT current_setting('client_connection_check_interval')")
        assert cursor.fetchone() == ("700ms",)
        set_where_accepted(cursor, refused)
        cursor.execute("SELECT current_setting('client_connection_check_interval')")
        assert cursor.fetchone() == ("700ms",)
        cursor.execute("RESET client_connection_check_interval")

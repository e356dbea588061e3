"""db/sqlite_direct.py: on SQLite a plain enqueue's INSERT goes straight to the driver while
nothing watches Django's cursors, and through Django's cursor as soon as anything does."""

import functools
import sqlite3
import threading

import pytest
from django.db import (
    DatabaseError,
    IntegrityError,
    OperationalError,
    connection,
    connections,
    transaction,
)
from django.db.backends.sqlite3.base import DatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.test.utils import CaptureQueriesContext, override_settings

from django_jobstate.db.sqlite_direct import direct_form, fetch_one, watched
from django_jobstate.models import Job
from django_jobstate.states import State
from tests import tasks

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's driver"),
]


def cursors_made(monkeypatch):
    """A count of the cursors Django's connection makes from now on. (Patched where
    watched() does not look: the connection's create_cursor, not its cursor.)"""
    made = []
    make = connection.create_cursor

    def counted(name=None):
        made.append(name)
        return make(name)

    monkeypatch.setattr(connection, "create_cursor", counted)
    return made


def test_a_plain_enqueue_makes_no_django_cursor_while_nothing_watches(monkeypatch):
    tasks.record.enqueue("warm")  # the task's plan and prepared INSERT
    connection.ensure_connection()
    assert not watched(connection)
    made = cursors_made(monkeypatch)
    result = tasks.record.enqueue("x", n=1)
    assert made == []
    job = Job.objects.get(result_id=result.id)
    assert (job.state, job.args, job.kwargs) == (State.QUEUED, ["x"], {"n": 1})
    assert (job.enqueued_at, job.run_after) == (result.enqueued_at, result.enqueued_at)


def test_the_statement_is_django_cursors_statement_in_sqlite3s_placeholders():
    sql = 'INSERT INTO "t" ("a", "b") VALUES (%s, \'50%%\') RETURNING "a"'
    expected = 'INSERT INTO "t" ("a", "b") VALUES (?, \'50%\') RETURNING "a"'
    assert direct_form(connections["default"], sql) == expected


def test_an_execute_wrapper_sees_the_insert():
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    tasks.record.enqueue("warm")
    with connection.execute_wrapper(wrapper):
        tasks.record.enqueue("x")
    assert len([s for s in seen if s.startswith("INSERT")]) == 1


def test_query_logging_counts_the_insert():
    tasks.record.enqueue("warm")
    with CaptureQueriesContext(connection) as queries:
        tasks.record.enqueue("x")
    assert [q["sql"][:6] for q in queries] == ["INSERT"]
    with override_settings(DEBUG=True):
        connection.queries_log.clear()
        tasks.record.enqueue("y")
        assert [q["sql"][:6] for q in connection.queries] == ["INSERT"]


def test_a_subclass_of_djangos_sqlite_wrapper_keeps_djangos_cursor():
    class Counting(DatabaseWrapper):  # as django-prometheus's backend
        pass

    theirs = Counting(connections["default"].settings_dict, "theirs")
    assert direct_form(theirs, "INSERT INTO t VALUES (%s)") is None


@pytest.mark.parametrize("wraps", [True, False])
def test_a_tracer_that_patches_cursorwrapper_execute_sees_the_insert(monkeypatch, wraps):
    seen = []
    execute = CursorWrapper.execute

    def traced(self, sql, params=None):
        seen.append(sql)
        return execute(self, sql, params)

    if wraps:  # as Sentry's Django integration patches it: __module__ and __name__ kept
        traced = functools.wraps(execute)(traced)

    tasks.record.enqueue("warm")
    monkeypatch.setattr(CursorWrapper, "execute", traced)
    tasks.record.enqueue("x")
    assert len([s for s in seen if s.startswith("INSERT")]) == 1


def test_a_cursor_set_on_the_connection_sees_the_insert(monkeypatch):
    seen = []
    cursor = connection.cursor

    def toolbar_cursor(*args, **kwargs):  # as django-debug-toolbar wraps a connection's
        seen.append("cursor")
        return cursor(*args, **kwargs)

    tasks.record.enqueue("warm")
    monkeypatch.setattr(connection, "cursor", toolbar_cursor)
    tasks.record.enqueue("x")
    assert seen == ["cursor"]


class TracedConnection:
    """What OpenTelemetry's sqlite3 instrumentation makes of a driver connection: a proxy
    whose cursor() traces each statement, and nothing else."""

    def __init__(self, real, seen):
        self._real, self._seen = real, seen

    def cursor(self, *args, **kwargs):
        real, seen = self._real.cursor(*args, **kwargs), self._seen

        class Traced:
            def execute(self, sql, *params):
                seen.append(sql)
                return real.execute(sql, *params)

            def __getattr__(self, name):
                return getattr(real, name)

        return Traced()

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_a_tracer_that_wraps_the_drivers_connection_sees_the_insert(monkeypatch):
    tasks.record.enqueue("warm")
    seen, ours = [], connections["default"]
    monkeypatch.setattr(ours, "connection", TracedConnection(ours.connection, seen))
    assert not watched(connection)
    tasks.record.enqueue("x")
    assert [s[:6] for s in seen] == ["INSERT"]


def test_pytest_djangos_blocker_refuses_the_insert(django_db_blocker):
    tasks.record.enqueue("warm")
    with django_db_blocker.block(), pytest.raises(RuntimeError, match="Database access"):
        tasks.record.enqueue("x")


def test_a_connection_of_another_thread_is_refused():
    tasks.record.enqueue("warm")
    ours, raised = connections["default"], []

    def elsewhere():
        try:
            fetch_one(ours, "SELECT %s", "SELECT ?", [1])
        except DatabaseError as exc:
            raised.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert len(raised) == 1
    assert "same thread" in str(raised[0])


@pytest.fixture
def refusing(request):
    """The job table refuses every INSERT, as the SQL given says."""
    tasks.record.enqueue("warm")
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TRIGGER refuse BEFORE INSERT ON django_jobstate_job "
            f"BEGIN {request.param}; END"
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER refuse")


@pytest.mark.parametrize(
    ("refusing", "error", "driver_error"),
    [
        ("SELECT RAISE(ABORT, 'refused by a trigger')", IntegrityError, sqlite3.IntegrityError),
        ("INSERT INTO no_such_table VALUES (1)", OperationalError, sqlite3.OperationalError),
    ],
    indirect=["refusing"],
)
def test_a_refused_insert_raises_djangos_error_and_writes_nothing(
    monkeypatch, refusing, error, driver_error
):
    before = Job.objects.count()
    made = cursors_made(monkeypatch)
    connection.errors_occurred = False
    with pytest.raises(error) as raised:
        tasks.record.enqueue("x")
    assert made == []  # the direct path's error
    assert isinstance(raised.value.__cause__, driver_error)
    # As Django's cursor leaves it (checked at the request's end): not for an integrity error.
    assert connection.errors_occurred is (error is not IntegrityError)
    assert Job.objects.count() == before


def test_a_broken_transaction_refuses_the_insert(monkeypatch):
    tasks.record.enqueue("warm")
    made = cursors_made(monkeypatch)
    with transaction.atomic():
        try:
            with transaction.atomic(savepoint=False), connection.cursor() as cursor:
                cursor.execute("SELECT * FROM no_such_table")
        except Exception:
            pass
        made.clear()
        with pytest.raises(transaction.TransactionManagementError):
            tasks.record.enqueue("x")
        assert made == []
        transaction.set_rollback(True)

"""db/sqlite_direct.py: on SQLite a plain enqueue's INSERT goes straight to the driver while
nothing watches Django's cursors, and through Django's cursor as soon as anything does."""

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.db.backends.utils import CursorWrapper
from django.test.utils import CaptureQueriesContext, override_settings

from django_jobstate.db.sqlite_direct import direct_form, watched
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


def test_a_tracer_that_patches_cursorwrapper_execute_sees_the_insert(monkeypatch):
    seen = []
    execute = CursorWrapper.execute

    def traced(self, sql, params=None):  # as Sentry's Django integration patches it
        seen.append(sql)
        return execute(self, sql, params)

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


def test_a_refused_insert_raises_djangos_error_and_writes_nothing():
    tasks.record.enqueue("warm")
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TRIGGER refuse BEFORE INSERT ON django_jobstate_job "
            "BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END"
        )
    try:
        assert not watched(connection)
        before = Job.objects.count()
        with pytest.raises(IntegrityError, match="refused by a trigger"):
            tasks.record.enqueue("x")
        assert Job.objects.count() == before
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse")


def test_a_broken_transaction_refuses_the_insert():
    tasks.record.enqueue("warm")
    with transaction.atomic():
        try:
            with transaction.atomic(savepoint=False), connection.cursor() as cursor:
                cursor.execute("SELECT * FROM no_such_table")
        except Exception:
            pass
        with pytest.raises(transaction.TransactionManagementError):
            tasks.record.enqueue("x")
        transaction.set_rollback(True)

"""A prepared statement sent straight to SQLite's driver, past Django's cursor (issue 28).

For an enqueue's one-row INSERT on SQLite, Django's cursor costs half as much again as the
statement: a cursor wrapper built and closed around it, the execute wrappers' chain, and
a regular expression over the statement that rewrites each %s as ? (measured inside one
transaction: 62 µs through `connection.cursor()`, 38 µs straight to sqlite3). A statement
prepared once per task (managers/prepared.py) is rewritten once, here, and sent on a
cursor of the driver's connection while nothing watches Django's cursors:

- no `connection.execute_wrapper()` is installed (Scout APM, OpenTelemetry's sqlcommenter,
  query counters);
- no query is logged (DEBUG, `assertNumQueries()`, `CaptureQueriesContext`);
- nothing replaced the connection's `cursor()` (django-debug-toolbar, ddtrace) or
  `CursorWrapper.execute` (Sentry, with or without functools.wraps);
- the connection is Django's own SQLite wrapper, not a subclass (django-prometheus).

Otherwise the statement goes through Django's cursor like any other. The direct path
keeps the rest of what `connection.cursor()` and its `execute()` do, in their order: the
health check, `ensure_connection()` (pytest-django's blocker patches it), the thread
check, the broken-transaction check, and database errors raised as Django's
(`django.db.IntegrityError`, ...). Tracers that wrap the driver's connection see it too:
the statement goes through the driver connection's `cursor()`, which OpenTelemetry's
sqlite3 instrumentation wraps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db.backends import utils

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

# Django's own CursorWrapper.execute is defined in this file; a patch (even one made with
# functools.wraps, which copies __module__ and __name__) is not.
_DJANGO_UTILS = utils.__file__


def direct_form(connection: BaseDatabaseWrapper, sql: str) -> str | None:
    """`sql` as sqlite3 takes it (qmark), where fetch_one() may send it straight to the
    driver: Django's own SQLite connection. None elsewhere."""
    if connection.vendor != "sqlite":
        return None
    from django.db.backends.sqlite3.base import FORMAT_QMARK_REGEX, DatabaseWrapper

    if type(connection) is not DatabaseWrapper:
        return None
    # What SQLiteCursorWrapper.convert_query() does at every execute().
    return FORMAT_QMARK_REGEX.sub("?", sql).replace("%%", "%")


def watched(connection: BaseDatabaseWrapper) -> bool:
    """Whether anything observes the statements of `connection` through Django's cursor."""
    code = getattr(utils.CursorWrapper.execute, "__code__", None)
    return bool(
        connection.execute_wrappers
        or connection.queries_logged
        or "cursor" in vars(connection)
        or code is None
        or code.co_filename != _DJANGO_UTILS
    )


def fetch_one(
    connection: BaseDatabaseWrapper, sql: str, direct: str | None, params: Sequence[Any]
) -> Any:
    """The first row `sql` returns; sent as `direct` (direct_form()) on a cursor of the
    driver's connection where nothing watches, through Django's cursor otherwise."""
    if direct is None or watched(connection):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    try:
        cursor = connection.connection.cursor()
        try:
            connection.validate_thread_sharing()
            connection.validate_no_broken_transaction()
            cursor.execute(direct, params)
            return cursor.fetchone()
        finally:
            cursor.close()
    except Exception:
        with connection.wrap_database_errors:  # raised as Django's, as a cursor would
            raise

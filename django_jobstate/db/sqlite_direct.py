"""A prepared statement sent straight to SQLite's driver, past Django's cursor (issue 28).

For an enqueue's one-row INSERT on SQLite, Django's cursor costs half as much again as the
statement: a cursor object built and closed around it, the execute wrappers' chain, and a
regular expression over the statement that rewrites each %s as ? (measured inside one
transaction: 62 µs through `connection.cursor()`, 38 µs straight to sqlite3). A statement
prepared once per task (managers/prepared.py) is rewritten once, here, and sent straight
to the driver while nothing watches Django's cursors:

- no `connection.execute_wrapper()` is installed (APM hooks, query counters);
- no query is logged (DEBUG, `assertNumQueries()`, `CaptureQueriesContext`);
- nothing replaced the connection's `cursor()` (django-debug-toolbar, some tracers) or
  `CursorWrapper.execute` (Sentry, other tracers);
- the connection is Django's own SQLite wrapper, not a subclass with cursors of its own.

Otherwise the statement goes through Django's cursor like any other. Either way a
database error reaches the caller as Django's (`django.db.IntegrityError`, ...), and a
transaction marked broken refuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db.backends.utils import CursorWrapper

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

_DJANGO_EXECUTE = "django.db.backends.utils"  # where CursorWrapper.execute is, unpatched


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
    return bool(
        connection.execute_wrappers
        or connection.queries_logged
        or "cursor" in vars(connection)
        or CursorWrapper.execute.__module__ != _DJANGO_EXECUTE
    )


def fetch_one(
    connection: BaseDatabaseWrapper, sql: str, direct: str | None, params: Sequence[Any]
) -> Any:
    """The first row `sql` returns; sent as `direct` (direct_form()) straight to the
    driver where nothing watches, through Django's cursor otherwise."""
    driver = connection.connection
    if direct is not None and driver is not None and not watched(connection):
        connection.validate_thread_sharing()
        connection.validate_no_broken_transaction()
        try:
            return driver.execute(direct, params).fetchone()
        except Exception:
            with connection.wrap_database_errors:  # raised as Django's, as a cursor would
                raise
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()

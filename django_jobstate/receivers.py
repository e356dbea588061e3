"""Signal receivers, connected in JobStateConfig.ready()."""

from typing import TYPE_CHECKING, Any, cast

from django.db.backends.base.base import BaseDatabaseWrapper

if TYPE_CHECKING:
    from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteDatabaseWrapper

SQLITE_BUSY_TIMEOUT_MS = 30_000


def configure_sqlite(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Let several worker processes share one SQLite file without "database is locked".

    WAL lets readers run beside the one writer; the busy timeout makes a writer wait for the
    lock instead of failing at once. The app keeps each of its writes a short transaction
    that starts with the write, so waiting is always enough.
    """
    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        if not cast("SQLiteDatabaseWrapper", connection).is_in_memory_db():
            cursor.execute("PRAGMA journal_mode = WAL")

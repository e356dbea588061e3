"""Signal receivers, connected in JobStateConfig.ready()."""

from typing import TYPE_CHECKING, Any, cast

from django.db.backends.base.base import BaseDatabaseWrapper

if TYPE_CHECKING:
    from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteDatabaseWrapper

SQLITE_BUSY_TIMEOUT_MS = 30_000


def configure_sqlite(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Let several worker processes share one SQLite file without "database is locked".

    WAL lets readers run beside the one writer; the busy timeout makes a writer wait for the
    lock instead of failing at once. But a transaction that begins by reading (BEGIN is
    DEFERRED by default) and then writes fails at once when another connection committed
    in between: in WAL mode its snapshot is stale, and SQLite cannot wait that out. So
    transactions begin IMMEDIATE, taking the write lock (waiting for it) at BEGIN: the
    caller's "read a row, then enqueue" and the admin's "read, then cancel" included.
    A project that sets DATABASES[...]["OPTIONS"]["transaction_mode"] keeps its own.
    """
    if connection.vendor != "sqlite":
        return
    sqlite = cast("SQLiteDatabaseWrapper", connection)
    if "transaction_mode" not in sqlite.settings_dict.get("OPTIONS", {}):
        # Django's BEGIN reads it; set from OPTIONS at each connect (django-stubs lacks it).
        sqlite.transaction_mode = "IMMEDIATE"  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        if not sqlite.is_in_memory_db():
            cursor.execute("PRAGMA journal_mode = WAL")

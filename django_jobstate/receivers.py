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
    Writers take turns at the write lock (db/sqlite_turns.py), so that none starves another.
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
    if not sqlite.is_in_memory_db():
        from .db.sqlite_turns import take_turns

        take_turns(connection, SQLITE_BUSY_TIMEOUT_MS / 1000)


# PostgreSQL notices a dead client (a host cut off or gone) only when TCP gives up on it,
# which with the system's defaults takes two hours or more; until then its session lives
# on, and so does any row lock it holds. On the connections of runjobs processes (the
# supervisor's and its workers', not the web processes'), the server probes a silent
# client and drops it within this share of JOBSTATE_LOST_AFTER: keepalive probes while
# nothing is in flight, tcp_user_timeout while the server's data waits unacknowledged.
# (A transaction of ours left idle ends sooner: managers.base.IDLE_IN_WRITE_SHARE.)
# A client that is gone (a worker process killed) while its statement waits on a lock is
# noticed only when that statement ends: a claim queued behind a migration's lock on the
# job table would then commit for a dead worker, after its supervisor settled it. Where
# it can, the server checks each CLIENT_CHECK_MS that the client of a running statement is
# still there, and ends the session if not (client_connection_check_interval: PostgreSQL
# 14 on Linux, 15+ on macOS and the BSDs too, never on Windows). Elsewhere the server
# refuses the setting; the session goes on without it (runner.monitor settles again).
DEAD_PEER_SHARE = 0.5
KEEPALIVE_COUNT = 3
KEEPALIVE_MAX = 32767  # seconds: Linux's limit for the idle time and the interval
CLIENT_CHECK_MS = 1000


def dead_peer_settings(lost_after: float) -> dict[str, int]:
    """PostgreSQL's per-session settings that drop a dead client within DEAD_PEER_SHARE of
    `lost_after`: idle + count x interval, or the user timeout (ms)."""
    window = lost_after * DEAD_PEER_SHARE
    idle = min(KEEPALIVE_MAX, max(1, int(window / 2)))
    interval = min(KEEPALIVE_MAX, max(1, int(window / 2 / KEEPALIVE_COUNT)))
    return {
        "tcp_keepalives_idle": idle,
        "tcp_keepalives_interval": interval,
        "tcp_keepalives_count": KEEPALIVE_COUNT,
        "tcp_user_timeout": min(2**31 - 1, max(1, int(window * 1000))),
    }


def client_check_settings(lost_after: float) -> dict[str, int]:
    """The settings that end a gone client's running statement within CLIENT_CHECK_MS (or
    DEAD_PEER_SHARE of `lost_after`, if sooner), where the server can check."""
    window_ms = int(lost_after * DEAD_PEER_SHARE * 1000)
    return {"client_connection_check_interval": min(CLIENT_CHECK_MS, max(1, window_ms))}


def set_where_accepted(cursor: Any, values: dict[str, int]) -> None:
    """Set each of `values` for the session, unless the server refuses it (a bad value, or
    one it cannot honour here; an unknown name): the session then goes on as it was."""
    for name, value in values.items():
        # DO takes no parameters: the name is ours and the value an int.
        cursor.execute(
            f"DO $$ BEGIN PERFORM set_config('{name}', '{int(value)}', false); "
            "EXCEPTION WHEN invalid_parameter_value OR undefined_object THEN NULL; END $$"
        )


def keep_alive(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Set dead_peer_settings() and, where the server can check, client_check_settings()
    on a new PostgreSQL connection of a runjobs process."""
    if connection.vendor != "postgresql":
        return
    from .conf import get_settings

    lost_after = get_settings().LOST_AFTER
    values = dead_peer_settings(lost_after)
    calls = ", ".join(["set_config(%s, %s, false)"] * len(values))
    params = [part for name, value in values.items() for part in (name, str(value))]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {calls}", params)
        set_where_accepted(cursor, client_check_settings(lost_after))


def watch_for_dead_peers() -> None:
    """Have the server drop this process's connections once their peer is dead (see
    DEAD_PEER_SHARE): the ones it has open and the ones it opens from now on. For runjobs
    processes only: a web process's connections are the project's."""
    from django.db import connections
    from django.db.backends.signals import connection_created

    connection_created.connect(keep_alive, dispatch_uid="django_jobstate.keep_alive")
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None:
            keep_alive(None, connection)

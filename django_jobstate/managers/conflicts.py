"""Writes the database ended to break a deadlock or a lock wait, made again.

MariaDB/MySQL end a transaction that would deadlock (error 1213) and roll it back whole,
and a statement that waited innodb_lock_wait_timeout for a row lock (1205) with the
statement, which atomic() turns into the whole transaction as it raises. PostgreSQL ends
a deadlock's victim too (SQLSTATE 40P01). Either way the write changed nothing: when the
transaction was ours (no caller's transaction around it), the same write again is safe,
and it is still fenced on the state it expects. InnoDB takes row locks on the secondary
indexes it updates too (the claim order, the unique indexes of migration 0009), so two
short writes of ours can deadlock where PostgreSQL's would not.

A conflict inside a caller's transaction (an atomic task's body, a caller's atomic()) is
not retried here: that transaction is gone, with the caller's writes, and only the
caller can make them again.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable

from django.db import OperationalError, connections

logger = logging.getLogger("django_jobstate")

MYSQL_DEADLOCK = 1213  # ER_LOCK_DEADLOCK: the transaction was rolled back
MYSQL_LOCK_WAIT_TIMEOUT = 1205  # ER_LOCK_WAIT_TIMEOUT: the statement was rolled back
POSTGRESQL_DEADLOCK = "40P01"  # deadlock_detected

# Tries of one write before the conflict goes to the caller, which treats it as a
# passing fault (an outcome is written again until the database takes it). A deadlock
# is over at once; a lock wait timeout has already waited innodb_lock_wait_timeout.
TRIES = 6


def lock_conflict(exc: BaseException) -> str | None:
    """What ended the write, if the database ended it to break a deadlock or a lock wait
    ("a deadlock", "a lock wait timeout"); None for any other error."""
    if not isinstance(exc, OperationalError):
        return None
    code = exc.args[0] if exc.args else None
    if code == MYSQL_DEADLOCK or getattr(exc.__cause__, "sqlstate", None) == POSTGRESQL_DEADLOCK:
        return "a deadlock"
    if code == MYSQL_LOCK_WAIT_TIMEOUT:
        return "a lock wait timeout"
    return None


# MariaDB/MySQL name every server error OperationalError that is not a constraint's
# (mysqlclient): a trigger's SIGNAL (1644) too, which would refuse the same write again.
# These server errors can pass; so can the client's own (2000 and up: the server is
# away, the connection was lost) and errors with no number.
MYSQL_PASSING = {
    1040,  # too many connections
    1053,  # the server is shutting down
    1152, 1158, 1159, 1160, 1161, 1184,  # a connection aborted, a network error
    1203, 1226,  # the user's connections or resources are used up
    1290, 1792, 1836,  # read only (a failover in progress)
    1317, 1927,  # the query or the connection was killed
    1969, 3024,  # MariaDB's max_statement_time, MySQL's max_execution_time
    4031,  # MySQL ended a connection left idle
    MYSQL_LOCK_WAIT_TIMEOUT,
    MYSQL_DEADLOCK,
}  # fmt: skip


def mysql_error_passes(exc: OperationalError) -> bool:
    """Whether an OperationalError can pass, if it is MariaDB's/MySQL's (MYSQL_PASSING)."""
    if not type(exc.__cause__).__module__.startswith(("MySQLdb", "pymysql")):
        return True  # another database's: all of its OperationalErrors can pass
    code = exc.args[0] if exc.args else None
    return not isinstance(code, int) or code >= 2000 or code in MYSQL_PASSING


def in_callers_transaction() -> bool:
    return any(c.in_atomic_block for c in connections.all(initialized_only=True))


def retries_conflicts[**P, T](write: Callable[P, T]) -> Callable[P, T]:
    """Make `write` again when the database ends it for a deadlock or a lock wait, while
    it runs in a transaction of its own; after TRIES, or in a caller's transaction, the
    error goes on to the caller."""

    @functools.wraps(write)
    def retried(*args: P.args, **kwargs: P.kwargs) -> T:
        if in_callers_transaction():
            return write(*args, **kwargs)
        for attempt in range(1, TRIES + 1):
            try:
                return write(*args, **kwargs)
            except OperationalError as exc:
                what = lock_conflict(exc)
                if what is None or attempt == TRIES:
                    raise
                logger.info(
                    "%s was ended by the database to break %s; nothing was written, "
                    "writing again (%d/%d)",
                    write.__qualname__,
                    what,
                    attempt,
                    TRIES - 1,
                    extra={"event": "database.lock_conflict", "write": write.__qualname__},
                )
                # Jittered: the deadlock's two sides must not meet again in step.
                time.sleep(random.uniform(0, 0.01 * 2**attempt))
        raise AssertionError("unreachable")

    return retried

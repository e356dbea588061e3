"""What the benchmark (benchmark/) and the torture run (torture/) share: the settings of
a database of theirs from the environment, an admin cursor on the MariaDB server, and a
wait for a condition. Standard library only: the peers' helpers import it in their own
environments (.venv-peers), which have no Django."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any


def database_settings(vendor: str, name: str, **extra: Any) -> dict[str, Any]:
    """DATABASES["default"] for `vendor` (sqlite, postgres or mysql) and database `name`:
    the server of the PG* variables, or of JOBSTATE_MYSQL_* (scripts/mysql), as the test
    suite's settings use. `extra` is added (CONN_MAX_AGE, OPTIONS, ...)."""
    if vendor == "postgres":
        server = {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
        }
    elif vendor == "mysql":
        server = {
            "ENGINE": "django.db.backends.mysql",
            "HOST": os.environ.get("JOBSTATE_MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("JOBSTATE_MYSQL_PORT", "3306"),
            "USER": os.environ.get("JOBSTATE_MYSQL_USER", "jobstate"),
            "PASSWORD": os.environ.get("JOBSTATE_MYSQL_PASSWORD", ""),
            "OPTIONS": {"charset": "utf8mb4"},
        }
    elif vendor == "sqlite":
        # Django's defaults: the app sets WAL and a busy timeout on its own connections.
        server = {"ENGINE": "django.db.backends.sqlite3"}
    else:
        raise RuntimeError(f"the database must be 'sqlite', 'postgres' or 'mysql', not {vendor!r}")
    return {**server, "NAME": name, **extra}


@contextlib.contextmanager
def mysql_admin(database: str | None = None) -> Iterator[Any]:
    """A cursor in autocommit on the server of JOBSTATE_MYSQL_* (scripts/mysql's), on
    `database` or none."""
    import MySQLdb

    conn = MySQLdb.connect(
        host=os.environ.get("JOBSTATE_MYSQL_HOST", "127.0.0.1"),
        port=int(os.environ.get("JOBSTATE_MYSQL_PORT", "3306")),
        user=os.environ.get("JOBSTATE_MYSQL_USER", "jobstate"),
        password=os.environ.get("JOBSTATE_MYSQL_PASSWORD", ""),
        **({"database": database} if database else {}),
    )
    conn.autocommit(True)
    try:
        yield conn.cursor()
    finally:
        conn.close()


def wait_for(condition: Callable[[], bool], timeout: float, every: float = 0.05) -> bool:
    """Whether `condition()` became true within `timeout` seconds, asked every `every`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True

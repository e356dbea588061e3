"""Real database faults for tests: the server ends this process's connection (what a
restart or a failover does) at a chosen statement. PostgreSQL and MariaDB/MySQL."""

import os
import subprocess

from django.db import connection


def ends_the_connection(when: str, statement: str, param: object = None, then: int = 0):
    """An execute wrapper: the server ends this connection (a restart, a failover) just
    `when` ("before", "after") the first statement that starts with `statement` (and has
    `param` among its parameters) runs, or the statement `then` statements later."""
    left: int | None = None  # once matched: statements to let run first

    def wrapper(execute, sql, params, many, context):
        nonlocal left
        if left is None and sql.startswith(statement) and (param is None or param in params):
            left = then
        fire, left = left == 0, None if left is None else left - 1
        if fire and when == "before":
            end_this_connection()
        result = execute(sql, params, many, context)
        if fire and when == "after":
            end_this_connection()
        return result

    return wrapper


def end_this_connection() -> None:
    admin = connection.get_new_connection(connection.get_connection_params())
    if connection.vendor == "mysql":
        admin.cursor().execute("KILL CONNECTION %s", [connection.connection.thread_id()])
    else:
        admin.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
    admin.close()


# The control script of the throwaway server of scripts/test (or scripts/pg, scripts/mysql).
SERVER_CTL = {"postgresql": "JOBSTATE_PG_CTL", "mysql": "JOBSTATE_MYSQL_CTL"}
NO_SERVER_CTL = (
    "needs the throwaway PostgreSQL or MariaDB of scripts/test (JOBSTATE_PG_CTL, "
    "JOBSTATE_MYSQL_CTL), which it stops and starts"
)


def no_server_ctl() -> bool:
    """Whether this test run cannot stop and start its database server (a skipif)."""
    return SERVER_CTL.get(connection.vendor, "") not in os.environ


def server_ctl(action: str) -> None:
    """ "stop", "start" or "restart" the database server, fast, and wait until done."""
    if connection.vendor == "mysql":
        subprocess.run([os.environ["JOBSTATE_MYSQL_CTL"], action], check=True)
        return
    pg = {"stop": ["stop", "-m", "fast"], "start": ["start"], "restart": ["restart", "-m", "fast"]}
    subprocess.run([os.environ["JOBSTATE_PG_CTL"], *pg[action], "-w"], check=True)

"""Real database faults for tests: the server ends this process's connection (what a
restart or a failover does) at a chosen statement. PostgreSQL only."""

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
    admin.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
    admin.close()

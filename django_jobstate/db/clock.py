"""Now, by the database's clock, in UTC on every database the app supports.

Django's Now() is CURRENT_TIMESTAMP(6) on MariaDB/MySQL: the session's time zone (the
server's, by default), while Django stores times in UTC with USE_TZ. On a server whose
clock is set to local time, every comparison with it would be off by the offset (jobs
run hours early or late, live workers taken for lost). UTC_TIMESTAMP(6) is the same
clock in UTC, whatever the server's or the session's time zone.
"""

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.functions import Now as DjangoNow
from django.db.models.sql.compiler import SQLCompiler


class Now(DjangoNow):
    def as_mysql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: Any
    ) -> Any:
        return self.as_sql(compiler, connection, template="UTC_TIMESTAMP(6)", **extra_context)

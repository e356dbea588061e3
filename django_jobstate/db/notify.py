"""The notifications that writes send on PostgreSQL when they commit (a job enqueued, a
retry due now, a queue resumed, a cancel asked, a schedule changed in the admin), and their
payloads. The writes (managers/, queues.py, schedules/edits.py) send them; the runner's
listeners (runner/wakeup.py, runner/relay.py) hear them. A notification is a
hint: nothing depends on its delivery.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

CHANNEL = "django_jobstate"
AT = "@"  # between a payload's priority and its run_after
# The SQL expression that wakes listening workers of the queue of the row an INSERT
# returns, once the transaction commits: "<queue> <priority>@<seconds>", the seconds of its
# run_after since the Unix epoch, rounded down (so that the jobs of one second send one
# notification: PostgreSQL sends identical ones of a transaction once). NOTIFY_QUEUE takes
# them as parameters (queue_payload()).
NOTIFY = (
    f"pg_notify('{CHANNEL}', \"queue_name\" || ' ' || \"priority\" || '{AT}' || "
    f'floor(extract(epoch FROM "run_after"))::bigint)'
)
NOTIFY_QUEUE = f"pg_notify('{CHANNEL}', %s)"
# The priority of a notification that is not about one job (a queue resumed): it sorts
# before every job, so that a draining worker looks from the head.
ANY_PRIORITY = 101


def queue_payload(
    queue: str, priority: int = ANY_PRIORITY, run_after: datetime | None = None
) -> str:
    """A job's notification; without `run_after`, it sorts before every job of its priority."""
    at = "" if run_after is None else f"{AT}{math.floor(run_after.timestamp())}"
    return f"{queue} {priority}{at}"


def parse_payload(payload: str) -> tuple[str, int, float]:
    """The queue, priority and run_after (seconds since the epoch, rounded down; -inf if
    not said) of a notification. An unknown one (a NOTIFY by hand, an older version's
    mark): any queue, first."""
    queue, _, rest = payload.rpartition(" ")
    priority, _, at = rest.partition(AT)
    try:
        return queue, int(priority), float(at) if at else -math.inf
    except ValueError:
        return "", ANY_PRIORITY, -math.inf


def send(connection: BaseDatabaseWrapper, jobs: Iterable[tuple[str, int, datetime]]) -> None:
    """Wake listening workers, once the transaction commits, for the jobs `(queue,
    priority, run_after)` made runnable after their INSERT: a retry due now, or a job that
    kept its place in claim order (its dependencies done, a slot of its concurrency limit
    free), maybe before the key that a worker under continuous load claims from
    (runner/claims.py). PostgreSQL only."""
    if connection.vendor != "postgresql":
        return
    payloads = {queue_payload(*job) for job in jobs}
    with connection.cursor() as cursor:
        for payload in sorted(payloads):
            cursor.execute(f"SELECT {NOTIFY_QUEUE}", [payload])


def serves(queues: frozenset[str] | None, payload: str) -> bool:
    """Whether a worker of `queues` (None: all) is woken by this payload (one of no
    known queue wakes every worker)."""
    queue = parse_payload(payload)[0]
    return queues is None or queue in queues or not queue


CANCEL_CHANNEL = "django_jobstate_cancel"
NOTIFY_CANCEL = f"pg_notify('{CANCEL_CHANNEL}', %s)"

# A schedule made or changed in the admin (its name): the supervisors' relays wake their
# schedulers, which read the schedules again at once instead of at their next wake-up.
SCHEDULES_CHANNEL = "django_jobstate_schedules"
NOTIFY_SCHEDULES = f"pg_notify('{SCHEDULES_CHANNEL}', %s)"

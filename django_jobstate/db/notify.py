"""The notifications that writes send on PostgreSQL when they commit (a job enqueued, a
retry due now, a queue resumed, a cancel asked, a schedule changed in the admin), and their
payloads. The writes (managers/, queues.py, schedules/edits.py) send them; the runner's
listeners (runner/wakeup.py, runner/relay.py) hear them. A notification is a
hint: nothing depends on its delivery.
"""

from __future__ import annotations

CHANNEL = "django_jobstate"
# The SQL expression that wakes listening workers of the queue of the row an INSERT
# returns, once the transaction commits: "<queue> <priority>". NOTIFY_QUEUE takes them as
# parameters (queue_payload()).
NOTIFY = f"pg_notify('{CHANNEL}', \"queue_name\" || ' ' || \"priority\")"
NOTIFY_QUEUE = f"pg_notify('{CHANNEL}', %s)"
# The priority of a notification that is not about one job (a queue resumed): it sorts
# before every job, so that a draining worker looks from the head.
ANY_PRIORITY = 101


# The mark of a job made runnable that keeps its place in claim order from its enqueue (its
# dependencies done, a slot of its concurrency limit free): it may sort before the key that
# a worker under continuous load claims from (runner/claims.py), which then looks from the
# head. "<queue> <priority>+" (a version without the mark reads "any queue, first").
KEPT_PLACE = "+"


def queue_payload(queue: str, priority: int = ANY_PRIORITY, kept_place: bool = False) -> str:
    return f"{queue} {priority}{KEPT_PLACE if kept_place else ''}"


def parse_payload(payload: str) -> tuple[str, int]:
    """The queue and priority of a notification (an unknown one: any queue, first)."""
    queue, _, priority = payload.rpartition(" ")
    try:
        return queue, int(priority.removesuffix(KEPT_PLACE))
    except ValueError:
        return "", ANY_PRIORITY


def kept_place(payload: str) -> bool:
    """Whether the notification's job keeps its place from its enqueue (KEPT_PLACE)."""
    return payload.endswith(KEPT_PLACE)


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

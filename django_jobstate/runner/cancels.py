"""Cancel requests, from the database to the ledger of the worker running the attempt.

The supervisor (or, for a worker run in-process, its watchdog) reads the requests for its
workers' attempts at every heartbeat, and on PostgreSQL as soon as a cancel's NOTIFY
arrives (the supervisor's relay hears it: relay.py), and writes each to the ledger
(ledger.py): the task sees it through its context (context.py), an attempt not begun yet
is never begun, and the one in hand is stopped JOBSTATE_CANCEL_GRACE seconds after the
request (database clock), as at a timeout.
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError

from ..conf import get_settings
from ..managers import close_connection
from ..models import Job
from .ledger import Ledger

logger = logging.getLogger("django_jobstate.worker")


def pass_cancel_requests(ledgers: dict[str, Ledger], name: str) -> int:
    """Write the cancel requests of these workers' attempts to their ledgers; return how
    many attempts it flagged. A database error is logged: the next beat tries again."""
    if not ledgers:
        return 0
    try:
        requests = Job.objects.cancel_requests(ledgers)
    except DatabaseError:
        logger.warning("%s: database unavailable; cannot read cancel requests", name)
        close_connection()
        return 0
    grace, now = get_settings().CANCEL_GRACE, time.monotonic()
    flagged = 0
    for pk, worker_id, age in requests:
        ledger = ledgers.get(worker_id)
        if ledger is not None and ledger.request_cancel(pk, now + max(0.0, grace - age)):
            flagged += 1
    return flagged

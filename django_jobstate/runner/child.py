"""What runs in a worker process that the supervisor (supervisor.py) spawned: Django set
up again, the project's logging, the worker loop, and the exit code that tells the
supervisor what happened. Nothing here imports models at import time: a spawned child
imports this module to find run_child before Django is set up.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

from ..telemetry import metrics
from .forking import PRELOAD, on_sigterm, release_server
from .ledger import Ledger

EXIT_RECYCLE = 3  # the worker ran --max-jobs jobs: replace it
EXIT_UNAVAILABLE = 5  # a --burst worker could not reach the database


def configure_logging(verbosity: int) -> None:
    """-v 0: warnings only; -v 1 (default): a line per worker and per attempt; -v 2: debug.

    Without a handler of the project's for these loggers (a fresh startproject has none),
    lines go to stderr with a time stamp; with one, the project's handler alone.
    """
    package_logger = logging.getLogger("django_jobstate")
    package_logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
    if not package_logger.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        package_logger.addHandler(handler)


def run_child(
    options: dict[str, Any],
    verbosity: int,
    ledger: Ledger,
    parents: tuple[int, ...],
    inbox: Connection | None = None,
    metrics_dir: str | None = None,
) -> None:
    """The body of a worker process; `inbox`: its pipe from the supervisor's relay.

    `parents`: the pids its parent may have while the supervisor lives (forking.py); the
    supervisor's is first. `metrics_dir`: where --metrics-port's counts go (passed, not
    inherited: the fork server may have started before the supervisor made it)."""
    _die_with_parent()
    preloaded = sys.modules.get(PRELOAD)  # forked from the fork server: Django is set up
    if preloaded is not None:
        release_server()
    if failure := getattr(preloaded, "failure", None):
        sys.stderr.write(failure)
        sys.exit(1)
    import django

    django.setup()  # spawned: the whole setup; forked: only the logging, again
    from ..db.sqlite_turns import join_workers
    from ..receivers import watch_for_dead_peers
    from .wakeup import receive_from
    from .worker import Worker

    watch_for_dead_peers()
    join_workers()  # SQLite: runjobs' party at the write lock (db/sqlite_turns.py)

    if inbox is not None:
        receive_from(inbox)  # its Waiter reads the relay instead of listening itself

    configure_logging(verbosity)  # a spawned process starts with the project's logging only
    if metrics_dir:  # the supervisor serves --metrics-port
        os.environ[metrics.ENV] = metrics_dir
        metrics.install()
    # Ctrl-C reaches the whole process group: the supervisor alone decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Its parent: the supervisor, or the fork server, which exits with the supervisor. A
    # parent that is neither: the supervisor is already gone, and the worker stops.
    parent = os.getppid() if os.getppid() in parents else parents[0]
    worker = Worker(**options, ledger=ledger, parent=parent)
    on_sigterm(worker.stop)
    worker.run()
    if worker.unavailable:
        sys.exit(EXIT_UNAVAILABLE)
    sys.exit(EXIT_RECYCLE if worker.reached_max_jobs and not worker.stopping else 0)


def _die_with_parent() -> None:
    """On Linux, have the kernel kill this process when its supervisor dies: nobody would
    heartbeat for it or stop it at a deadline. (Elsewhere the worker loop checks.)"""
    if sys.platform != "linux":
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)

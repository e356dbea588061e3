"""`manage.py runjobs`: run a worker until stopped."""

import argparse
import importlib.util
import logging
import signal
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections

from django_jobstate.db.sqlite_turns import join_workers
from django_jobstate.management.arguments import (
    port_number,
    positive_float,
    positive_int,
    queue_name,
)
from django_jobstate.receivers import watch_for_dead_peers
from django_jobstate.runner.child import configure_logging
from django_jobstate.runner.forking import start_server, worker_context
from django_jobstate.runner.supervisor import Supervisor

if TYPE_CHECKING:
    from django_jobstate.telemetry.gauges import Exporter

logger = logging.getLogger("django_jobstate.worker")


class Command(BaseCommand):
    help = (
        "Run background jobs in worker processes. SIGTERM or SIGINT finishes the jobs in hand "
        "and exits; a second one stops at once and fails the running attempts as interrupted."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--queue",
            dest="queues",
            action="append",
            type=queue_name,
            metavar="NAME",
            help="Run jobs from this queue only (repeatable; default: all queues).",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=1,
            metavar="N",
            help="Run N worker processes (default: 1).",
        )
        parser.add_argument(
            "--in-flight",
            type=positive_int,
            default=1,
            metavar="N",
            help="Run up to N attempts at once in each worker process: async tasks on an "
            "event loop, others on threads; for jobs that wait on the network (default: 1).",
        )
        parser.add_argument("--burst", action="store_true", help="Exit once no job is runnable.")
        parser.add_argument(
            "--max-jobs",
            type=positive_int,
            metavar="N",
            help="Replace each worker process after it ran N jobs (a guard against leaks).",
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_float,
            metavar="SECONDS",
            help="Seconds to wait when nothing is runnable (default: JOBSTATE_POLL_INTERVAL).",
        )
        parser.add_argument(
            "--worker-id",
            metavar="ID",
            help="Start worker names with ID (default: host:pid); a random part follows, so "
            "that two runjobs given the same ID never share a name.",
        )
        parser.add_argument(
            "--metrics-port",
            type=port_number,
            metavar="PORT",
            help="Serve Prometheus metrics of all the workers at http://127.0.0.1:PORT/metrics "
            "(0: any free port, logged). Needs prometheus-client: django-jobstate[metrics].",
        )
        parser.add_argument(
            "--no-schedules",
            action="store_true",
            help="Run no scheduler: enqueue no periodic job (SCHEDULES) from this runjobs. "
            "A --burst run never schedules.",
        )

    _burst = False  # execute() sets it: check() runs before handle()

    def execute(self, *args: Any, **options: Any) -> Any:
        self._burst = bool(options.get("burst"))
        # A SIGTERM or Ctrl-C from here on stops runjobs as it would later, even before
        # handle() has its supervisor (the checks may wait for the database): handle()
        # passes it on, and the supervisor starts no worker. Before this point (Python and
        # Django starting) the signal's default action ends the process, as for any program.
        self._early_signals: list[int] = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda signum, frame: self._early_signals.append(signum))
        return super().execute(*args, **options)

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Django's system checks, once the database answers. On MariaDB/MySQL they ask
        the server its version, so a runjobs started while the server is down (a restart,
        a failover, systemd starting it again) would exit on a traceback: a long-running
        one waits for the server instead, as it waits for one lost later; a burst run
        exits 3, as when it cannot reach the database afterwards."""
        said = False
        while True:
            try:
                super().check(*args, **kwargs)
                return
            except DatabaseError as exc:
                connections.close_all()
                if self._burst:
                    raise CommandError(
                        f"A burst run could not reach the database for the system checks: {exc}",
                        returncode=3,
                    ) from None
                if not said:
                    self.stderr.write(
                        f"Database unavailable for the system checks ({exc}); runjobs waits for it"
                    )
                    said = True
                time.sleep(1.0)  # a server restart takes seconds
                if self._early_signals:
                    self.stderr.write("Stopped while waiting for the database: no job was run.")
                    raise SystemExit(0) from None

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(options["verbosity"])
        # The workers' fork server sets Django up while this process checks the database
        # and starts its threads (forking.py).
        start_server(worker_context())
        watch_for_dead_peers()
        join_workers()  # SQLite: runjobs' party at the write lock (db/sqlite_turns.py)
        refuse_to_start(options["queues"], burst=options["burst"])
        if options["metrics_port"] is not None and not importlib.util.find_spec(
            "prometheus_client"
        ):
            raise CommandError(
                "--metrics-port needs prometheus-client: pip install 'django-jobstate[metrics]'."
            )
        supervisor = Supervisor(
            concurrency=options["concurrency"],
            worker_id=options["worker_id"],
            verbosity=options["verbosity"],
            queues=options["queues"],
            poll_interval=options["poll_interval"],
            burst=options["burst"],
            max_jobs=options["max_jobs"],
            in_flight=options["in_flight"],
            schedules=not (options["no_schedules"] or options["burst"]),
        )
        exporter = self._start_metrics(options["metrics_port"], supervisor)
        forced: list[int] = []

        def on_signal(signum: int, frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            if not supervisor.stopping:
                logger.warning(
                    "%s received: finishing the jobs in hand (send it again to stop at once)",
                    name,
                    extra={"event": "supervisor.signal", "signal": name},
                )
                supervisor.stop()
            else:
                logger.warning(
                    "%s received again: stopping at once",
                    name,
                    extra={"event": "supervisor.signal", "signal": name},
                )
                forced.append(signum)
                supervisor.interrupt()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        for signum in self._early_signals:  # came while runjobs started
            on_signal(signum, None)
        try:
            supervisor.run()
        finally:
            if exporter:
                exporter.close()
        if forced:  # as a shell reports a process ended by that signal
            raise CommandError(
                "Stopped at once: the running attempts failed as interrupted.",
                returncode=128 + forced[0],
            )
        if supervisor.unavailable:
            raise CommandError(
                "A worker could not reach the database, so the jobs left queued are not "
                "known to be done; see the errors above.",
                returncode=3,
            )

    def _start_metrics(self, port: int | None, supervisor: Supervisor) -> "Exporter | None":
        """Serve --metrics-port; before any worker starts, as they inherit its directory."""
        if port is None:
            return None
        from django_jobstate.telemetry.gauges import Exporter

        try:
            exporter = Exporter(port, workers=lambda: len(supervisor.workers))
        except OSError as exc:
            raise CommandError(f"--metrics-port {port}: cannot serve on it: {exc}") from None
        logger.info(
            "Metrics at http://127.0.0.1:%d/metrics",
            exporter.port,
            extra={"event": "metrics.serving", "port": exporter.port},
        )
        return exporter


def refuse_to_start(queues: list[str] | None, *, burst: bool) -> None:
    """Say why runjobs cannot do its job, before any worker starts; warn of unknown queues."""
    from django.db import DatabaseError, connections, router

    from django_jobstate.backend import JobStateBackend
    from django_jobstate.models import Job

    from ...tasksapi import task_backends

    backends = [b for b in task_backends.all() if isinstance(b, JobStateBackend)]
    if not backends:
        raise CommandError(
            "No TASKS alias uses django_jobstate.backend.JobStateBackend, so no job that "
            "runjobs could run is ever enqueued (and running other backends' jobs here "
            'would fail them). Set TASKS = {"default": {"BACKEND": '
            '"django_jobstate.backend.JobStateBackend"}}.'
        )
    db = router.db_for_write(Job)
    try:
        tables = connections[db].introspection.table_names()
    except DatabaseError as exc:
        if burst:  # nothing can be done, and "done" must not be said
            raise CommandError(
                f"A burst run could not reach the database {db!r}: {exc}", returncode=3
            ) from None
        # A long-running runjobs waits for it (a failover, a restart during a deploy).
        logger.warning(
            "Database %r unavailable (%s); the workers will retry",
            db,
            exc,
            extra={"event": "runjobs.database_unavailable"},
        )
        return
    finally:
        connections[db].close()  # spawned workers open their own
    if Job._meta.db_table not in tables:
        raise CommandError(
            f"The job table {Job._meta.db_table!r} does not exist in the database {db!r}: "
            f"run `python manage.py migrate` first."
        )
    known = {name for backend in backends for name in backend.queues}
    for name in sorted(set(queues or []) - known) if known else []:
        logger.warning(
            "--queue %s: no TASKS alias lists that queue (known: %s); its workers will "
            "wait for jobs that enqueue() refuses",
            name,
            ", ".join(sorted(known)),
            extra={"event": "runjobs.unknown_queue", "queue": name},
        )

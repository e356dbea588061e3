"""The supervisor behind `runjobs`: N worker processes, their heartbeats and timeouts.

Each worker is a child process (spawned, so it shares nothing with the supervisor but the
settings and its ledger). The supervisor runs no task code, so it can always act for its
workers, whatever their tasks do to their own interpreters:
- a monitor thread (monitor.py) makes the supervisor's database writes: rescues,
  settles, cancel requests passed to the ledgers (on PostgreSQL at once, woken by the
  relay); its heart thread beats for the workers, held up by none of those;
- on PostgreSQL, a relay thread holds the one LISTEN connection of all the workers and
  passes each wake-up on to them through a pipe per worker (relay.py), and wakes the
  scheduler thread when a schedule is made or changed in the admin;
- the main loop kills a worker whose attempt passed its deadline, takes back the attempts
  a worker holds behind a slow one, and replaces workers that ended.
Each worker writes what it holds and starts to a ledger in shared memory (ledger.py), so
when a worker process ends, the supervisor fails only the attempt it had started and
hands back the ones it never began.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import signal
import time
import uuid
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from ..exceptions import WorkerInterrupted, WorkerLost
from ..states import FailureReason
from ..telemetry import metrics
from .child import EXIT_RECYCLE, EXIT_UNAVAILABLE, run_child
from .forking import parents, send, start_server, worker_context
from .ledger import STARTED, Ledger, ledger_size
from .monitor import Monitor, release

if TYPE_CHECKING:
    from ..schedules.thread import SchedulerThread

# Nothing here imports models at import time: the supervisor process imports it before
# Django's apps are ready (runjobs), as a spawned child does child.py.

logger = logging.getLogger("django_jobstate.worker")

# Seconds an attempt may run before the attempts its worker holds behind it, claimed in
# the same batch, are handed back for other workers to run.
HOLD_LIMIT = 0.5
RESPAWN_DELAY = 1.0  # before replacing a worker that died within a second (no database?)
# A --burst run waits this long at most for the settle of a worker before replacing it.
SETTLE_WAIT = 10.0


def supervisor_id(prefix: str | None) -> str:
    """A name no other supervisor has, whatever `prefix` (--worker-id) says.

    Worker ids are what every outcome write is fenced by: two supervisors started with
    the same --worker-id (one unit file on two hosts) must still name workers apart.
    """
    import socket

    return f"{prefix or f'{socket.gethostname()[:40]}:{os.getpid()}'}:{uuid.uuid4().hex[:8]}"


@dataclass
class Child:
    worker_id: str
    process: BaseProcess
    ledger: Ledger
    started: float
    timed_out: int | None = None  # the attempt it was killed for, past its deadline


class Supervisor:
    def __init__(
        self,
        *,
        concurrency: int = 1,
        worker_id: str | None = None,
        verbosity: int = 1,
        **options: Any,
    ):
        from .claims import MAX_BATCH
        from .relay import Relay

        self.concurrency = concurrency
        self.verbosity = verbosity
        self.base_id = supervisor_id(worker_id)
        self.options = options  # Worker(...) arguments: queues, poll_interval, burst, max_jobs
        self.batch_size = options.pop("max_batch", MAX_BATCH)
        self.schedules = options.pop("schedules", False)  # run a scheduler (scheduler.py)
        self.stopping = False
        self._deferred: dict[int, float] = {}  # slot -> when its respawn first waited
        self.interrupted = False
        self.unavailable = False  # a --burst worker could not reach the database
        self.workers: dict[str, int] = {}  # {worker_id: pid} of the live workers, for beats
        self.ledgers: dict[str, Ledger] = {}  # {worker_id: ledger}, for cancel requests
        self._spawned = 0
        self._children: dict[int, Child] = {}
        self._respawn_at: dict[int, float] = {}
        self._context = worker_context()  # forked from a fork server where possible
        self.monitor = Monitor(self)
        self.scheduler: SchedulerThread | None = None
        self.relay = Relay(
            self._context,
            options.get("queues"),
            self.monitor.check_cancels_soon,
            self._schedules_changed,
        )

    def run(self) -> None:
        queues = ", ".join(sorted(self.options.get("queues") or [])) or "all queues"
        logger.info(
            "Supervisor %s started %d worker(s) on %s",
            self.base_id,
            self.concurrency,
            queues,
            extra={"event": "supervisor.started", "supervisor_id": self.base_id},
        )
        start_server(self._context)  # sets Django up while the threads below start
        self.relay.start()  # before the workers: none misses a job enqueued as it starts
        self.monitor.start()
        if self.schedules:
            self.scheduler = start_scheduler(f"Scheduler {self.base_id}")
        try:
            for slot in range(self.concurrency):
                if not self.stopping:
                    self._spawn(slot)
            while self._children or self._respawn_at:
                wait([c.process.sentinel for c in self._children.values()], self._wake_in())
                self._watch(time.monotonic())
        finally:
            if self.scheduler is not None:
                self.scheduler.stop()
            self.monitor.finish()
            self.relay.finish()
        logger.info(
            "Supervisor %s stopped",
            self.base_id,
            extra={"event": "supervisor.stopped", "supervisor_id": self.base_id},
        )

    def _schedules_changed(self) -> None:
        """The relay heard that a schedule was made or changed in the admin."""
        if (scheduler := self.scheduler) is not None:
            scheduler.wake()

    def stop(self) -> None:
        """Let each worker finish its attempts in hand, then exit."""
        self.stopping = True
        self._respawn_at.clear()
        self._signal_children(signal.SIGTERM)

    def interrupt(self) -> None:
        """Stop now: kill the workers; their running attempts fail as interrupted."""
        self.stopping = self.interrupted = True
        self._respawn_at.clear()
        self._signal_children(signal.SIGKILL)

    def _signal_children(self, signum: int) -> None:
        for child in list(self._children.values()):
            if child.process.pid is not None and child.process.is_alive():
                send(child.process, signum)

    def _wake_in(self) -> float:
        deadlines = [c.ledger.next_deadline() for c in self._children.values()]
        wake = min([*deadlines, *self._respawn_at.values(), math.inf])
        # Often enough to see an attempt held past HOLD_LIMIT in time.
        return max(0.0, min(wake - time.monotonic(), HOLD_LIMIT / 5))

    def _watch(self, now: float) -> None:
        for slot, child in list(self._children.items()):
            if not child.process.is_alive():
                child.process.join()
                del self._children[slot]
                self.relay.remove(child.worker_id)
                self.monitor.heart.vouch(child.worker_id, child.process.pid or 0)  # until settled
                self._publish()
                self._ended(child)
                if self._should_replace(child):
                    quick = time.monotonic() - child.started < RESPAWN_DELAY
                    self._respawn_at[slot] = now + (RESPAWN_DELAY if quick else 0)
            elif (pk := child.ledger.overdue(now)) is not None:
                logger.warning(
                    "Worker %s: job %s passed its timeout (or was cancelled and did not "
                    "stop within JOBSTATE_CANCEL_GRACE); stopping the worker process",
                    child.worker_id,
                    pk,
                    extra={"event": "worker.overdue", "worker_id": child.worker_id, "job_id": pk},
                )
                child.timed_out = pk
                send(child.process, signal.SIGKILL)
            elif held := child.ledger.release_held(now, HOLD_LIMIT):
                logger.info(
                    "Worker %s: handing back %d job(s) held behind a slow one",
                    child.worker_id,
                    len(held),
                    extra={"event": "worker.released", "worker_id": child.worker_id, "jobs": held},
                )
                self.monitor.submit(functools.partial(release, child.worker_id, held))
        for slot, at in list(self._respawn_at.items()):
            if now < at:
                continue
            # The settle of the worker it replaces may queue a retry (a timeout, a killed
            # worker): a --burst worker started before it lands could find nothing, end
            # the run, and leave the retry queued. Not for ever: with the database down,
            # the new worker says so (the run exits 3).
            if (
                self.options.get("burst")
                and not self.monitor.written()
                and now - self._deferred.setdefault(slot, now) < SETTLE_WAIT
            ):
                self._respawn_at[slot] = now + 0.05
                continue
            self._deferred.pop(slot, None)
            del self._respawn_at[slot]
            self._spawn(slot)

    def _publish(self) -> None:
        """Hand the monitor thread the workers to beat for (one assignment each: no lock)."""
        self.workers = {c.worker_id: c.process.pid or 0 for c in self._children.values()}
        self.ledgers = {c.worker_id: c.ledger for c in self._children.values()}

    def _spawn(self, slot: int) -> None:
        self._spawned += 1
        worker_id = f"{self.base_id}/{slot}.{self._spawned}"[-64:]
        in_flight = self.options.get("in_flight", 1)
        ledger = Ledger(self._context, ledger_size(self.batch_size, in_flight), in_flight)
        options = {**self.options, "worker_id": worker_id, "max_batch": self.batch_size}
        inbox = self.relay.add(worker_id)
        process = self._context.Process(
            target=run_child,
            args=(
                options,
                self.verbosity,
                ledger,
                parents(self._context),
                inbox,
                os.environ.get(metrics.ENV),
            ),
            name=f"runjobs worker {worker_id}",
        )
        process.start()
        if inbox is not None:
            inbox.close()  # the child has its copy; the relay's end alone stays here
        self._children[slot] = Child(worker_id, process, ledger, time.monotonic())
        self._publish()
        self.monitor.beat_soon()  # register it before it claims
        if self.stopping:  # a stop that came while it started: it must hear it too
            send(process, signal.SIGKILL if self.interrupted else signal.SIGTERM)

    def _ended(self, child: Child) -> None:
        code = child.process.exitcode
        assert code is not None  # _watch() handles a child only after join()
        if code == EXIT_UNAVAILABLE:
            self.unavailable = True
        if self.interrupted:
            reason = FailureReason.INTERRUPTED
            error: Exception = WorkerInterrupted(
                "runjobs was told twice to stop, and stopped at once"
            )
        else:
            if child.timed_out is not None:
                how = f"was stopped: job {child.timed_out} passed its timeout"
            elif code < 0:
                how = f"was killed by {signal.Signals(-code).name}"
            else:
                how = f"exited {code}"
            reason, error = FailureReason.LOST, WorkerLost(f"its worker process {how}")
            if code not in (0, EXIT_RECYCLE, EXIT_UNAVAILABLE):
                logger.warning(
                    "Worker %s %s",
                    child.worker_id,
                    how,
                    extra={"event": "worker.ended", "worker_id": child.worker_id, "exit": code},
                )
        if metrics.recorder is not None:
            exit_kind = {0: "stopped", EXIT_RECYCLE: "recycled", EXIT_UNAVAILABLE: "unavailable"}
            metrics.recorder.worker_exits_total.labels(exit_kind.get(code, "died")).inc()
        started = {pk for pk, mark in child.ledger.marks().items() if mark == STARTED}
        # Killed, or stopped at a timeout: a claim it sent may still be waiting on a lock.
        settle = functools.partial(self.monitor.settle, again_later=code not in (0, EXIT_RECYCLE))
        self.monitor.submit(
            functools.partial(settle, child.worker_id, started, reason, error, child.timed_out)
        )

    def _should_replace(self, child: Child) -> bool:
        code = child.process.exitcode
        return not self.stopping and code not in (0, EXIT_UNAVAILABLE)


def start_scheduler(name: str) -> SchedulerThread:
    from ..schedules.thread import SchedulerThread

    thread = SchedulerThread(name)
    thread.start()
    return thread

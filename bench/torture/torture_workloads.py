"""The torture run's workloads beside its kills and outages, each drawn from the seed.

Mixed into bench/torture/torture.py's Torture (it needs its rng, faults, clock and tick()); each
is switched off by its own --no-... flag, and checked by torture_check_workloads.py:
- cancels at random moments (JobStateBackend.cancel, Job.objects.cancel_task, or
  Job.objects.cancel of the newest attempt), of queued attempts due now (racing the
  claim) or later, and of running ones (JOBSTATE_CANCEL_GRACE is 2 s in the settings);
- a schedule ticking every second in every supervisor (torture_settings.py);
- unique tasks enqueued again and again by two threads while the workers drain, on
  PostgreSQL sometimes in a caller's transaction that stays open a moment after (not on
  MariaDB, where InnoDB's duplicate check locks the holder's row until that transaction
  ends, as the README's MariaDB section says);
- mixed batches: fast jobs and one slow one, due together, with no timeout (as where no
  default is set), so that a worker claims them in one batch; half of them have the
  worker of their slow job SIGKILLed while it runs;
- locked rows: another connection holds SELECT ... FOR UPDATE on a few queued rows (on
  SQLite, where there are no row locks, a read transaction as long) past the window;
- a table lock while attempts with a 1 s timeout run: LOCK TABLE ... ACCESS EXCLUSIVE on
  PostgreSQL, LOCK TABLES ... WRITE on MariaDB, the write lock (BEGIN IMMEDIATE) on
  SQLite, for the lost-after window;
- concurrency limits: part of the --jobs are limited tasks (a limit of 1 per key over
  LIMIT_KEYS keys, a limit of 2 for a task), enqueued with the rest in clumps due
  together, so that most of them wait for a slot; the faults pick workers in their bodies
  first half of the time; twice a pair of jobs of a key of their own whose first body is
  killed or stopped with its whole supervisor (kill_limited). A sampler reads the slot
  holders and the held rows five times a second (torture_check_limits.py has the checks).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.torture.torture_check import Faults

UNIQUE_KEYS = 6  # keys the unique tasks share: most enqueues meet a live holder
UNIQUE_THREADS = 2
# Fast jobs due just before each slow one: a worker claims one at a time until it has
# seen how long jobs take, then as many as run in 50 ms; the last ones share its batch.
BATCH_FAST_JOBS = 10
BATCH_SLOW_SECONDS = 3.0
LOCKED_ROWS = 3
DEADLINE_JOBS = 8  # attempts with a 1 s timeout started just before a table lock
LOCK_WAIT = 40  # tries (0.25 s apart) for an attempt to start before the lock or kill
TICK_SCHEDULE = "torture-tick"
LIMIT_KEYS = 3  # the keys of limited_per_key (a limit of 1 each)
# A clump of limited jobs due at one moment: two per key, three of limited_per_task.
LIMIT_CLUMP = 2 * LIMIT_KEYS + 3
LIMIT_PAIR_SECONDS = 2.0  # the body kill_limited() stops: it outlives the stop's rescue
FREEZE_LONGEST = 8.0  # a supervisor stopped whole: the lost-after window, the rescue, slack


@dataclass
class Cancel:
    """One cancel: of a task (its newest attempt) or, with `pk`, of one attempt."""

    result_id: str
    how: str  # "backend", "task" or "job"
    picked: str  # what the row was when picked: "due", "later" or "running"
    at: datetime  # database clock, before the call
    done: datetime | None = None  # after it returned
    pk: int | None = None  # the attempt Job.objects.cancel() was given
    error: str = ""


@dataclass
class UniqueEnqueue:
    """One enqueue of a unique task, and the task it returned (new, or the holder)."""

    key: str
    result_id: str
    at: datetime
    done: datetime
    locked_holder: bool = False  # its transaction, still open, held the holder's row


@dataclass
class MixedBatch:
    fast: list[str]
    slow: str
    at: datetime
    kill: bool  # SIGKILL the worker of the slow job while it runs


@dataclass
class RowLock:
    pks: list[int]
    at: datetime
    released: datetime | None = None
    held: bool = False  # its SELECT ... FOR UPDATE returned (no outage before)


@dataclass
class Workload:
    """What the workloads did, for the checks (part of Faults)."""

    cancels: list[Cancel] = field(default_factory=list)
    uniques: list[UniqueEnqueue] = field(default_factory=list)
    unique_errors: Counter[str] = field(default_factory=Counter)  # error class -> count
    unique_multi: set[str] = field(default_factory=set)  # keys seen with 2+ live rows
    batches: list[MixedBatch] = field(default_factory=list)
    row_locks: list[RowLock] = field(default_factory=list)
    deadlines: list[str] = field(default_factory=list)  # result ids started before locks
    ticks_until: datetime | None = None  # ticks from here on are past the run
    row_locks_exclusive: bool = True  # False on SQLite: a read transaction, no row lock
    ticks: bool = False
    # Concurrency limits, sampled: samples taken; keys seen with more slot holders or
    # running rows than their limit, and held rows while their key had a free slot (one
    # line each); the most running rows seen at once per key.
    limit_samples: int = 0
    limit_over: list[str] = field(default_factory=list)
    limit_held_free: list[str] = field(default_factory=list)
    limit_peaks: dict[str, int] = field(default_factory=dict)
    # The database clock minus time.monotonic() (the bodies' stamps), in seconds.
    mono_to_db: float = 0.0
    workflows: Any = None  # torture_workflows.Workflows, when the run has workflows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--no-cancels", action="store_true", help="no cancels of queued and running tasks")
    add("--cancels", type=int, help="default: duration/3, at least 4")
    add("--no-ticks", action="store_true", help="no schedule ticking every second")
    add("--no-unique", action="store_true", help="no unique tasks enqueued while draining")
    add("--no-mixed-batches", action="store_true", help="no batches of fast jobs and a slow one")
    add("--mixed-batches", type=int, help="default: duration/5, at least 3")
    add("--no-row-locks", action="store_true", help="no rows locked by another connection")
    add("--row-locks", type=int, help="default: duration/30, at least 1")
    add("--no-table-lock", action="store_true", help="no table lock during deadlines")
    add("--no-limits", action="store_true", help="no tasks with concurrency limits")
    add("--limited-jobs", type=int, help="of --jobs; default: jobs/33, at least 18")


def resolve(options: argparse.Namespace) -> None:
    d = options.duration
    for name, off, default in (
        ("cancels", options.no_cancels, max(4, round(d / 3))),
        ("mixed_batches", options.no_mixed_batches, max(3, round(d / 5))),
        ("row_locks", options.no_row_locks, max(1, round(d / 30))),
    ):
        count = getattr(options, name)
        setattr(options, name, 0 if off else default if count is None else count)
    options.table_lock = not options.no_table_lock
    if options.no_limits:
        options.limited_jobs = 0
    elif options.limited_jobs is None:
        options.limited_jobs = max(2 * LIMIT_CLUMP, round(options.jobs / 33))
    # Part of --jobs, not more: a run with limits lasts as long as one without.
    options.limited_jobs = min(options.limited_jobs, options.jobs // 2)
    options.ticks = not options.no_ticks


class Workloads:
    """The workloads' part of Torture (see the module's docstring). Torture provides the
    attributes below and db_now(), clock(), guarded(), owner(), victims()."""

    options: argparse.Namespace
    rng: random.Random
    faults: Faults
    lost_after: float
    paused: dict[int, tuple[float, Any]]
    away: tuple[float, Any] | None
    lock: sqlite3.Connection | None

    def init_workloads(self) -> None:
        self.enqueued_ids: set[str] = set()
        self.stop_uniques = threading.Event()
        self.stop_all = threading.Event()  # the run is over: row locks end too
        self.threads: list[threading.Thread] = []
        self.pending_kills: list[tuple[MixedBatch, int]] = []
        self.lock_tries = 0
        self.deadline_ids: list[str] | None = None
        self.table_conn: Any = None
        self.limit_pair: str | None = None  # the first job of kill_limited()'s pair
        self.limit_tries = 0
        self.limit_froze = False
        # A supervisor SIGSTOPped whole: its process group, the limited attempt it ran,
        # when to SIGCONT it at the latest (time.monotonic()), and its Cut (in
        # Faults.freezes). Other faults go on meanwhile, but none picks its workers.
        self.frozen: tuple[int, int, float, Any] | None = None

    def workload_events(self, duration: float) -> list[tuple[float, str]]:
        o, rng, d = self.options, self.rng, duration
        events = [(rng.uniform(0.05, 0.85) * d, "cancel") for _ in range(o.cancels)]
        events += [(rng.uniform(0.05, 0.75) * d, "mixed_batch") for _ in range(o.mixed_batches)]
        events += [(rng.uniform(0.05, 0.8) * d, "lock_rows") for _ in range(o.row_locks)]
        if o.limited_jobs:
            events += [(rng.uniform(0.1, 0.5) * d, "kill_limited") for _ in range(2)]
        return events

    # ----------------------------------------------------------------- cancels

    def cancel(self) -> bool:
        from django.db import DatabaseError, connection

        from bench.torture.torture_tasks import ORDINARY
        from django_jobstate.models import Job
        from django_jobstate.tasksapi import task_backends

        picked = self.rng.choice(["due", "later", "running"])
        how = self.rng.choice(["backend", "task", "job"])
        now = self.db_now()

        # Not the rows another connection holds locked: the cancel would wait for them.
        locked = [
            pk for lock in self.faults.workload.row_locks if not lock.released for pk in lock.pks
        ]

        def candidates() -> list[tuple[int, Any]]:
            jobs = Job.objects.filter(task_path__in=ORDINARY).exclude(pk__in=locked)
            jobs = jobs.order_by("run_after", "pk")
            if picked == "running":
                jobs = jobs.running()
            elif picked == "due":
                jobs = jobs.queued().filter(run_after__lte=now)
            else:
                jobs = jobs.queued().filter(run_after__gt=now)
            return list(jobs.values_list("pk", "result_id")[:50])

        found = self.guarded(candidates, [])
        if not found:
            return False
        pk, result_id = self.rng.choice(found)
        record = Cancel(str(result_id), how, picked, self.db_now())
        try:
            if how == "backend":
                task_backends["default"].cancel(str(result_id))
            elif how == "task":
                Job.objects.cancel_task(result_id)
            else:
                record.pk = pk
                Job.objects.cancel(Job.objects.get(pk=pk))
        except DatabaseError as exc:  # an outage's edge: said, and checked as it ended
            connection.close()
            record.error = f"{type(exc).__name__}: {exc}"
        record.done = self.db_now()
        self.faults.workload.cancels.append(record)
        print(f"  {self.clock()} cancel ({how}) of a {picked} task")
        return True

    # ------------------------------------------------------------ unique tasks

    def start_uniques(self) -> None:
        if self.options.no_unique:
            return
        for n in range(UNIQUE_THREADS):
            thread = threading.Thread(target=self.enqueue_uniques, args=(n,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop_threads(self, *, every: bool = False) -> None:
        self.stop_uniques.set()
        if every:
            self.stop_all.set()
        for thread in self.threads:
            thread.join(timeout=60)
        self.threads = []

    def enqueue_uniques(self, n: int) -> None:
        """Enqueue unique tasks over a few keys until told to stop (a thread of its own)."""
        from django.db import DatabaseError, connection, transaction

        from bench.torture import torture_tasks as tt

        rng = random.Random(f"{self.options.seed}/unique/{n}")
        hold = self.options.db == "postgres"  # SQLite: a held transaction holds every writer
        work = self.faults.workload
        probe = None
        errors: tuple[type[Exception], ...] = (DatabaseError,)
        if hold:
            import psycopg

            errors = (DatabaseError, psycopg.Error)
        try:
            while not self.stop_uniques.is_set():
                key = f"k{rng.randrange(UNIQUE_KEYS)}"
                seconds = round(rng.uniform(0.1, 0.8), 2)
                held = rng.uniform(0.2, 0.5) if hold and rng.random() < 0.3 else 0.0
                at = self.db_now()
                locked = False
                try:
                    with transaction.atomic():
                        result = tt.unique_flaky.enqueue(
                            self.options.seed, tt.SLEEP, seconds, self.options.fail_rate, key=key
                        )
                        if held:  # the caller's transaction goes on a moment
                            probe = probe or pg_connect(lock_timeout=0.2)
                            locked = holds_the_row(probe, str(result.id), held)
                except errors as exc:  # an outage: the thread goes on once it is over
                    connection.close()
                    work.unique_errors[type(exc).__name__] += 1
                    if probe is not None:
                        probe.close()
                        probe = None
                    time.sleep(0.2)
                    continue
                done = self.db_now()
                work.uniques.append(UniqueEnqueue(key, str(result.id), at, done, locked))
                self.stop_uniques.wait(rng.uniform(0.02, 0.2))
        finally:
            connection.close()
            if probe is not None:
                probe.close()

    # ---------------------------------------------------------- mixed batches

    def mixed_batch(self) -> None:
        from django.db import transaction
        from django.test import override_settings
        from django.utils import timezone

        from bench.torture import torture_tasks as tt

        rng, o = self.rng, self.options
        task = tt.batched_async if rng.random() < o.async_fraction else tt.batched
        due = timezone.now()
        # Ahead of the other due jobs, fast ones first (claim order: priority, due, id).
        task = task.using(run_after=due, priority=5)
        # No deadline: a timeout makes the worker write what it has before it begins.
        with override_settings(JOBSTATE_DEFAULT_TIMEOUT=None), transaction.atomic():
            fast = [task.enqueue(o.seed, tt.BATCH_FAST, 0, 0.0) for _ in range(BATCH_FAST_JOBS)]
            slow = task.enqueue(o.seed, tt.BATCH_SLOW, BATCH_SLOW_SECONDS, 0.0)
        batch = MixedBatch(
            [str(r.id) for r in fast], str(slow.id), self.db_now(), rng.random() < 0.5
        )
        self.enqueued_ids.update([*batch.fast, batch.slow])
        self.faults.workload.batches.append(batch)
        if batch.kill:
            self.pending_kills.append((batch, 0))
        print(f"  {self.clock()} mixed batch enqueued{' (its slow job to be killed)' * batch.kill}")

    def kill_batches(self) -> bool:
        """SIGKILL the worker of each pending batch's slow job half-way through its body
        (False while some are pending)."""
        from bench.models import Execution
        from bench.torture.torture_check import Kill
        from django_jobstate.models import Job, WorkerHeartbeat

        pending, self.pending_kills = self.pending_kills, []
        for batch, tries in pending:
            # Half-way through its body: the batch's fast jobs returned a while ago.
            since = self.db_now() - timedelta(seconds=BATCH_SLOW_SECONDS / 2)

            def worker(
                batch: MixedBatch = batch, since: datetime = since
            ) -> tuple[int, str] | None:
                job = Job.objects.running().filter(result_id=batch.slow).first()
                if job is None or not Execution.objects.filter(
                    result_id=batch.slow, attempt=job.attempt, recorded_at__lte=since
                ):
                    return None
                beat = WorkerHeartbeat.objects.filter(worker_id=job.worker_id).first()
                return None if beat is None else (beat.pid, job.worker_id)

            found = self.guarded(worker, None)
            supervisor = found and self.owner(found[0])
            if not found or not supervisor or supervisor.host or found[0] in self.paused:
                if tries < 2 * LOCK_WAIT:
                    self.pending_kills.append((batch, tries + 1))
                continue
            pid, worker_id = found
            at = self.db_now()
            os.kill(pid, signal.SIGKILL)
            kill = Kill("worker", worker_id, at, self.victims(at, worker_id=worker_id))
            self.faults.kills.append(kill)
            print(
                f"  {self.clock()} SIGKILL worker {worker_id} in a mixed batch's slow job "
                f"({len(kill.victims)} running)"
            )
        return not self.pending_kills

    # ------------------------------------------------------- concurrency limits

    def enqueue_limited(self, now: datetime, spread: float) -> None:
        """The limited jobs, in clumps due together over the first half of `spread`
        seconds from `now`: a key runs its clump one job after another, retries at the
        back, and must be done by the end of the faults, not lengthen the drain."""
        from django.db import transaction

        from bench.torture import torture_tasks as tt

        o = self.options
        rng = random.Random(f"{o.seed}/limits")
        n, clumps = o.limited_jobs, max(1, -(-o.limited_jobs // LIMIT_CLUMP))
        with transaction.atomic():
            for i in range(n):
                if i % LIMIT_CLUMP == 0:
                    due = now + timedelta(seconds=rng.uniform(0, 0.5 * spread))
                seconds = round(rng.uniform(0.2, 0.8), 2)
                slot = i % LIMIT_CLUMP
                task = tt.limited_per_key if slot < 2 * LIMIT_KEYS else tt.limited_per_task
                keyed = {"key": f"c{slot % LIMIT_KEYS}"} if task is tt.limited_per_key else {}
                result = task.using(run_after=due).enqueue(
                    o.seed, tt.LIMITED, seconds, o.fail_rate, **keyed
                )
                self.enqueued_ids.add(str(result.id))
        print(f"  {self.clock()} {n} limited jobs enqueued in {clumps} clumps")

    def kill_limited(self) -> bool:
        """Enqueue a pair of limited jobs of a key of their own, due now and ahead of the
        rest (a body of LIMIT_PAIR_SECONDS, then one of 1 s), wait until the first runs
        its body (False meanwhile, for up to 2 * LOCK_WAIT tries), then SIGSTOP its whole
        supervisor (once, if may_freeze(); not on SQLite, where a process stopped inside a
        write holds every writer back, the rescuer too), else SIGKILL its worker. Killed, the
        slot stays taken until its supervisor fails the attempt; stopped, until another
        fails it as lost (the lost-after window): the second job runs then, while the
        first body is still alive, and the stop ends once that second body began, so
        that both run at once: an overlap after a rescue (the database bounds rows, not
        processes). The supervisor kill and the other faults fall on the limited bodies
        of the clumps when their picks do (they prefer them)."""
        from bench.models import Execution
        from bench.torture import torture_tasks as tt
        from bench.torture.torture_check import Kill
        from django_jobstate.models import Job, WorkerHeartbeat

        o = self.options
        if self.limit_pair is None:
            task = tt.limited_per_key.using(priority=10)
            key = f"pair{len(self.enqueued_ids)}"
            first = task.enqueue(o.seed, tt.LIMITED, LIMIT_PAIR_SECONDS, 0.0, key=key)
            second = task.enqueue(o.seed, tt.LIMITED, 1.0, 0.0, key=key)
            self.enqueued_ids.update([str(first.id), str(second.id)])
            self.limit_pair = str(first.id)
            return False

        def query() -> tuple[int, str, int] | None:
            job = Job.objects.running().filter(result_id=self.limit_pair).first()
            if job is None or not Execution.objects.filter(
                result_id=job.result_id, attempt=job.attempt
            ):
                return None
            beat = WorkerHeartbeat.objects.filter(worker_id=job.worker_id).first()
            return None if beat is None else (beat.pid, job.worker_id, job.pk)

        found = self.guarded(query, None)
        supervisor = found and self.owner(found[0])
        if supervisor and supervisor.prefix is None:
            self.learn()  # a supervisor started since the last learn(): its prefix
        self.limit_tries += 1
        if (
            not found
            or not supervisor
            or supervisor.prefix is None
            or supervisor.host
            or found[0] in self.paused
        ):
            if found:  # on the partitioned host, or paused: another pair
                self.limit_pair = None
            if self.limit_tries < 2 * LOCK_WAIT:
                return False
            print(f"  {self.clock()} no limited pair's first body ran here: no stop")
            self.limit_pair, self.limit_tries = None, 0
            return True
        pid, worker_id, pk = found
        # A stop first (once it held, kills), where one may be made: else another pair.
        freeze = not self.limit_froze and o.db != "sqlite"
        if freeze and not self.may_freeze(supervisor):
            if self.limit_tries < 2 * LOCK_WAIT:
                self.limit_pair = None
                return False
            freeze = False
        self.limit_tries = 0
        if freeze and not self.freeze(supervisor, pk):  # its body ended before the stop
            self.limit_pair = None
            return True
        self.limit_pair = None
        if freeze:
            self.limit_froze = True
            return True
        at = self.db_now()
        os.kill(pid, signal.SIGKILL)
        kill = Kill("worker", worker_id, at, self.victims(at, worker_id=worker_id))
        self.faults.kills.append(kill)
        print(
            f"  {self.clock()} SIGKILL worker {worker_id} in a limited body, its key's next "
            f"job waiting ({len(kill.victims)} running)"
        )
        return True

    def may_freeze(self, supervisor: Any) -> bool:
        """Not a supervisor running an overrun or a held interpreter: stopped past its
        deadline, its body would go on past it. (A plain attempt whose deadline falls in
        the stop is failed late by its own supervisor once resumed: listed apart.) Nor one
        with a worker paused: the pause's end would SIGCONT that worker alone, and it would
        run on while its supervisor, stopped, could not stop it at a deadline."""
        from bench.torture import torture_tasks as tt
        from django_jobstate.models import Job

        if any(p.worker_id.startswith(supervisor.prefix) for _, p in self.paused.values()):
            return False

        def safe() -> bool:
            running = Job.objects.running().filter(worker_id__startswith=supervisor.prefix)
            rows = running.exclude(task_path__in=tt.LIMITED_TASKS).values_list("args", flat=True)
            return not any(args[1] in tt.OVERRUN_KINDS | {tt.GIL_HOLD} for args in rows)

        return self.guarded(safe, False)

    def freeze(self, supervisor: Any, pk: int) -> bool:
        """SIGSTOP `supervisor` whole while attempt `pk` runs; False (and SIGCONT at once)
        if that attempt had ended before the stop."""
        from bench.torture.torture_check import Cut
        from django_jobstate.models import Job

        at = self.db_now()
        os.killpg(supervisor.pid, signal.SIGSTOP)
        frozen = Cut(
            supervisor.prefix, at, self.victims(at, worker_id__startswith=supervisor.prefix)
        )
        self.faults.freezes.append(frozen)
        # Until the key's next body began elsewhere (thawed()), or this long at most.
        self.frozen = (supervisor.pid, pk, time.monotonic() + FREEZE_LONGEST, frozen)
        if pk not in frozen.victims or not self.guarded(
            Job.objects.running().filter(pk=pk).exists, False
        ):
            self.thaw()
            return False
        print(
            f"  {self.clock()} SIGSTOP supervisor s{supervisor.index} whole, in a limited "
            f"body, its key's next job waiting ({len(frozen.victims)} running)"
        )
        return True

    def thawed(self) -> bool:
        """Was the frozen attempt failed (rescued), and has a job of its key begun its
        body since?"""
        from bench.models import Execution
        from django_jobstate.models import Job

        if self.frozen is None:
            return False
        pk = self.frozen[1]

        def begun() -> bool:
            row = Job.objects.filter(pk=pk).values("concurrency_key", "finished_at").first()
            if row is None or row["finished_at"] is None:
                return False
            rows = Job.objects.filter(
                concurrency_key=row["concurrency_key"], started_at__gte=row["finished_at"]
            ).exclude(pk=pk)
            return any(
                Execution.objects.filter(result_id=rid, attempt=n).exists()
                for rid, n in rows.values_list("result_id", "attempt")
            )

        return self.guarded(begun, False)

    def thaw(self) -> None:
        """SIGCONT the supervisor stopped whole, if any."""
        if self.frozen is None:
            return
        pgid, _, _, fault = self.frozen
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGCONT)
        self.frozen = None
        fault.ended = self.db_now()
        print(f"  {self.clock()} SIGCONT of the stopped supervisor")

    def sample_limits(self) -> None:
        """Per concurrency key, in one statement each: more slot holders, or running
        rows, than the limit; held rows while the key has a free slot (a finish hands its
        slot on in its own transaction: never seen between the two)."""
        from django.db.models import Count, F, Max, OuterRef, Q, Subquery
        from django.db.models.functions import Coalesce

        from django_jobstate.limits.concurrency import HELD, HOLDS_SLOT
        from django_jobstate.models import Job
        from django_jobstate.states import State

        work = self.faults.workload

        def holders() -> list[dict[str, Any]]:
            rows = Job.objects.filter(HOLDS_SLOT).order_by().values("concurrency_key")
            return list(
                rows.annotate(
                    n=Count("pk"),
                    running=Count("pk", filter=Q(state=State.RUNNING)),
                    limit=Max("concurrency_limit"),
                )
            )

        def held_free() -> list[tuple[int, str, int, int]]:
            count = (
                Job.objects.filter(HOLDS_SLOT, concurrency_key=OuterRef("concurrency_key"))
                .order_by()
                .values("concurrency_key")
                .annotate(c=Count("pk"))
                .values("c")
            )
            held = Job.objects.filter(HELD).annotate(holders=Coalesce(Subquery(count), 0))
            rows = held.filter(holders__lt=F("concurrency_limit"))
            return list(rows.values_list("pk", "concurrency_key", "holders", "concurrency_limit"))

        found = self.guarded(holders, None)
        free = self.guarded(held_free, None)
        if found is None or free is None:
            return
        work.limit_samples += 1
        at = self.db_now()
        for row in found:
            key = row["concurrency_key"]
            work.limit_peaks[key] = max(work.limit_peaks.get(key, 0), row["running"])
            if max(row["n"], row["running"]) > row["limit"]:
                work.limit_over.append(
                    f"{at}: key {key[:12]} had {row['n']} slot holders, {row['running']} "
                    f"running, for a limit of {row['limit']}"
                )
        work.limit_held_free += [
            f"{at}: job {pk} held while key {key[:12]} had {n} of {limit} slots taken"
            for pk, key, n, limit in free
        ]

    # ------------------------------------------------------------ locked rows

    def lock_rows(self) -> bool:
        from django_jobstate.models import Job

        soon = self.db_now() + timedelta(seconds=2)

        def candidates() -> list[int]:
            queued = Job.objects.queued().filter(run_after__lte=soon).order_by("run_after", "pk")
            return list(queued.values_list("pk", flat=True)[:30])

        pks = self.guarded(candidates, [])
        if not pks:
            return False
        self.faults.workload.row_locks_exclusive = self.options.db != "sqlite"
        lock = RowLock(self.rng.sample(pks, min(LOCKED_ROWS, len(pks))), self.db_now())
        seconds = self.lost_after + 2.0
        thread = threading.Thread(target=self.hold_rows, args=(lock, seconds), daemon=True)
        thread.start()
        self.threads.append(thread)
        self.faults.workload.row_locks.append(lock)
        print(f"  {self.clock()} {len(lock.pks)} queued rows locked for {seconds:g} s")
        return True

    def hold_rows(self, lock: RowLock, seconds: float) -> None:
        """SELECT ... FOR UPDATE the rows still queued, keep them a while (a thread)."""
        from django.db import DatabaseError, connection, transaction

        from django_jobstate.models import Job

        try:
            with transaction.atomic():
                rows = Job.objects.select_for_update().filter(pk__in=lock.pks).queued()
                lock.pks = list(rows.values_list("pk", flat=True))
                lock.at, lock.held = self.db_now(), True
                self.stop_all.wait(seconds)
        except DatabaseError:  # an outage meanwhile: the lock went with the connection
            pass
        finally:
            lock.released = self.db_now()
            connection.close()

    # ------------------------------------------------------- the table lock

    def table_lock(self) -> bool:
        """Lock the job table for the lost-after window just after attempts with a 1 s
        timeout began (False until one has, for up to LOCK_WAIT tries)."""
        from bench.models import Execution
        from bench.torture.torture_check import Outage

        if any(lock.released is None for lock in self.faults.workload.row_locks):
            return False  # the lock would wait for them, and this loop with it
        if self.deadline_ids is None:
            self.deadline_ids, self.lock_tries = self.enqueue_deadlines(), 0
            return False
        since = self.db_now() - timedelta(seconds=0.5)
        ids = self.deadline_ids
        started = Execution.objects.filter(result_id__in=ids, attempt=1, recorded_at__gte=since)
        self.lock_tries += 1
        if not self.guarded(started.exists, False) and self.lock_tries < LOCK_WAIT:
            return False
        seconds = self.lost_after
        if self.options.db == "postgres":
            import psycopg

            from django_jobstate.models import Job

            self.table_conn = pg_connect(lock_timeout=2.0)
            table = Job._meta.db_table
            try:
                self.table_conn.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
            except psycopg.Error:  # a long transaction in the way: try again a moment later
                self.table_conn.close()
                self.table_conn = None
                return False
            what = "job table locked (ACCESS EXCLUSIVE)"
        elif self.options.db == "mysql":
            import MySQLdb

            from django_jobstate.models import Job

            self.table_conn = mysql_connect(lock_timeout=2.0)
            try:
                self.table_conn.cursor().execute(f"LOCK TABLES `{Job._meta.db_table}` WRITE")
            except MySQLdb.Error:  # a long transaction in the way: try again a moment later
                self.table_conn.close()
                self.table_conn = None
                return False
            what = "job table locked (LOCK TABLES ... WRITE)"
        else:
            self.hold_sqlite_write_lock()
            what = "SQLite's write lock held during deadlines"
        self.deadline_ids = None
        lock = Outage(what, self.db_now())
        self.faults.table_locks.append(lock)
        self.away = (time.monotonic() + seconds, lock)
        print(f"  {self.clock()} {what} for {seconds:g} s")
        return True

    def enqueue_deadlines(self) -> list[str]:
        """Attempts with a 1 s timeout, due now and ahead of the rest, mostly async."""
        from django.db import transaction
        from django.utils import timezone

        from bench.torture import torture_tasks as tt

        now, o = timezone.now(), self.options
        with transaction.atomic():
            results = [
                (tt.overrun if n % 4 == 0 else tt.overrun_async)
                .using(run_after=now, priority=10)
                .enqueue(o.seed, tt.DEADLINE, 3.0, o.fail_rate)
                for n in range(DEADLINE_JOBS)
            ]
        ids = [str(r.id) for r in results]
        self.enqueued_ids.update(ids)
        self.faults.workload.deadlines += ids
        return ids

    def release_table_lock(self) -> bool:
        """End the table lock in progress, if any (False: none on PostgreSQL)."""
        if self.table_conn is None:
            return False
        self.table_conn.rollback()
        self.table_conn.close()
        self.table_conn = None
        print(f"  {self.clock()} job table unlocked")
        return True

    def hold_sqlite_write_lock(self) -> None:
        """Another connection takes SQLite's write lock (BEGIN IMMEDIATE) and keeps it."""
        from django.db import connection

        self.lock = sqlite3.connect(
            str(connection.settings_dict["NAME"]), timeout=60, isolation_level=None
        )
        self.lock.execute("BEGIN IMMEDIATE")


def pg_connect(lock_timeout: float) -> Any:
    """A connection of its own to the run's PostgreSQL database (psycopg, not Django's).

    Its locks wait `lock_timeout` seconds at most: a table lock asked for queues every
    later lock behind it, this process's other connections' included, so an unbounded
    wait could wait for itself.
    """
    import psycopg
    from django.db import connection

    s = connection.settings_dict
    return psycopg.connect(
        host=s["HOST"],
        port=s["PORT"],
        user=s["USER"],
        password=s["PASSWORD"],
        dbname=s["NAME"],
        options=f"-c lock_timeout={int(lock_timeout * 1000)}",
    )


def mysql_connect(lock_timeout: float) -> Any:
    """A connection of its own to the run's MariaDB database (MySQLdb, not Django's),
    whose metadata and row locks wait `lock_timeout` seconds at most (pg_connect's
    reason: a LOCK TABLES waiting queues every later statement on the table behind it)."""
    import MySQLdb
    from django.db import connection

    s = connection.settings_dict
    conn = MySQLdb.connect(
        host=s["HOST"],
        port=int(s["PORT"]),
        user=s["USER"],
        password=s["PASSWORD"],
        database=s["NAME"],
        charset="utf8mb4",
    )
    seconds = max(1, round(lock_timeout))
    conn.cursor().execute(
        f"SET SESSION lock_wait_timeout = {seconds}, innodb_lock_wait_timeout = {seconds}"
    )
    return conn


def holds_the_row(probe: Any, result_id: str, seconds: float) -> bool:
    """Spend `seconds` in the caller's transaction; say whether it held the live row of
    `result_id` meanwhile (another connection cannot lock it, at the start and the end).

    A new task's row is not committed yet: the probe does not see it. A worker's own
    write holds the row for milliseconds: seen at both probes, the lock is the caller's.
    """
    from django_jobstate.models import Job

    table = Job._meta.db_table
    sql = (
        f'SELECT 1 FROM "{table}" WHERE result_id = %s AND finished_at IS NULL '
        "FOR NO KEY UPDATE NOWAIT"
    )
    import psycopg

    seen = []
    for wait in (0.05, seconds - 0.1):
        time.sleep(wait)
        try:
            with probe.transaction():
                probe.execute(sql, [result_id])
            seen.append(False)
        except psycopg.errors.LockNotAvailable as exc:  # NOWAIT's, or the lock_timeout's
            seen.append(exc.diag.message_primary.startswith("could not obtain lock on row"))
    return all(seen)

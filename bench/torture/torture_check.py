"""The torture run's verdict: figures computed from the rows and the log of faults.

Used by bench/torture/torture.py once every supervisor has stopped. See torture.py's docstring for
what each must-be-zero figure means and why its check is sound.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count
from django.utils import timezone

from bench.models import Execution
from bench.torture.torture_tasks import (
    FAIL,
    GIL_HOLD,
    GIL_OVERRUN,
    OK,
    OVERRUN,
    PLANNED_ERRORS,
    UGLY,
    UGLY_ERRORS,
    planned,
    planned_error,
    stored_message,
)
from bench.torture.torture_workloads import Workload
from django_jobstate.models import Job
from django_jobstate.states import FailureReason, State

# Slack when comparing a time this script took (wall clock + the measured offset to the
# database clock) with a time the database wrote.
CLOCK_SLACK = timedelta(milliseconds=50)
# How much later than its claim a body may begin to hold the interpreter: its first
# statement may wait out an outage of SQLite's write lock (6 s) first.
HOLD_LATE = timedelta(seconds=6.5)
# How late a worker may find its own attempt past its timeout before the supervisor's
# kill (it checks ten times a second) counts as not enforced.
TIMEOUT_SLACK = 1.0
# "(12.3 s)": the duration a worker measured when it found its attempt past its timeout
# itself (the supervisor's kill writes no duration).
LATE_TIMEOUT = re.compile(r"past its timeout of [0-9.]+ seconds \(([0-9.]+) s\)")
UGLY_CLASSES = {f"{c.__module__}.{c.__qualname__}" for c in UGLY_ERRORS}
# Tasks that end so are never retried (a cancel; a workflow's step whose upstream failed).
NEVER_RETRIED = (FailureReason.CANCELLED, FailureReason.UPSTREAM_FAILED)


# The error of an attempt lost because its process was stopped at another's deadline.
STOPPED_AT = re.compile(r"its worker process was stopped: job (\d+) passed its timeout")


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass
class Kill:
    """A SIGKILL of one worker process, or of a whole supervisor's process group."""

    kind: str  # "worker" or "supervisor"
    target: str  # the worker id, or the supervisor's worker-id prefix
    at: datetime  # database clock
    victims: list[int] = field(default_factory=list)  # attempts running at the kill


@dataclass
class Pause:
    """A worker process stopped with SIGSTOP, then resumed with SIGCONT."""

    pid: int
    worker_id: str
    long: bool  # longer than the lost-after window
    stopped: datetime  # database clock
    resumed: datetime | None = None
    victims: list[int] = field(default_factory=list)  # attempts running when it stopped
    continued: float | None = None  # when SIGCONT was sent (this process's monotonic clock)


@dataclass
class Outage:
    """The database away for longer than the lost-after window."""

    what: str
    at: datetime  # database clock
    ended: datetime | None = None


@dataclass
class Cut:
    """The link of a worker host cut for longer than the lost-after window."""

    prefix: str  # its supervisor's worker-id prefix
    at: datetime  # database clock
    victims: list[int] = field(default_factory=list)  # attempts running at the cut
    ended: datetime | None = None


@dataclass
class ConnectionKill:
    at: datetime  # database clock
    killed: int
    open: int  # the run database's connections that were not the torture process's


@dataclass
class Faults:
    kills: list[Kill] = field(default_factory=list)
    pauses: list[Pause] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)  # seconds each PostgreSQL restart took
    restarted_at: list[datetime] = field(default_factory=list)  # database clock
    outages: list[Outage] = field(default_factory=list)
    cuts: list[Cut] = field(default_factory=list)
    # Supervisors SIGSTOPped whole (process group) past the window, one of their workers in
    # a limited body: alive but silent, as a cut-off host (their attempts are excused alike).
    freezes: list[Cut] = field(default_factory=list)
    # {worker-id prefix: (supervisor index, clock skew, network namespace or "")}
    supervisors: dict[str, tuple[int, float, str]] = field(default_factory=dict)
    id_clashes: set[str] = field(default_factory=set)  # two supervisors naming workers alike
    samples: int = 0  # live-attempt samples taken during the run
    multi_live: set[str] = field(default_factory=set)  # result ids seen with 2+ live attempts
    supervisors_died: int = 0  # supervisors that exited without being killed
    in_flight: set[str] = field(default_factory=set)  # worker-id prefixes run --in-flight
    table_locks: list[Outage] = field(default_factory=list)  # the job table locked
    connection_kills: list[ConnectionKill] = field(default_factory=list)  # MariaDB
    workload: Workload = field(default_factory=Workload)  # cancels, ticks, unique, ...
    one_write_lock: bool = False  # SQLite: one lock for every writer of the database


@dataclass
class Figure:
    label: str
    value: Any
    must_be_zero: bool = False
    note: str = ""
    examples: list[str] = field(default_factory=list)

    @property
    def bad(self) -> bool:
        return self.must_be_zero and self.value != 0


def _seconds(values: list[float]) -> str:
    if not values:
        return "-"
    return f"p50 {statistics.median(values):.2f} s, max {max(values):.2f} s (n={len(values)})"


def _is_outage(error_class: str) -> bool:
    return "OperationalError" in error_class or "InterfaceError" in error_class


def _within(moment: datetime | None, start: datetime, end: datetime | None, after: float) -> bool:
    """Is `moment` in [start, end + after seconds] (give or take the slack)?"""
    if moment is None:
        return False
    end = end or datetime.max.replace(tzinfo=start.tzinfo) - timedelta(days=1)
    return start - CLOCK_SLACK <= moment <= end + timedelta(seconds=after) + CLOCK_SLACK


def _base(worker_id: str | None) -> str:
    return (worker_id or "").rsplit("/", 1)[0]


def check(
    enqueued: int, enqueued_ids: set[str], faults: Faults, log_text: str, lost_after: float
) -> dict[str, Figure]:
    """Compute every figure of the report (an ordered dict: key -> Figure)."""
    jobs = list(Job.objects.order_by("result_id", "attempt").values())
    executions = list(Execution.objects.values())
    # The schedule's ticks from the drain on are past the run (some are still queued).
    until = faults.workload.ticks_until
    past = {
        str(j["result_id"])
        for j in jobs
        if until is not None and j["scheduled_for"] is not None and j["scheduled_for"] >= until
    }
    jobs = [j for j in jobs if str(j["result_id"]) not in past]
    executions = [e for e in executions if str(e["result_id"]) not in past]
    by_key = {(str(j["result_id"]), j["attempt"]): j for j in jobs}
    by_pk = {j["id"]: j for j in jobs}
    runs = Counter((str(e["result_id"]), e["attempt"]) for e in executions)
    ran_by_key = {(str(e["result_id"]), e["attempt"]): e for e in executions}
    examples: dict[str, list[str]] = defaultdict(list)
    window = lost_after + 3.0  # after an outage or a cut: a window, plus beats and slack

    # Executions: twice, orphaned, of a released attempt, or after their attempt had failed.
    late, excused, orphans, released_ran, context_differs = 0, 0, 0, 0, 0
    for e in executions:
        job = by_key.get((str(e["result_id"]), e["attempt"]))
        if job is None:
            orphans += 1
            continue
        context_differs += e["context_attempt"] != e["attempt"]
        if job["failure_reason"] == FailureReason.RELEASED:
            released_ran += 1
            examples["released_ran"].append(f"{describe(job)}; executed by pid {e['pid']}")
        after = job["finished_at"] is not None and e["recorded_at"] > job["finished_at"]
        if after or e["seen_state"] != State.RUNNING:
            if any(
                e["worker_id"].startswith(cut.prefix)
                and e["recorded_at"] >= cut.at - CLOCK_SLACK
                and (cut.ended is None or job["started_at"] <= cut.ended + CLOCK_SLACK)
                for cut in [*faults.cuts, *faults.freezes]
            ):
                excused += 1
                examples["late_executions_excused"].append(
                    f"{describe(job)}; executed at {e['recorded_at']}"
                )
            else:
                late += 1
                examples["late_executions"].append(
                    f"{describe(job)}; executed by pid {e['pid']} at {e['recorded_at']} "
                    f"(saw {e['seen_state'] or 'no row'})"
                )
    twice = sum(1 for n in runs.values() if n > 1)
    succeeded_unrun = sum(
        1
        for j in jobs
        if j["state"] == State.SUCCEEDED and (str(j["result_id"]), j["attempt"]) not in runs
    )

    # Attempts, one by one, against their plan.
    contrary, misstored, unplanned_errors, unexpected_timeouts = 0, 0, Counter(), 0
    ugly_stored = 0
    not_enforced, deadline_to_stop, frozen_late = 0, [], 0
    early, off_clock = 0, 0
    failures: Counter[str] = Counter()
    outcome_ok: dict[int, str] = {}  # pk -> "planned" / "fault" / "contrary" / "ok" / "released"
    latest = timezone.now() + timedelta(minutes=1)
    for j in jobs:
        seed, kind, _seconds_arg, fail_rate = j["args"]
        rid = str(j["result_id"])
        plan = planned(seed, kind, rid, j["attempt"], fail_rate)
        j["plan"] = plan
        execution = ran_by_key.get((rid, j["attempt"]))
        verdict = "ok"
        if j["state"] == State.SUCCEEDED:
            verdict = "ok" if plan == OK else "contrary"
        elif j["state"] == State.FAILED:
            reason, error_class = j["failure_reason"], j["error_class"]
            failures[reason] += 1
            if reason == FailureReason.RELEASED:
                verdict = "released"
            elif reason == FailureReason.CANCELLED:  # checked with the cancels
                verdict = "cancelled"
            elif reason == FailureReason.UPSTREAM_FAILED:  # torture_check_workflows.py
                verdict = "upstream_failed"
            elif reason == FailureReason.ERROR and error_class in PLANNED_ERRORS:
                wanted = planned_error(seed, kind, rid, j["attempt"])
                stored = (error_class, j["error_message"])
                verdict = "contrary"
                if plan == FAIL and stored == (
                    class_name(wanted),
                    stored_message(wanted, j["attempt"]),
                ):
                    verdict = "planned"
                    ugly_stored += error_class in UGLY_CLASSES
                elif plan == FAIL and error_class in UGLY_CLASSES:
                    misstored += 1
                    examples["misstored"].append(f"{describe(j)}: {j['error_message']!r}")
            elif reason == FailureReason.TIMEOUT:
                verdict = "planned" if plan == OVERRUN else "fault"
                unexpected_timeouts += plan != OVERRUN
                late_timeout = LATE_TIMEOUT.search(j["error_message"])
                if late_timeout and float(late_timeout[1]) > j["timeout"] + TIMEOUT_SLACK:
                    if _frozen_at_deadline(j, faults):
                        frozen_late += 1  # no supervisor left awake to stop it
                    else:
                        not_enforced += 1
                        examples["not_enforced"].append(describe(j))
                elif plan == OVERRUN and execution is not None and not late_timeout:
                    deadline = execution["recorded_at"] + timedelta(seconds=j["timeout"])
                    deadline_to_stop.append((j["finished_at"] - deadline).total_seconds())
            elif reason == FailureReason.ERROR:
                verdict = "fault"
                unplanned_errors[error_class] += 1
            else:  # lost, interrupted
                verdict = "fault"
        if execution is not None and execution["ended_at"] is not None:
            not_enforced += 1  # alive after sleeping (holding) past its deadline
            examples["not_enforced"].append(f"{describe(j)}; body ended {execution['ended_at']}")
        outcome_ok[j["id"]] = verdict
        if verdict == "contrary":
            contrary += 1
            examples["contrary"].append(describe(j))
        # The database's clock, whatever the supervisor's says.
        began = [j["started_at"], execution and execution["recorded_at"]]
        if any(t is not None and t < j["run_after"] - CLOCK_SLACK for t in began):
            early += 1
            examples["early"].append(f"{describe(j)}; due {j['run_after']}")
        times = [j["enqueued_at"] - CLOCK_SLACK, j["started_at"], j["finished_at"], latest]
        present = [t for t in times if t is not None]
        if present != sorted(present):
            off_clock += 1
            examples["off_clock"].append(f"{describe(j)}; enqueued {j['enqueued_at']}")

    # Logical tasks: their chain of attempts and how they ended.
    chains: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for j in jobs:
        chains[str(j["result_id"])].append(j)
    broken, not_terminal, should_have, planned_failures = 0, 0, 0, 0
    through_faults: Counter[str] = Counter()
    for attempts in chains.values():
        numbers = [a["attempt"] for a in attempts]
        last = attempts[-1]
        released = [a["failure_reason"] == FailureReason.RELEASED for a in attempts]
        ran = [a for a, r in zip(attempts, released, strict=True) if not r]
        chain_ok = (
            numbers == list(range(1, len(numbers) + 1))
            # A released attempt does not use up one of the task's attempts.
            and all(
                b["max_attempts"] == a["max_attempts"] + r
                for a, b, r in zip(attempts, attempts[1:], released, strict=False)
            )
            and len(ran) <= attempts[0]["max_attempts"]
            and all(a["state"] == State.FAILED for a in attempts[:-1])
            and not released[-1]
            and not (
                last["state"] == State.FAILED
                and len(ran) < attempts[0]["max_attempts"]
                and last["failure_reason"] not in NEVER_RETRIED
            )
        )
        if not chain_ok:
            broken += 1
            examples["broken_chains"] += [describe(a) for a in attempts]
        if last["state"] not in (State.SUCCEEDED, State.FAILED):
            not_terminal += 1
            continue
        seed, kind, _s, fail_rate = last["args"]
        rid = str(last["result_id"])
        # The attempts that could run: every number up to max_attempts but released ones.
        numbers_run = {a["attempt"] for a in ran}
        numbers_run.update(range(last["attempt"] + 1, last["max_attempts"] + 1))
        could_succeed = any(planned(seed, kind, rid, n, fail_rate) == OK for n in numbers_run)
        if last["state"] == State.SUCCEEDED or not could_succeed:
            planned_failures += last["state"] == State.FAILED
            continue
        verdicts = [outcome_ok[a["id"]] for a in attempts]
        if "cancelled" in verdicts or "upstream_failed" in verdicts:
            through_faults["cancelled" if "cancelled" in verdicts else "upstream"] += 1
            continue
        if chain_ok and "contrary" not in verdicts:
            through_faults["once" if attempts[0]["max_attempts"] == 1 else "retried"] += 1
        else:
            should_have += 1
            examples["should_have_succeeded"] += [describe(a) for a in attempts]

    # Kills, cuts and pauses: who rescued what, how fast.
    killed_at: dict[str, datetime] = {}  # worker id or prefix -> when
    rescue: dict[str, list[float]] = {"worker": [], "supervisor": [], "cut": []}
    not_lost, cut_not_lost = 0, 0
    for kill in faults.kills:
        killed_at[kill.target] = kill.at
        for pk in kill.victims:
            job = by_pk.get(pk)
            ok = (
                FailureReason.LOST,
                FailureReason.INTERRUPTED,
                FailureReason.RELEASED,  # claimed, never started: handed back
                FailureReason.TIMEOUT,  # its deadline came first
                FailureReason.CANCELLED,  # cancelled before: whatever ends it, cancelled
            )
            if job is None or job["state"] != State.FAILED or job["failure_reason"] not in ok:
                not_lost += 1
                examples["killed_not_lost"].append(describe(job) if job else f"job {pk} gone")
                continue
            if job["failure_reason"] != FailureReason.RELEASED:
                rescue[kill.kind].append((job["finished_at"] - kill.at).total_seconds())
    for cut in faults.cuts:
        for pk in cut.victims:
            job = by_pk.get(pk)
            if job is not None and job["finished_at"] and job["finished_at"] < cut.at:
                continue  # its outcome was written before the cut, committed after it
            rescued = (FailureReason.LOST, FailureReason.CANCELLED)
            if job is None or job["failure_reason"] not in rescued:
                cut_not_lost += 1
                examples["cut_not_lost"].append(describe(job) if job else f"job {pk} gone")
                continue
            rescue["cut"].append((job["finished_at"] - cut.at).total_seconds())
    stopped_at_deadline = 0
    for pause in faults.pauses:
        for pk in pause.victims:
            job = by_pk.get(pk)
            if (
                job is not None
                and job["failure_reason"] == FailureReason.TIMEOUT
                and _within(job["finished_at"], pause.stopped, pause.resumed, 0)
            ):
                stopped_at_deadline += 1
                examples["stopped_at_deadline"].append(describe(job))

    # Attempts failed as lost: by a fault that silenced their worker, or healthy ones.
    healthy: Counter[str] = Counter()
    lost_expected = beside_overrun = beside_cancellable = 0

    def killed(j: dict[str, Any]) -> datetime | None:
        """When its worker, or its worker's supervisor, was killed, if before it failed."""
        wid = j["worker_id"] or ""
        kill_at = killed_at.get(wid) or killed_at.get(f"{_base(wid)}/")
        return (
            kill_at if kill_at is not None and j["finished_at"] >= kill_at - CLOCK_SLACK else None
        )

    def settle_cut_short(overrun: dict[str, Any], j: dict[str, Any]) -> bool:
        """A planned overrun (or a cancelled attempt) whose supervisor was killed in the
        settle that wrote its neighbour `j`, before it wrote the overrun's own failure."""
        kill_at = killed(overrun)
        planned = overrun["plan"] == OVERRUN or overrun["cancel_requested_at"] is not None
        return (
            planned and kill_at is not None and kill_at <= j["finished_at"] + timedelta(seconds=5)
        )

    frozen = frozen_writers(faults, jobs)
    for j in jobs:
        if j["failure_reason"] != FailureReason.LOST:
            continue
        wid, finished = j["worker_id"] or "", j["finished_at"]
        base = _base(wid)
        if killed(j):
            lost_expected += 1
            continue
        if any(
            wid.startswith(cut.prefix) and _within(finished, cut.at, cut.ended, window)
            for cut in [*faults.cuts, *faults.freezes]
        ):
            lost_expected += 1
            continue
        # With --in-flight, the process of an overrun that cannot be cancelled (a thread,
        # or an async task holding the loop) is stopped at its deadline (or its cancel's
        # grace) with the attempts running beside it: lost, as documented, not taken for
        # lost. An async attempt that only awaits is cancelled on the loop instead: its
        # neighbours must not go with it, unless something held that loop (the
        # interpreter held by an attempt beside it, or the process SIGSTOPped).
        stopped_by = STOPPED_AT.search(j["error_message"] or "")
        if stopped_by and base in faults.in_flight:
            overrun = by_pk.get(int(stopped_by[1]))
            # The overrun failed as timed out (or cancelled); or as lost, its supervisor
            # killed before it wrote that (seen: a SIGKILL of the supervisor between this
            # neighbour's failure and the overrun's, both in one settle of the process).
            ended = overrun is not None and (
                overrun["failure_reason"] in (FailureReason.TIMEOUT, FailureReason.CANCELLED)
                or (
                    overrun["failure_reason"] == FailureReason.LOST and settle_cut_short(overrun, j)
                )
            )
            if ended and overrun["worker_id"] == wid:
                since = finished - timedelta(seconds=1)
                # Its failure written late, the database away when its process was
                # stopped: the stop came before the outage (seen: SIGSTOPped across its
                # deadline, stopped at 47 s, the outage from 46 to 52 s, written at 53 s).
                for o in faults.outages:
                    if _within(finished, o.at, o.ended, window):
                        since = min(since, o.at - timedelta(seconds=1))
                # On SQLite any writer frozen inside a write holds every other writer,
                # this worker's loop too when it writes (seen: a 6 s pause of another
                # worker, then 5 neighbours lost at the deadline it could not cancel).
                stalled = any(_overlaps(since, finished, f.at, f.ended) for f in frozen)
                if (
                    _cancellable(overrun)
                    and not held(jobs, faults, wid, since, finished)
                    and not stalled
                ):
                    beside_cancellable += 1
                    examples["lost_beside_async"].append(
                        f"{describe(j)}; beside job {overrun['id']}"
                    )
                else:
                    beside_overrun += 1
                continue
        seed, kind, _s, _rate = j["args"]
        if any(_within(finished, o.at, o.ended, window) for o in faults.outages):
            cause = "outage"
        elif any(_within(finished, t.at, t.ended, window) for t in faults.table_locks):
            cause = "table_lock"
        elif kind in (GIL_HOLD, GIL_OVERRUN) and j["attempt"] == 1:
            cause = "gil"
        elif any(
            p.worker_id == wid and _within(finished, p.stopped, p.resumed, window)
            for p in faults.pauses
        ):
            cause = "paused"
        elif faults.supervisors.get(base, (0, 0.0, ""))[1]:
            cause = "skewed"
        else:
            cause = "other"
        healthy[cause] += 1
        examples[f"lost_{cause}"].append(describe(j))
    slow_bound = lost_after + 3.0
    slow = sum(1 for s in rescue["supervisor"] + rescue["cut"] if s > slow_bound)

    multi_live_end = (
        Job.objects.live().order_by().values("result_id").annotate(n=Count("id")).filter(n__gt=1)
    ).count()
    outage_errors = sum(n for cls, n in unplanned_errors.items() if _is_outage(cls))
    other_errors = {cls: n for cls, n in unplanned_errors.items() if not _is_outage(cls)}
    kinds = Counter(j["args"][1] for j in jobs if j["attempt"] == 1)
    skews = sorted((i, s) for i, s, _ in faults.supervisors.values() if s)
    hosts = sorted(i for i, _, h in faults.supervisors.values() if h)

    figures = {
        "jobs_enqueued": Figure("jobs enqueued", enqueued),
        "attempts_created": Figure("attempts created", len(jobs)),
        "executions": Figure("executions recorded", len(executions)),
        "tasks_missing": Figure(
            "logical tasks missing from the table", len(enqueued_ids - set(chains)), True
        ),
        "late_executions": Figure(
            "executions of an attempt after it was already failed", late, True
        ),
        "late_executions_excused": Figure(
            "  ... by a body its cut-off host started once the link was back (not counted)",
            excused,
        ),
        "released_ran": Figure("handed-back (released) attempts that ran", released_ran, True),
        "run_twice": Figure("attempts run twice", twice, True),
        "orphan_executions": Figure("executions without an attempt row", orphans, True),
        "succeeded_unrun": Figure(
            "attempts succeeded without their body running", succeeded_unrun, True
        ),
        "left_running": Figure(
            "attempts left running", sum(1 for j in jobs if j["state"] == State.RUNNING), True
        ),
        "not_terminal": Figure("logical tasks not terminal at the end", not_terminal, True),
        "multi_live": Figure(
            "logical tasks with more than one live attempt",
            len(faults.multi_live) + multi_live_end,
            True,
            f"{faults.samples} samples during the run, one at the end",
        ),
        "broken_chains": Figure(
            "attempt chains broken (gap, past max_attempts, released attempt counted, "
            "attempt after success, missing retry)",
            broken,
            True,
        ),
        "contrary": Figure("attempts whose outcome contradicts their plan", contrary, True),
        "misstored": Figure(
            "unstorable errors (NUL, lone surrogate, str() raises) not stored escaped",
            misstored,
            True,
        ),
        "not_enforced": Figure("timeouts not enforced", not_enforced, True),
        "frozen_late": Figure(
            "  ... found late by their own supervisor, SIGSTOPped whole across the deadline "
            "(not counted)",
            frozen_late,
        ),
        "should_have_succeeded": Figure(
            "tasks that should have succeeded and did not", should_have, True
        ),
        "killed_not_lost": Figure(
            "attempts of killed workers not failed (lost, released or timed out)", not_lost, True
        ),
        "cut_not_lost": Figure(
            "attempts of the cut-off host not failed as lost", cut_not_lost, True
        ),
        "healthy_lost": Figure(
            "attempts of healthy workers taken for lost (never killed nor cut off)",
            sum(healthy.values()),
            True,
        ),
        "lost_outage": Figure(
            "  healthy attempts taken for lost during an outage", healthy["outage"], True
        ),
        "lost_gil": Figure("  GIL-held attempts taken for lost", healthy["gil"], True),
        "lost_paused": Figure(
            "  attempts of a SIGSTOPped worker taken for lost (its supervisor alive)",
            healthy["paused"],
            True,
        ),
        "lost_skewed": Figure(
            "  attempts of a supervisor with a skewed clock taken for lost",
            healthy["skewed"],
            True,
        ),
        "lost_table_lock": Figure(
            "  healthy attempts taken for lost during a table lock", healthy["table_lock"], True
        ),
        "lost_other": Figure("  others", healthy["other"], True),
        "lost_beside_overrun": Figure(
            "attempts in flight beside an overrun, lost with its stopped process (--in-flight)",
            beside_overrun,
        ),
        "lost_beside_async": Figure(
            "attempts in flight lost with their process, stopped at the deadline of an async "
            "attempt its event loop should have cancelled",
            beside_cancellable,
            True,
        ),
        "early": Figure("attempts started before they were due (database clock)", early, True),
        "off_clock": Figure(
            "attempts whose times are off the database clock (skewed supervisor)",
            off_clock,
            True,
        ),
        "id_clashes": Figure(
            "worker ids shared by two supervisors (all given the same --worker-id)",
            len(faults.id_clashes),
            True,
            examples=sorted(faults.id_clashes),
        ),
        "other_errors": Figure(
            "attempts failed by an unplanned error other than a database outage",
            sum(other_errors.values()),
            True,
            ", ".join(f"{cls} x{n}" for cls, n in other_errors.items()),
        ),
        "supervisors_died": Figure(
            "supervisors that died on their own", faults.supervisors_died, True
        ),
        "failed_as_planned": Figure(
            "tasks failed as planned (every attempt that could run planned to fail)",
            planned_failures,
        ),
        "failed_through_faults_once": Figure(
            "tasks failed only through faults: single-attempt tasks", through_faults["once"]
        ),
        "failed_through_faults_retried": Figure(
            "tasks failed only through faults: retried tasks", through_faults["retried"]
        ),
        "failed_cancelled": Figure("tasks ended by a cancel", through_faults["cancelled"]),
        "failed_upstream": Figure(
            "steps failed as upstream_failed (never started)", through_faults["upstream"]
        ),
        "worker_kills": Figure(
            "worker processes SIGKILLed", sum(k.kind == "worker" for k in faults.kills)
        ),
        "supervisor_kills": Figure(
            "supervisors SIGKILLed (whole process group)",
            sum(k.kind == "supervisor" for k in faults.kills),
        ),
        "pauses": Figure(
            "workers SIGSTOPped then SIGCONTed (long / short)",
            f"{sum(p.long for p in faults.pauses)} / {sum(not p.long for p in faults.pauses)}",
        ),
        "stopped_at_deadline": Figure(
            "  attempts of a SIGSTOPped worker killed at their deadline while stopped",
            stopped_at_deadline,
        ),
        "connection_kills": Figure(
            "database connections killed (MariaDB: KILL CONNECTION; of those open)",
            sum(k.killed for k in faults.connection_kills),
            note=", ".join(f"{k.killed} of {k.open}" for k in faults.connection_kills),
        ),
        "restarts": Figure(
            "server restarts (PostgreSQL, MariaDB)",
            len(faults.restarts),
            note=", ".join(f"{s:.1f} s" for s in faults.restarts),
        ),
        "outages": Figure(
            "database outages longer than the lost-after window",
            len(faults.outages),
            note=", ".join(
                f"{o.what} {(o.ended - o.at).total_seconds():.1f} s"
                for o in faults.outages
                if o.ended
            ),
        ),
        "cuts": Figure(
            "network partitions of a worker host (link cut past the window)",
            len(faults.cuts),
            note=", ".join(
                f"{(c.ended - c.at).total_seconds():.1f} s, {len(c.victims)} running"
                for c in faults.cuts
                if c.ended
            )
            or ("supervisor" + "s" * (len(hosts) > 1) + " " + ", ".join(f"s{i}" for i in hosts))
            * bool(hosts),
        ),
        "skewed": Figure(
            "supervisors with a skewed clock",
            len(skews),
            note=", ".join(f"s{i} {s:+g} s" for i, s in skews),
        ),
        "same_worker_id": Figure(
            "supervisors started with the same --worker-id", len(faults.supervisors)
        ),
        "gil_jobs": Figure(
            "tasks holding the interpreter (past a 1 s timeout / none of their own)",
            f"{kinds[GIL_OVERRUN]} / {kinds[GIL_HOLD]}",
        ),
        "ugly_jobs": Figure("tasks raising unstorable errors", kinds[UGLY]),
        "ugly_stored": Figure("  unstorable errors raised, and stored escaped", ugly_stored),
        "rescue_worker_kill": Figure(
            "kill -> rescue, worker SIGKILL (its supervisor fails it)", _seconds(rescue["worker"])
        ),
        "rescue_supervisor_kill": Figure(
            "kill -> rescue, supervisor SIGKILL (lost-after window)", _seconds(rescue["supervisor"])
        ),
        "rescue_cut": Figure(
            "cut -> rescue, partitioned host (lost-after window)", _seconds(rescue["cut"])
        ),
        "slow_rescues": Figure(f"rescues slower than lost-after + 3 s ({slow_bound:g} s)", slow),
        "deadline_to_stop": Figure(
            "deadline -> timed-out attempt failed, planned overruns", _seconds(deadline_to_stop)
        ),
        "failures": Figure(
            "failed attempts by reason",
            ", ".join(f"{reason} {n}" for reason, n in sorted(failures.items())) or "-",
        ),
        "context_attempt": Figure(
            "bodies whose TaskContext.attempt differs from Job.attempt",
            context_differs,
            must_be_zero=True,  # DESIGN: TaskContext.attempt equals Job.attempt
        ),
        "outage_errors": Figure("attempts failed by a database outage (error)", outage_errors),
        "unexpected_timeouts": Figure(
            "timeouts of attempts not planned to overrun", unexpected_timeouts
        ),
        "lost_expected": Figure(
            "attempts failed as lost after their worker was killed or cut off", lost_expected
        ),
        "worker_crashes": Figure(
            "worker processes that ended on an uncaught exception (log)",
            len(crashed := crashes(log_text)),
            examples=crashed,
        ),
        "late_outcomes_refused": Figure(
            "late outcomes refused (worker log: 'discarded')", log_text.count("discarded")
        ),
    }
    from bench.torture.torture_check_workloads import workload_figures  # it imports this module

    figures.update(workload_figures(jobs, executions, faults, examples))
    for key, lines in examples.items():
        if key in figures:
            figures[key].examples = lines[:5]
    return figures


def _frozen_at_deadline(job: dict[str, Any], faults: Faults) -> bool:
    """Was the supervisor of `job` stopped whole (kill_limited) when its deadline came?"""
    if job["started_at"] is None or job["timeout"] is None:
        return False
    deadline = job["started_at"] + timedelta(seconds=job["timeout"])
    wid = job["worker_id"] or ""
    return any(
        wid.startswith(f.prefix) and _within(deadline, f.at, f.ended, 0) for f in faults.freezes
    )


def _cancellable(job: dict[str, Any]) -> bool:
    """Can the worker's event loop cancel this attempt (async, only awaiting)?"""
    kind = job["args"][1]
    holds = kind in (GIL_HOLD, GIL_OVERRUN) and job["attempt"] == 1
    return job["task_path"].endswith("_async") and not holds


def _overlaps(start: datetime, end: datetime, at: datetime, ended: datetime | None) -> bool:
    """Do [start, end] and [at, ended] (ended None: still on) meet, give or take the slack?"""
    return at - CLOCK_SLACK <= end and (ended is None or ended + CLOCK_SLACK >= start)


def frozen_writers(faults: Faults, jobs: list[dict[str, Any]]) -> list[Outage]:
    """On SQLite, when a process may have held the one write lock from every other writer:
    any worker SIGSTOPped, or its interpreter held by an attempt (a thread of its process,
    the worker's loop or its flushing thread, may be inside a write: it cannot COMMIT until
    the interpreter is free; seen: a 6 s hold of the GIL in an --in-flight worker, no job
    row written by anyone for 6 s). None elsewhere: a frozen writer holds its rows only."""
    if not faults.one_write_lock:
        return []
    windows = [Outage("stopped writer", p.stopped, p.resumed) for p in faults.pauses]
    for j in jobs:
        if j["args"][1] in (GIL_HOLD, GIL_OVERRUN) and j["attempt"] == 1 and j["started_at"]:
            # Until the hold ended: at most its seconds after the claim, plus HOLD_LATE (not
            # until the rescue of a process killed holding it, nor for ever if unfinished).
            ended = j["started_at"] + timedelta(seconds=j["args"][2]) + HOLD_LATE
            if j["finished_at"] is not None:
                ended = min(ended, j["finished_at"])
            windows.append(Outage("held interpreter", j["started_at"], ended))
    return windows


def held(
    jobs: list[dict[str, Any]], faults: Faults, wid: str, start: datetime, end: datetime
) -> bool:
    """Was worker `wid`'s process held at some moment of [start, end]: SIGSTOPped, or its
    interpreter held by an attempt it ran?"""
    if any(
        p.worker_id == wid and _overlaps(start, end, p.stopped, p.resumed) for p in faults.pauses
    ):
        return True
    return any(
        j["worker_id"] == wid
        and j["args"][1] in (GIL_HOLD, GIL_OVERRUN)
        and j["attempt"] == 1
        and j["started_at"] is not None
        and _overlaps(start, end, j["started_at"], j["finished_at"])
        for j in jobs
    )


def crashes(log_text: str) -> list[str]:
    """The exception that ended each crashed worker process, from the supervisors' logs.

    multiprocessing prints "Process <name>:" and the traceback; log lines start with a date.
    """
    found, lines = [], log_text.splitlines()
    for n, line in enumerate(lines):
        if re.fullmatch(r"Process .+:", line):
            block = []
            for following in lines[n + 1 :]:
                if re.match(r"\d{4}-\d\d-\d\d |Process .+:$", following):
                    break
                block.append(following)
            last = [b for b in block if b and not b[0].isspace() and not b.startswith("Traceback")]
            found.append(last[-1] if last else "?")
    return found


def describe(job: dict[str, Any]) -> str:
    """One line about an attempt, for the examples under a failed figure."""
    what = f"{job['state']}"
    if job["state"] == State.FAILED:
        what += f" ({job['failure_reason']}: {job['error_class']}: {job['error_message'][:80]})"
    return (
        f"job {job['id']} {job['task_path'].rpartition('.')[2]} {job['result_id']} "
        f"attempt {job['attempt']}/{job['max_attempts']} plan {job.get('plan', '?')} "
        f"args {job['args']} worker {job['worker_id']} started {job['started_at']} "
        f"finished {job['finished_at']}: {what}"
    )

"""The torture run's verdict: figures computed from the rows and the log of faults.

Used by bench/torture.py once every supervisor has stopped. See torture.py's docstring for
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

from bench.models import Execution
from bench.torture_tasks import FAIL, OK, OVERRUN, planned
from django_jobstate.models import Job
from django_jobstate.states import FailureReason, State

# Slack when comparing a time this script took (wall clock + the measured offset to the
# database clock) with a time the database wrote.
CLOCK_SLACK = timedelta(milliseconds=50)
NEIGHBOUR_TIMEOUT = "ended itself to stop an attempt past its timeout"


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
    long: bool  # long enough for the worker to be taken for lost
    stopped: datetime  # database clock
    resumed: datetime | None = None
    victims: list[int] = field(default_factory=list)  # attempts running when it stopped


@dataclass
class Faults:
    kills: list[Kill] = field(default_factory=list)
    pauses: list[Pause] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)  # seconds each PostgreSQL restart took
    samples: int = 0  # live-attempt samples taken during the run
    multi_live: set[str] = field(default_factory=set)  # result ids seen with 2+ live attempts
    supervisors_died: int = 0  # supervisors that exited without being killed


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


def _excused(execution: dict[str, Any], job: dict[str, Any], pauses: list[Pause]) -> bool:
    """Was the process that wrote `execution` paused between its attempt's start and it?"""
    for pause in pauses:
        resumed = pause.resumed or datetime.max.replace(tzinfo=pause.stopped.tzinfo)
        if (
            pause.pid == execution["pid"]
            and pause.stopped - CLOCK_SLACK <= execution["recorded_at"]
            and resumed + CLOCK_SLACK >= job["started_at"]
        ):
            return True
    return False


def _frozen(job: dict[str, Any], pauses: list[Pause]) -> bool:
    """Was the attempt's worker paused (watchdog and all) while the attempt ran?"""
    return any(
        pause.worker_id == job["worker_id"]
        and pause.stopped - CLOCK_SLACK <= job["finished_at"]
        and (pause.resumed is None or pause.resumed + CLOCK_SLACK >= job["started_at"])
        for pause in pauses
    )


def check(enqueued: int, faults: Faults, log_text: str, lost_after: float) -> dict[str, Figure]:
    """Compute every figure of the report (an ordered dict: key -> Figure)."""
    jobs = list(Job.objects.order_by("result_id", "attempt").values())
    executions = list(Execution.objects.values())
    by_key = {(str(j["result_id"]), j["attempt"]): j for j in jobs}
    by_pk = {j["id"]: j for j in jobs}
    runs = Counter((str(e["result_id"]), e["attempt"]) for e in executions)
    examples: dict[str, list[str]] = defaultdict(list)

    # Executions: twice, orphaned, or after their attempt had failed.
    late, excused, orphans = 0, 0, 0
    for e in executions:
        job = by_key.get((str(e["result_id"]), e["attempt"]))
        if job is None:
            orphans += 1
            continue
        after = job["finished_at"] is not None and e["recorded_at"] > job["finished_at"]
        if after or e["seen_state"] != State.RUNNING:
            if _excused(e, job, faults.pauses):
                excused += 1
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
    contrary, unplanned_errors, unexpected_timeouts, frozen_overruns = 0, Counter(), 0, 0
    failures = Counter()
    outcome_ok: dict[int, str] = {}  # pk -> "planned" / "fault" / "contrary" / "ok"
    for j in jobs:
        seed, kind, _seconds_arg, fail_rate = j["args"]
        plan = planned(seed, kind, str(j["result_id"]), j["attempt"], fail_rate)
        j["plan"] = plan
        verdict = "ok"
        if j["state"] == State.SUCCEEDED:
            verdict = "ok" if plan == OK else "contrary"
            if plan == OVERRUN and _frozen(j, faults.pauses):
                verdict = "ok"  # its watchdog was frozen past the deadline too: see below
                frozen_overruns += 1
                examples["frozen_overruns"].append(describe(j))
        elif j["state"] == State.FAILED:
            reason, error_class = j["failure_reason"], j["error_class"]
            is_planned_error = error_class.endswith(".TortureFailure")
            failures[reason] += 1
            if reason == FailureReason.ERROR and is_planned_error:
                verdict = "planned" if plan == FAIL else "contrary"
            elif reason == FailureReason.TIMEOUT:
                verdict = "planned" if plan == OVERRUN else "fault"
                unexpected_timeouts += plan != OVERRUN
            elif reason == FailureReason.ERROR:
                verdict = "fault"
                unplanned_errors[error_class] += 1
            else:  # lost, interrupted
                verdict = "fault"
        outcome_ok[j["id"]] = verdict
        if verdict == "contrary":
            contrary += 1
            examples["contrary"].append(describe(j))

    # Logical tasks: their chain of attempts and how they ended.
    chains: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for j in jobs:
        chains[str(j["result_id"])].append(j)
    broken, not_terminal, should_have, planned_failures = 0, 0, 0, 0
    through_faults = Counter()
    for attempts in chains.values():
        numbers = [a["attempt"] for a in attempts]
        last, max_attempts = attempts[-1], attempts[-1]["max_attempts"]
        chain_ok = (
            numbers == list(range(1, len(numbers) + 1))
            and len(numbers) <= max_attempts
            and all(a["state"] == State.FAILED for a in attempts[:-1])
            and not (last["state"] == State.FAILED and len(numbers) < max_attempts)
        )
        if not chain_ok:
            broken += 1
            examples["broken_chains"] += [describe(a) for a in attempts]
        if last["state"] not in (State.SUCCEEDED, State.FAILED):
            not_terminal += 1
            continue
        seed, kind, _s, fail_rate = last["args"]
        rid = str(last["result_id"])
        could_succeed = any(
            planned(seed, kind, rid, n, fail_rate) == OK for n in range(1, max_attempts + 1)
        )
        if last["state"] == State.SUCCEEDED or not could_succeed:
            planned_failures += last["state"] == State.FAILED
            continue
        verdicts = [outcome_ok[a["id"]] for a in attempts]
        if chain_ok and "contrary" not in verdicts:
            through_faults["once" if max_attempts == 1 else "retried"] += 1
            faulted = [a for a, v in zip(attempts, verdicts, strict=True) if v == "fault"]
            if all(NEIGHBOUR_TIMEOUT in a["error_message"] for a in faulted):
                through_faults["neighbour"] += 1
        else:
            should_have += 1
            examples["should_have_succeeded"] += [describe(a) for a in attempts]

    # Kills and pauses: who rescued what, how fast.
    killed_workers: set[str] = set()
    killed_prefixes: list[str] = []
    rescue = {"worker": [], "supervisor": []}
    not_lost = 0
    for kill in faults.kills:
        if kill.kind == "worker":
            killed_workers.add(kill.target)
        else:
            killed_prefixes.append(kill.target)
        for pk in kill.victims:
            job = by_pk.get(pk)
            rescued = (FailureReason.LOST, FailureReason.INTERRUPTED)
            if job is None or job["state"] != State.FAILED or job["failure_reason"] not in rescued:
                not_lost += 1
                examples["killed_not_lost"].append(describe(job) if job else f"job {pk} gone")
                continue
            rescue[kill.kind].append((job["finished_at"] - kill.at).total_seconds())
    paused_long = {p.worker_id for p in faults.pauses if p.long}
    pause_rescue = []
    for pause in faults.pauses:
        for pk in pause.victims:
            job = by_pk.get(pk)
            if pause.long and job is not None and job["failure_reason"] == FailureReason.LOST:
                pause_rescue.append((job["finished_at"] - pause.stopped).total_seconds())
    # Attempts failed as lost, by why their worker was lost (the message says who failed it).
    lost_neighbour, lost_crash, taken_for_lost = 0, 0, 0
    for j in jobs:
        if j["failure_reason"] != FailureReason.LOST:
            continue
        wid, message = j["worker_id"] or "", j["error_message"]
        silenced = (
            wid in killed_workers
            or wid in paused_long
            or any(wid.startswith(prefix) for prefix in killed_prefixes)
        )
        if NEIGHBOUR_TIMEOUT in message:
            lost_neighbour += 1
        elif "exited" in message:
            lost_crash += 1
            examples["lost_crash"].append(describe(j))
        elif "no heartbeat" in message and not silenced:
            taken_for_lost += 1
            examples["taken_for_lost"].append(describe(j))
    slow_bound = lost_after + 3.0
    slow = sum(1 for s in rescue["supervisor"] + pause_rescue if s > slow_bound)

    multi_live_end = (
        Job.objects.live().order_by().values("result_id").annotate(n=Count("id")).filter(n__gt=1)
    ).count()
    outage_errors = sum(n for cls, n in unplanned_errors.items() if _is_outage(cls))
    other_errors = {cls: n for cls, n in unplanned_errors.items() if not _is_outage(cls)}

    figures = {
        "jobs_enqueued": Figure("jobs enqueued", enqueued),
        "attempts_created": Figure("attempts created", len(jobs)),
        "executions": Figure("executions recorded", len(executions)),
        "tasks_missing": Figure(
            "logical tasks missing from the table", enqueued - len(chains), True
        ),
        "late_executions": Figure(
            "executions of an attempt after it was already failed", late, True
        ),
        "late_executions_excused": Figure(
            "  ... by a body its paused process started after SIGCONT (not counted)", excused
        ),
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
            "attempt chains broken (gap, past max_attempts, attempt after success, missing retry)",
            broken,
            True,
        ),
        "contrary": Figure("attempts whose outcome contradicts their plan", contrary, True),
        "frozen_overruns": Figure(
            "  overruns recorded as succeeded, their worker paused past the deadline (not counted)",
            frozen_overruns,
            note="a known bug: the body's success wins over the late watchdog",
        ),
        "should_have_succeeded": Figure(
            "tasks that should have succeeded and did not", should_have, True
        ),
        "failed_as_planned": Figure(
            "tasks failed as planned (every attempt planned to fail)", planned_failures
        ),
        "failed_through_faults_once": Figure(
            "tasks failed only through faults: single-attempt tasks", through_faults["once"]
        ),
        "failed_through_faults_retried": Figure(
            "tasks failed only through faults: retried tasks", through_faults["retried"]
        ),
        "failed_through_neighbour": Figure(
            "  ... of which only through another attempt's timeout (no fault touched them)",
            through_faults["neighbour"],
        ),
        "killed_not_lost": Figure("attempts of killed workers not failed as lost", not_lost, True),
        "other_errors": Figure(
            "attempts failed by an unplanned error other than a database outage",
            sum(other_errors.values()),
            True,
            ", ".join(f"{cls} x{n}" for cls, n in other_errors.items()),
        ),
        "supervisors_died": Figure(
            "supervisors that died on their own", faults.supervisors_died, True
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
        "restarts": Figure(
            "PostgreSQL restarts",
            len(faults.restarts),
            note=", ".join(f"{s:.1f} s" for s in faults.restarts),
        ),
        "rescue_worker_kill": Figure(
            "kill -> rescue, worker SIGKILL (its supervisor fails it)", _seconds(rescue["worker"])
        ),
        "rescue_supervisor_kill": Figure(
            "kill -> rescue, supervisor SIGKILL (lost-after window)", _seconds(rescue["supervisor"])
        ),
        "rescue_pause": Figure(
            "SIGSTOP -> rescue, long pause (lost-after window)", _seconds(pause_rescue)
        ),
        "slow_rescues": Figure(f"rescues slower than lost-after + 3 s ({slow_bound:g} s)", slow),
        "failures": Figure(
            "failed attempts by reason",
            ", ".join(f"{reason} {n}" for reason, n in sorted(failures.items())) or "-",
        ),
        "outage_errors": Figure("attempts failed by a database outage (error)", outage_errors),
        "unexpected_timeouts": Figure(
            "timeouts of attempts not planned to overrun", unexpected_timeouts
        ),
        "lost_neighbour": Figure(
            "attempts failed as lost because their worker ended for another attempt's timeout",
            lost_neighbour,
        ),
        "taken_for_lost": Figure(
            "attempts of live workers taken for lost (neither killed nor paused past lost-after)",
            taken_for_lost,
        ),
        "lost_crash": Figure(
            "attempts failed as lost because their worker process crashed", lost_crash
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
    for key, lines in examples.items():
        figures[key].examples = lines[:5]
    return figures


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

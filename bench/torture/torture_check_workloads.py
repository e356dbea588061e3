"""The torture run's verdict on its workloads (bench/torture/torture_workloads.py).

Why each check is sound:
- Cancels. The attempt a cancel acted on is the task's first with cancel_requested_at
  (set by the cancel's own conditional write, in the same transaction as a queued
  attempt's move to failed). A cancelled task is never retried, so no attempt may follow
  it, and no body may start for an attempt cancelled while queued. A cancel ends the
  attempt it acted on failed as cancelled, or succeeded when a running task returned
  first; a cancel that found nothing live needs the task (or, given one attempt, that
  attempt) finished by the time it returned. A held attempt its worker starts after the
  request is counted apart (the worker learns of it from the supervisor).
- Ticks. The schedule ticks every second with catch_up "all": between the first tick and
  the drain, every second has exactly one first attempt (scheduled_for), whatever the
  faults (an outage delays ticks, it never drops them).
- Unique tasks. Every task of a key runs its bodies between its first body's start and
  its last attempt's finish; a later task of the key is inserted only once that finish
  is committed, so its first body starts after it: two such spans that overlap mean two
  live tasks of one key (also sampled from the rows five times a second). Every
  enqueue returns a task of its own key that was live while it ran: new, or the holder
  (HOLDER_SLACK below). A duplicate enqueue writes nothing: on PostgreSQL, while the
  caller's transaction stays open, another connection must be able to lock the holder's
  row (FOR NO KEY UPDATE NOWAIT, probed at its start and its end).
- Mixed batches. The fast jobs stamp when their body returned (returned_at). Their
  success must be written within FLUSH_AFTER of work (0.05 s; checked at LATE_WRITE), and
  a body that returned is never failed as lost and run again, unless its worker was
  killed within FLUSH_BOUND of the return; either is excused only by a fault that stopped
  the worker from writing meanwhile (an outage, a table lock, a cut, a SIGSTOP, an
  interpreter held beside it).
- Locked rows. A row locked FOR UPDATE is never claimed while the lock is held (SKIP
  LOCKED), and runs once it is released (the drain: every task terminal).
- Concurrency limits: torture_check_limits.py; workflows: torture_check_workflows.py.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.torture.torture_check import (
    CLOCK_SLACK,
    STOPPED_AT,
    Faults,
    Figure,
    Outage,
    _is_outage,
    _overlaps,
    _seconds,
    _within,
    describe,
    frozen_writers,
    held,
)
from bench.torture.torture_workloads import TICK_SCHEDULE, Workload
from django_jobstate.states import FailureReason, State

# A holder's finished_at is the start of its outcome's transaction (PostgreSQL's now(); on
# SQLite the writer's clock before its write): a duplicate enqueue may meet it live until
# that commits, which a writer paused mid-way may delay until
# idle_in_transaction_session_timeout (half of LOST_AFTER) ends it, and an outage or a
# table lock until it is over (excused apart).
HOLDER_SLACK = timedelta(seconds=3)
# Seconds from a body's return to its success written, at most. The test suite's short run
# (tests/test_torture.py) allows more: beside CI's other passes, at a load of 12 on two
# cores, SQLite's writers queued for its one write lock up to 5 s.
LATE_WRITE = float(os.environ.get("JOBSTATE_TORTURE_LATE_WRITE", "2.0"))
# A kill this soon after a body returned may lose its success: as long as its write may
# take. (A shorter bound counted as lost a success killed before a write still on time.)
FLUSH_BOUND = LATE_WRITE
Row = dict[str, Any]


def workload_figures(
    jobs: list[Row], executions: list[Row], faults: Faults, examples: dict[str, list[str]]
) -> dict[str, Figure]:
    chains: dict[str, list[Row]] = defaultdict(list)
    for j in jobs:
        chains[str(j["result_id"])].append(j)
    ran = {(str(e["result_id"]), e["attempt"]): e for e in executions}
    work = faults.workload
    figures = _cancels(work, chains, ran, examples)
    figures |= _ticks(work, jobs)
    figures |= _uniques(work, chains, executions, faults, examples)
    figures |= _batches(work, chains, ran, jobs, faults, examples)
    figures |= _locks(work, faults, jobs, chains, examples)
    from bench.torture.torture_check_limits import limit_figures  # it imports torture_check

    figures |= limit_figures(jobs, executions, faults, examples)
    from bench.torture.torture_check_workflows import workflow_figures  # likewise

    figures |= workflow_figures(jobs, executions, faults, examples)
    in_flight = Counter(
        "async" if j["task_path"].endswith("_async") else "sync"
        for j in jobs
        if (str(j["result_id"]), j["attempt"]) in ran
        and (j["worker_id"] or "").rsplit("/", 1)[0] in faults.in_flight
    )
    figures["in_flight_runs"] = Figure(
        "attempts run by --in-flight workers: sync / async",
        f"{in_flight['sync']} / {in_flight['async']}",
    )
    return figures


def _cancels(
    work: Workload, chains: dict[str, list[Row]], ran: dict[tuple[str, int], Row], examples: Any
) -> dict[str, Figure]:
    after, ran_cancelled, not_ended, late_start = 0, 0, 0, 0
    outcomes: Counter[str] = Counter()
    for c in work.cancels:
        attempts = chains.get(c.result_id, [])
        target = next((a for a in attempts if a["cancel_requested_at"] is not None), None)
        if target is None:  # it found nothing live (or failed on an outage)
            outcomes["error" if c.error else "finished"] += 1
            done = c.done + CLOCK_SLACK if c.done else None
            given = [a for a in attempts if a["id"] == c.pk] if c.pk else attempts[-1:]
            if not c.error and (
                done is None
                or any(a["finished_at"] is None or a["finished_at"] > done for a in given)
            ):
                not_ended += 1
                examples["cancel_not_ended"] += [f"{c}: " + describe(a) for a in given]
            continue
        queued = target["started_at"] is None
        outcomes["queued" if queued else "running"] += 1
        later = [a for a in attempts if a["attempt"] > target["attempt"]]
        after += len(later)
        examples["cancel_retried"] += [describe(a) for a in later]
        body = ran.get((c.result_id, target["attempt"]))
        ran_cancelled += sum((c.result_id, a["attempt"]) in ran for a in later)
        if queued and body is not None:
            ran_cancelled += 1
            examples["cancel_ran"].append(f"{describe(target)}; executed {body['recorded_at']}")
        cancelled = target["failure_reason"] == FailureReason.CANCELLED
        if not (cancelled or (not queued and target["state"] == State.SUCCEEDED)):
            not_ended += 1
            examples["cancel_not_ended"].append(describe(target))
        if (
            not queued
            and body is not None
            and body["recorded_at"] > target["cancel_requested_at"] + CLOCK_SLACK
        ):
            late_start += 1
    return {
        "cancels": Figure(
            "cancels (of a queued attempt / a running one / of a finished task / failed)",
            f"{outcomes['queued']} / {outcomes['running']} / {outcomes['finished']} / "
            f"{outcomes['error']}",
        ),
        "cancel_retried": Figure("attempts created after a cancelled attempt", after, True),
        "cancel_ran": Figure(
            "bodies run of an attempt cancelled while queued, or after a cancelled one",
            ran_cancelled,
            True,
        ),
        "cancel_not_ended": Figure(
            "cancels whose attempt did not end failed as cancelled (nor had finished, nor "
            "returned first)",
            not_ended,
            True,
        ),
        "cancel_late_start": Figure(
            "  held attempts whose body began after the cancel request (not counted)", late_start
        ),
    }


def _ticks(work: Workload, jobs: list[Row]) -> dict[str, Figure]:
    if not work.ticks or work.ticks_until is None:
        return {"ticks": Figure("schedule ticks enqueued (every second)", "-")}
    firsts = [j for j in jobs if j["schedule_name"] == TICK_SCHEDULE and j["attempt"] == 1]
    per_tick = Counter(j["scheduled_for"] for j in firsts)
    twice = sum(n - 1 for n in per_tick.values() if n > 1)
    missing: list[datetime] = []
    if per_tick:
        tick, end = min(per_tick), work.ticks_until - timedelta(seconds=2)
        while tick <= end:
            if tick not in per_tick:
                missing.append(tick)
            tick += timedelta(seconds=1)
    late = [(j["enqueued_at"] - j["scheduled_for"]).total_seconds() for j in firsts]
    return {
        "ticks": Figure("schedule ticks enqueued (every second)", len(per_tick)),
        "ticks_twice": Figure("schedule ticks enqueued more than once", twice, True),
        "ticks_missing": Figure(
            "schedule ticks never enqueued (catch_up all: none may be skipped)",
            len(missing) if per_tick else 1,
            True,
            examples=[str(t) for t in missing[:5]] or ([] if per_tick else ["no tick at all"]),
        ),
        "ticks_late": Figure("tick -> its job enqueued", _seconds(late)),
    }


def _uniques(
    work: Workload,
    chains: dict[str, list[Row]],
    executions: list[Row],
    faults: Faults,
    examples: Any,
) -> dict[str, Figure]:
    starts: dict[str, datetime] = {}
    for e in executions:
        rid = str(e["result_id"])
        starts[rid] = min(starts.get(rid, e["recorded_at"]), e["recorded_at"])
    spans: dict[str, list[tuple[datetime, datetime | None, str]]] = defaultdict(list)
    for rid, attempts in chains.items():
        key = (attempts[0]["kwargs"] or {}).get("key")
        if attempts[0]["task_path"].endswith(".unique_flaky") and rid in starts:
            spans[key].append((starts[rid], attempts[-1]["finished_at"], rid))
    overlaps = 0
    never = datetime.max.replace(tzinfo=UTC)
    for key_spans in spans.values():
        key_spans.sort(key=lambda s: s[0])
        last_end, last = None, ""  # the latest end of the key's tasks so far
        for start, end, rid in key_spans:
            if last_end is not None and start < last_end - CLOCK_SLACK:
                overlaps += 1
                examples["unique_overlap"].append(f"task {rid} began before {last} ended")
            if last_end is None or (end or never) > last_end:
                last_end, last = end or never, rid
    wrong = 0
    # A writer's finished_at is taken before a lock or an outage holds its write back.
    away = [*faults.outages, *faults.table_locks]
    for u in work.uniques:
        attempts = chains.get(u.result_id)
        holder_ok = (
            attempts is not None
            and (attempts[0]["kwargs"] or {}).get("key") == u.key
            and attempts[0]["enqueued_at"] <= u.done + CLOCK_SLACK
            and (
                (finished := attempts[-1]["finished_at"]) is None
                or finished >= u.at - HOLDER_SLACK
                or any(_overlaps(finished, u.at, o.at, o.ended) for o in away)
            )
        )
        if not holder_ok:
            wrong += 1
            examples["unique_wrong_holder"].append(f"{u}: {attempts and describe(attempts[-1])}")
    new = len({u.result_id for u in work.uniques})
    locked = 0
    for u in work.uniques:
        if u.locked_holder and not _holder_held_by_a_fault(u, chains, faults, work):
            locked += 1
            holder = [a for a in chains.get(u.result_id, []) if a["started_at"]]
            examples["unique_locked_holder"].append(
                f"{u}: {describe(holder[-1]) if holder else 'never started'}"
            )
    return {
        "uniques": Figure(
            "unique enqueues (new tasks / duplicates returning the holder / errors)",
            f"{new} / {len(work.uniques) - new} / {work.unique_errors.total()}",
            note=", ".join(f"{name} x{n}" for name, n in work.unique_errors.items()),
        ),
        "unique_multi": Figure(
            "unique keys with two live rows (sampled)", len(work.unique_multi), True
        ),
        "unique_overlap": Figure(
            "unique tasks whose first body began before the key's previous task ended",
            overlaps,
            True,
        ),
        "unique_locked_holder": Figure(
            "duplicate enqueues whose transaction held the holder's row (PostgreSQL, no fault)",
            locked,
            True,
        ),
        "unique_wrong_holder": Figure(
            "unique enqueues that returned a task of another key, or one not live then",
            wrong,
            True,
        ),
    }


def _batches(
    work: Workload,
    chains: dict[str, list[Row]],
    ran: dict[tuple[str, int], Row],
    jobs: list[Row],
    faults: Faults,
    examples: Any,
) -> dict[str, Figure]:
    kills: dict[str, list[datetime]] = defaultdict(list)
    for kill in faults.kills:
        kills[kill.target].append(kill.at)
    delays: list[float] = []
    late, lost, lost_in_bound, behind_slow = 0, 0, 0, 0
    for batch in work.batches:
        slow = chains.get(batch.slow, [])
        for rid in batch.fast:
            for a in chains.get(rid, []):
                e = ran.get((rid, a["attempt"]))
                if e is None or e["returned_at"] is None:
                    continue
                wid, returned = a["worker_id"] or "", e["returned_at"]
                behind_slow += any(s["worker_id"] == wid for s in slow)
                if a["state"] == State.SUCCEEDED:
                    delay = (a["finished_at"] - returned).total_seconds()
                    delays.append(delay)
                    if delay > LATE_WRITE and not _stalled(
                        faults, work, jobs, wid, returned, a["finished_at"]
                    ):
                        late += 1
                        examples["batch_late"].append(f"{describe(a)}; returned {returned}")
                    continue
                if a["failure_reason"] == FailureReason.ERROR and _is_outage(a["error_class"]):
                    # The body's own stamp of returned_at met a server restart: committed,
                    # but its reply lost, so the body raised (the task's own query's error,
                    # counted with the outage errors), nothing the worker failed as lost.
                    continue
                at = [t for target in (wid, f"{wid.rsplit('/', 1)[0]}/") for t in kills[target]]
                if STOPPED_AT.search(a["error_message"] or ""):
                    # Its process was stopped at an overrun's deadline beside it (an
                    # attempt that could not be cancelled): a kill too, when it was failed.
                    at.append(a["finished_at"])
                killed = min((t for t in at if t >= returned - CLOCK_SLACK), default=None)
                # A host cut off, or a supervisor SIGSTOPped whole, past the window between
                # the body's return and the rescue: silenced as by a kill (seen: a body
                # returned 30 ms before its supervisor was stopped whole for 5 s).
                span = sorted([returned, a["finished_at"]])
                silenced = any(
                    wid.startswith(c.prefix) and _overlaps(*span, c.at, c.ended)
                    for c in [*faults.cuts, *faults.freezes]
                )
                if silenced or (
                    killed is not None
                    and (
                        (killed - returned).total_seconds() <= FLUSH_BOUND
                        or _stalled(faults, work, jobs, wid, returned, killed)
                    )
                ):
                    lost_in_bound += 1
                else:
                    lost += 1
                    examples["batch_lost"].append(f"{describe(a)}; returned {returned}")
    return {
        "batches": Figure(
            "mixed batches (fast jobs due with a slow one) / fast bodies run beside their slow "
            "one's worker",
            f"{len(work.batches)} / {behind_slow}",
        ),
        "batch_late": Figure(
            f"finished successes written more than {LATE_WRITE:g} s after their body returned",
            late,
            True,
        ),
        "batch_lost": Figure(
            "finished successes failed as lost (to run again), not to a kill within "
            f"{FLUSH_BOUND:g} s",
            lost,
            True,
        ),
        "batch_lost_in_bound": Figure(
            "  lost to a kill, a cut or a supervisor stopped whole, within that bound (not "
            "counted)",
            lost_in_bound,
        ),
        "batch_write": Figure("body returned -> success written, mixed batches", _seconds(delays)),
    }


def _holder_held_by_a_fault(
    u: Any, chains: dict[str, list[Row]], faults: Faults, work: Workload
) -> bool:
    """Could the lock the probe met on a duplicate's holder be a fault's, not the caller's:
    the row locked by the row-lock workload, or its worker held inside its claim or its
    outcome's write (SIGSTOPped, its link cut, its interpreter held)?"""
    jobs = chains.get(u.result_id, [])
    every = [a for attempts in chains.values() for a in attempts]
    for lock in work.row_locks:
        if _overlaps(u.at, u.done, lock.at, lock.released) and any(
            a["id"] in lock.pks for a in jobs
        ):
            return True
    for a in jobs:
        wid = a["worker_id"] or ""
        if not (wid and a["started_at"]) or not _overlaps(
            u.at, u.done, a["started_at"], a["finished_at"]
        ):
            continue
        cut = any(
            wid.startswith(c.prefix) and _overlaps(u.at, u.done, c.at, c.ended)
            for c in [*faults.cuts, *faults.freezes]
        )
        if cut or held(every, faults, wid, u.at, u.done):
            return True
    return False


def _stalled(
    faults: Faults, work: Workload, jobs: list[Row], wid: str, start: datetime, end: datetime
) -> bool:
    """Could worker `wid` not write between `start` and `end`: the database away (or
    restarted, or connections killed: the write then retries after a back-off), its link
    cut, its process SIGSTOPped, or its interpreter held by an attempt beside it? On
    SQLite a "row lock" is a transaction that holds the one write lock (IMMEDIATE), and
    any worker frozen inside a write holds that lock from every other writer until it
    resumes (seen: a cancel that took 6.8 s, a success written 6.4 s late, in a 6 s stop;
    frozen_writers())."""
    away: list[Any] = [*faults.outages, *faults.table_locks]
    if not work.row_locks_exclusive:
        away += [Outage("row lock", lock.at, lock.released) for lock in work.row_locks]
    away += frozen_writers(faults, jobs)
    if any(_overlaps(start, end, o.at, o.ended) for o in away):
        return True
    breaks = [*faults.restarted_at, *(k.at for k in faults.connection_kills)]
    if any(start <= t <= end for t in breaks):
        return True
    cuts = [*faults.cuts, *faults.freezes]
    if any(wid.startswith(c.prefix) and _overlaps(start, end, c.at, c.ended) for c in cuts):
        return True
    return held(jobs, faults, wid, start, end)


def _locks(
    work: Workload, faults: Faults, jobs: list[Row], chains: dict[str, list[Row]], examples: Any
) -> dict[str, Figure]:
    by_pk = {j["id"]: j for j in jobs}
    while_locked, waits = 0, []
    # A restart or an outage ends a lock with its connection (found only at its COMMIT).
    breaks = [*faults.restarted_at, *(o.at for o in faults.outages)]
    for lock in work.row_locks:
        if not lock.held or lock.released is None:
            continue
        released = min([lock.released, *(t for t in breaks if lock.at < t < lock.released)])
        for pk in lock.pks:
            started = (by_pk.get(pk) or {}).get("started_at")
            if started is None:
                continue
            if lock.at + CLOCK_SLACK < started < released - CLOCK_SLACK:
                while_locked += 1
                examples["claimed_locked"].append(
                    f"{describe(by_pk[pk])}; locked {lock.at} to {released}"
                )
            else:
                waits.append((started - released).total_seconds())
    in_lock = sum(
        1
        for rid in work.deadlines
        for a in chains.get(rid, [])[:1]
        if a["started_at"] is not None
        and any(
            _within(a["started_at"] + timedelta(seconds=a["timeout"] or 0), t.at, t.ended, 0)
            for t in faults.table_locks
        )
    )
    return {
        "row_locks": Figure(
            "queued rows locked FOR UPDATE by another connection (locks; lost to an outage)",
            f"{sum(len(lock.pks) for lock in work.row_locks if lock.held)} "
            f"({len(work.row_locks)}; {sum(not lock.held for lock in work.row_locks)})",
        ),
        "claimed_locked": Figure(
            "locked rows claimed while locked",
            while_locked if work.row_locks_exclusive else 0,
            True,
            "" if work.row_locks_exclusive else "SQLite: a read transaction, no row lock",
        ),
        "locked_wait": Figure("lock released -> locked row started", _seconds(waits)),
        "table_locks": Figure(
            "job table locks (attempts whose 1 s deadline fell in one)",
            f"{len(faults.table_locks)} ({in_lock})",
            note=", ".join(
                f"{t.what} {(t.ended - t.at).total_seconds():.1f} s"
                for t in faults.table_locks
                if t.ended
            ),
        ),
    }

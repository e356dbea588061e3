"""The torture run's workflows, beside its other jobs and under the same faults.

Mixed into bench/torture/torture.py's Torture like torture_workloads.py (off with
--no-workflows; checked by torture_check_workflows.py):
- part of the --jobs are steps of workflows, enqueued through the public API
  (django_jobstate.workflows): chains of CHAIN_STEPS steps and chords of CHORD_GROUP
  steps and a callback, in turn, each due at a moment of its own over the first half of
  the run (its steps share that run_after: a step becomes runnable when released), with
  the plans of torture_tasks.py (some attempts fail, 10% of the steps sleep). One
  workflow in three has a doomed step (every attempt planned to fail): what comes after
  it must fail as upstream_failed. A chord's group is due at one moment, so its last
  two steps often finish together on two workers; its callback never plans to fail, so
  that a group that succeeded must see its callback succeed;
- a few cancels of a step that others wait for, queued (held or due) or running, made
  as the cancels workload makes them (JobStateBackend.cancel), and checked with them:
  what waits on a cancelled step must end cancelled, never run.
The kills, pauses, outages, restarts and the partition fall on the steps as on any job.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.torture.torture_check import Faults

CHAIN_STEPS = 3
CHORD_GROUP = 5
DOOMED_EVERY = 3  # one workflow in three has a step whose every attempt fails


@dataclass
class Workflows:
    """What was enqueued, for the report (the checks read the rows and the edges)."""

    chains: int = 0
    chords: int = 0
    doomed: int = 0
    steps: int = 0
    cancels: int = 0
    errors: list[str] = field(default_factory=list)  # enqueues refused (a fault's edge)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--no-workflows", action="store_true", help="no chains and chords among the jobs")
    add("--workflow-steps", type=int, help="of --jobs; default: jobs/6, at least 45")
    add("--workflow-cancels", type=int, help="cancels of steps; default: 2 (0 with --no-cancels)")


def resolve(options: argparse.Namespace) -> None:
    if options.no_workflows:
        options.workflow_steps = 0
    elif options.workflow_steps is None:
        options.workflow_steps = max(45, options.jobs // 6)
    # Part of --jobs, beside the limited ones: a run with workflows lasts as long.
    room = max(0, options.jobs - options.limited_jobs) // 3
    options.workflow_steps = min(options.workflow_steps, room)
    if options.workflow_cancels is None:
        options.workflow_cancels = 0 if options.no_cancels else 2
    if not options.workflow_steps:
        options.workflow_cancels = 0


class WorkflowLoad:
    """The workflows' part of Torture; it provides options, faults, clock(), db_now(),
    guarded() and enqueued_ids (torture_workloads.py)."""

    options: argparse.Namespace
    faults: Faults
    enqueued_ids: set[str]

    def workflow_events(self, duration: float) -> list[tuple[float, str]]:
        # A generator of their own: the other faults keep the schedule their seed gives.
        rng = random.Random(f"{self.options.seed}/workflow-events")
        count = self.options.workflow_cancels
        return [(rng.uniform(0.1, 0.7) * duration, "cancel_step") for _ in range(count)]

    def enqueue_workflows(self, now: datetime, spread: float) -> None:
        """Chains and chords, in turn, until --workflow-steps are enqueued."""
        from bench.torture import torture_tasks as tt
        from django_jobstate.workflows import chain, chord, group, step

        o = self.options
        rng = random.Random(f"{o.seed}/workflows")
        report = Workflows()
        self.faults.workload.workflows = report
        n = 0
        while report.steps + CHAIN_STEPS <= o.workflow_steps:
            due = now + timedelta(seconds=rng.uniform(0, 0.5 * spread))
            task = tt.workflow_step.using(run_after=due)
            doomed = n % DOOMED_EVERY == 1

            def plan(fail_rate: float) -> tuple[Any, ...]:
                if rng.random() < 0.1:
                    return (o.seed, tt.SLEEP, round(rng.uniform(0.2, 1.0), 2), fail_rate)
                return (o.seed, tt.PLAIN, 0, fail_rate)

            chord_fits = report.steps + CHORD_GROUP + 1 <= o.workflow_steps
            if n % 2 and chord_fits:
                members = [step(task, *plan(o.fail_rate)) for _ in range(CHORD_GROUP)]
                if doomed:
                    members[rng.randrange(CHORD_GROUP)] = step(task, *plan(1.0))
                callback = step(task, *plan(0.0)).receive("results")
                result = chord(group(members), callback).enqueue()
                report.chords += 1
            else:
                steps = [step(task, *plan(o.fail_rate)) for _ in range(CHAIN_STEPS)]
                if doomed:
                    steps[1] = step(task, *plan(1.0))
                result = chain(*steps).enqueue()
                report.chains += 1
            report.doomed += doomed
            report.steps += len(result.steps)
            self.enqueued_ids.update(str(r.id) for r in result.steps)
            n += 1
        print(
            f"  {self.clock()} {report.chains} chains and {report.chords} chords enqueued "
            f"({report.steps} steps, {report.doomed} with a doomed step)"
        )

    def cancel_step(self) -> bool:
        """Cancel a live step that another waits for (False: none yet, try again)."""
        from django.db import DatabaseError, connection

        from bench.torture.torture_tasks import workflow_step
        from bench.torture.torture_workloads import Cancel
        from django_jobstate.models import Job
        from django_jobstate.states import State
        from django_jobstate.tasksapi import task_backends

        now = self.db_now()
        locked = [
            pk for lock in self.faults.workload.row_locks if not lock.released for pk in lock.pks
        ]

        def candidates() -> list[tuple[Any, ...]]:
            steps = Job.objects.live().filter(
                task_path=workflow_step.module_path, has_dependents=True
            )
            fields = ("result_id", "state", "run_after", "hold")
            return list(steps.exclude(pk__in=locked).order_by("pk").values_list(*fields)[:50])

        found = self.guarded(candidates, [])
        if not found:
            return False
        rng = random.Random(f"{self.options.seed}/cancel/{self.faults.workload.workflows.cancels}")
        result_id, state, run_after, hold = rng.choice(found)
        picked = "running" if state == State.RUNNING else "due"
        if state == State.QUEUED and (hold is not None or run_after > now):
            picked = "later"
        record = Cancel(str(result_id), "backend", picked, self.db_now())
        try:
            task_backends["default"].cancel(str(result_id))
        except DatabaseError as exc:  # an outage's edge: said, and checked as it ended
            connection.close()
            record.error = f"{type(exc).__name__}: {exc}"
        record.done = self.db_now()
        self.faults.workload.cancels.append(record)
        self.faults.workload.workflows.cancels += 1
        print(f"  {self.clock()} cancel of a {picked} step that others wait for")
        return True

"""The torture run's verdict on its workflows (bench/torture/torture_workflows.py).

Why each check is sound:
- Steps run before their dependencies succeeded. A step's first start is the earliest of
  its attempts' started_at (the claim, by the database clock) and its bodies' Execution
  rows (recorded_at, the same clock). An upstream's success writes its finished_at and
  releases its dependents in one transaction: a dependent can be claimed only after that
  commits, so its first start comes after the success's finished_at, exactly (no slack:
  both are the database's clock, the one before a commit the other waits for). Each
  upstream without a success, or whose success came later, counts the step once.
- Callbacks run twice or never. A chord's callback waits for its whole group (its
  upstreams, in the order of the edges' positions). Group all succeeded: the callback's
  task has exactly one succeeded attempt (a callback never plans to fail; one that
  failed although it ran, by a kill or an outage that consumed its attempts, is shown
  apart), and it was given the group's return values in the group's order. A group step
  failed for good: the callback ended failed without ever starting (no started_at, no
  body), in one attempt, as upstream_failed, or as cancelled when the step was. A
  callback (or step) whose upstreams all succeeded, still waiting when the drain gave
  up, is left to the run's own not_terminal figure; one still waiting after an upstream
  failed for good counts (its failure is written in that upstream's transaction).
- Steps released wrongly (chains). The same rules for a step after one other: its
  upstream succeeded, so it started (unless a cancel of the run picked the step itself);
  its upstream failed for good, so it never started and ended upstream_failed (or
  cancelled after a cancelled upstream).
- Every step ran once per attempt, none lost, none left, none early by its run_after:
  the run's own figures (run_twice, tasks_missing, not_terminal, early, broken_chains,
  where a step failed upstream is one never retried).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from bench.torture.torture_check import Faults, Figure, describe
from bench.torture.torture_workflows import Workflows
from django_jobstate.states import FailureReason, State

Row = dict[str, Any]
GAVE_UP = (FailureReason.UPSTREAM_FAILED, FailureReason.CANCELLED)
LIVE = (State.QUEUED, State.RUNNING)


def workflow_figures(
    jobs: list[Row], executions: list[Row], faults: Faults, examples: dict[str, list[str]]
) -> dict[str, Figure]:
    from django_jobstate.models import JobDependency

    report = faults.workload.workflows
    steps: dict[str, list[Row]] = defaultdict(list)
    for j in jobs:
        if j["workflow_id"] is not None:
            steps[str(j["result_id"])].append(j)  # in attempt order: jobs are sorted so
    if report is None and not steps:
        return {"workflows": Figure("workflows: chains / chords (steps)", "-")}
    ups: dict[str, list[str]] = defaultdict(list)
    edges = JobDependency.objects.order_by("downstream", "position")
    for up, down in edges.values_list("upstream", "downstream"):
        if str(down) in steps:
            ups[str(down)].append(str(up))
    ran: dict[str, list[datetime]] = defaultdict(list)
    for e in executions:
        ran[str(e["result_id"])].append(e["recorded_at"])
    for rid, attempts in steps.items():
        ran[rid] += [a["started_at"] for a in attempts if a["started_at"] is not None]
    cancelled = {c.result_id for c in faults.workload.cancels}

    def success(rid: str) -> Row | None:
        return next((a for a in steps.get(rid, []) if a["state"] == State.SUCCEEDED), None)

    def last(rid: str) -> Row | None:
        return steps[rid][-1] if steps.get(rid) else None

    def gave_up(rid: str, failed: list[Row]) -> bool:
        """Ended failed without starting, in one attempt, for the reason its failed
        upstreams call for."""
        attempts, reasons = steps[rid], {f["failure_reason"] for f in failed}
        wanted = GAVE_UP if FailureReason.CANCELLED in reasons else GAVE_UP[:1]
        return (
            not ran[rid]
            and len(attempts) == 1
            and attempts[0]["state"] == State.FAILED
            and attempts[0]["failure_reason"] in wanted
        )

    early = 0
    for rid, before in ups.items():
        if not ran[rid]:
            continue
        start = min(ran[rid])
        for up in before:
            done = success(up)
            if done is None or done["finished_at"] > start:
                early += 1
                examples["workflow_early"].append(
                    f"{describe(steps[rid][0])} started {start}, its upstream {up} "
                    + ("never succeeded" if done is None else f"succeeded {done['finished_at']}")
                )

    chords = {rid: before for rid, before in ups.items() if len(before) > 1}
    twice = never = wrong_end = wrong_results = excused = 0
    outcomes = {"succeeded": 0, "upstream_failed": 0}
    for rid, group in chords.items():
        finals = [last(up) for up in group]
        failed = [f for f in finals if f is not None and f["state"] == State.FAILED]
        wins = [a for a in steps[rid] if a["state"] == State.SUCCEEDED]
        what = describe(steps[rid][-1])
        live = [f for f in [*finals, steps[rid][-1]] if f is None or f["state"] in LIVE]
        if live and not wins and not failed:
            continue  # not terminal at the end (a slow drain): the run's own figure
        if failed:
            if gave_up(rid, failed):
                outcomes["upstream_failed"] += 1
            else:
                wrong_end += 1
                examples["workflow_callbacks"].append(
                    f"{what}: ran or ended so after its group failed"
                )
        elif len(wins) > 1:
            twice += 1
            examples["workflow_callbacks"].append(f"{what}: {len(wins)} successes")
        elif wins:
            outcomes["succeeded"] += 1
            given = (wins[0]["kwargs"] or {}).get("results")
            wanted = [success(up)["return_value"] for up in group]  # type: ignore[index]
            if given != wanted:
                wrong_results += 1
                examples["workflow_results"].append(f"{what}: given {given}, group {wanted}")
        elif ran[rid] and all(f is not None and f["state"] == State.SUCCEEDED for f in finals):
            excused += 1  # it ran; a fault consumed its attempts (the run's own figures)
            examples["workflow_callbacks_faults"].append(what)
        else:
            never += 1
            examples["workflow_callbacks"].append(f"{what}: its group succeeded, it never ran")

    released_wrongly = 0
    for rid, before in ups.items():
        if rid in chords or rid in cancelled:
            continue
        up = last(before[0])
        if up is None or up["state"] in LIVE:
            continue  # not terminal at the end: the run's own figure
        if up["state"] == State.SUCCEEDED and steps[rid][-1]["state"] in LIVE and not ran[rid]:
            continue  # released, not run yet when the drain gave up: likewise
        ok = bool(ran[rid]) if up["state"] == State.SUCCEEDED else gave_up(rid, [up])
        if not ok:
            released_wrongly += 1
            examples["workflow_released"].append(
                f"{describe(steps[rid][-1])}; its upstream {describe(up)}"
            )

    made = report or Workflows()
    return {
        "workflows": Figure(
            "workflows: chains / chords (steps; with a doomed step; steps cancelled)",
            f"{made.chains} / {made.chords} ({len(steps)}; {made.doomed}; {made.cancels})",
        ),
        "workflow_chords": Figure(
            "  chords: callback succeeded / failed upstream, never run (group failed)",
            f"{outcomes['succeeded']} / {outcomes['upstream_failed']}",
        ),
        "workflow_early": Figure(
            "steps started before every step they depend on succeeded", early, True
        ),
        "workflow_callbacks": Figure(
            "chord callbacks run twice or never (or run, or ended otherwise, after their "
            "group failed)",
            twice + never + wrong_end,
            True,
            note=f"twice {twice}, never {never}, after a failure {wrong_end}",
        ),
        "workflow_results": Figure(
            "chord callbacks given other results than their group's, in its order",
            wrong_results,
            True,
        ),
        "workflow_released": Figure(
            "chain steps not run after their upstream succeeded, or run after it failed",
            released_wrongly,
            True,
        ),
        "workflow_callbacks_faults": Figure(
            "  callbacks that ran but failed through faults (their own attempts)", excused
        ),
    }

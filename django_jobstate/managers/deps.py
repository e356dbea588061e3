"""Dependencies (depends_on, workflows): a held job released, or failed, in the
transaction of the final outcome of each task it depends on (workflows/fields.py).

A dependent enters held (`hold = "deps"`) with `pending_deps`, the count of its
upstream tasks that have not succeeded. An upstream's success, written once per logical
task, decrements its dependents in the same transaction, locking them in id order (so two
upstreams finishing at the same instant queue for the row, and the second sees the
first's count); the one that brings a count to 0 releases the row, exactly once. An
upstream that fails for good fails its waiting dependents, transitively, in the
transaction of that failure; an operator's retry of it brings them back, held again.

An upstream is marked `has_dependents` under its row lock, so its outcome's write either
comes before (and the dependent counts it as done, or failed) or sees the mark.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.models import F

from ..db import notify
from ..db.clock import Now
from ..exceptions import UnknownDependency, UpstreamCancelled, UpstreamFailed, describe_error
from ..limits.concurrency import Hold
from ..states import FailureReason, State, check_transition
from .base import Writes

if TYPE_CHECKING:
    from ..models import Job

# Rounds of _lock_upstreams(): each lost one means a retry committed between two reads.
LOCK_ROUNDS = 10


def as_result_ids(values: Iterable[Any]) -> list[uuid.UUID]:
    """`depends_on`'s values (result ids, as text or UUID, or TaskResults) as UUIDs."""
    ids = []
    for value in values:
        value = getattr(value, "id", value)
        try:
            ids.append(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))
        except ValueError:
            raise UnknownDependency(
                f"depends_on takes result ids (TaskResult.id) or TaskResults; {value!r} is neither."
            ) from None
    return list(dict.fromkeys(ids))


def _edges() -> Any:
    from ..models import JobDependency

    return JobDependency.objects


@dataclass(frozen=True)
class Links:
    """What an enqueue_many() writes beside the rows: the tasks they depend on (all must
    succeed first), of which `fresh` were written by the same enqueue (queued, marked,
    nothing to lock), and the workflow's columns (workflows/fields.py)."""

    depends_on: Sequence[uuid.UUID] = ()
    fresh: frozenset[uuid.UUID] = frozenset()
    workflow_id: uuid.UUID | None = None
    has_dependents: bool = False
    receives: str | None = None


class Dependencies(Writes):
    def _enqueue_linked(
        self, db: str, template: Job, links: Links, write: Callable[[], list[Job]]
    ) -> list[Job]:
        """Write the rows of `template` (`write()`) held until `links.depends_on` succeed,
        their edges and marks, in one transaction: all or nothing. An upstream that has
        failed for good fails them at once, as it would have if they had waited for it."""
        with transaction.atomic(using=db):
            known = [up for up in links.depends_on if up not in links.fresh]
            newest = self._lock_upstreams(db, known) if known else {}
            pending = len(links.depends_on) - sum(
                job.state == State.SUCCEEDED for job in newest.values()
            )
            template.workflow_id, template.receives = links.workflow_id, links.receives
            template.has_dependents = links.has_dependents
            if links.depends_on:
                template.pending_deps = pending
                template.hold = Hold.DEPS if pending else template.hold  # its rate's
            jobs = write()
            new = [job.result_id for job in jobs if not job.deduplicated]
            if links.depends_on and new:
                self._write_edges(db, links.depends_on, new)
                failed = [job for job in newest.values() if job.state == State.FAILED]
                if failed:
                    self._after_failure(db, failed[0])
                    for job in self.using(db).filter(result_id__in=new, state=State.FAILED):
                        for written in jobs:
                            if written.result_id == job.result_id:
                                written.__dict__.update(job.__dict__)
            return jobs

    def _lock_upstreams(
        self, db: str, result_ids: Sequence[uuid.UUID], *, missing_ok: bool = False
    ) -> dict[uuid.UUID, Job]:
        """The newest attempt of each task of `result_ids`, locked until the transaction
        ends and marked has_dependents. UnknownDependency names ids no job has (left out
        with `missing_ok`: pruned)."""
        newest: dict[uuid.UUID, Job] = {}
        for _ in range(LOCK_ROUNDS):
            rows = self.using(db).filter(result_id__in=result_ids)
            locked = list(rows.order_by("pk").select_for_update())
            newest = {}
            for job in locked:
                if job.result_id not in newest or newest[job.result_id].attempt < job.attempt:
                    newest[job.result_id] = job
            # A retry committed while this waited for its failed attempt's lock was not in
            # that read: read again until the newest are the ones locked.
            if rows.count() == len(locked):
                break
        if not missing_ok and len(newest) < len(result_ids):
            unknown = ", ".join(str(r) for r in result_ids if r not in newest)
            raise UnknownDependency(
                f"depends_on names result ids that no job has: {unknown}. Give the id of an "
                f"enqueued task (TaskResult.id), or its TaskResult; nothing was enqueued."
            )
        unmarked = [job.pk for job in newest.values() if not job.has_dependents]
        if unmarked:
            self.using(db).filter(pk__in=unmarked).update(has_dependents=True)
        return newest

    def _write_edges(
        self, db: str, upstreams: Sequence[uuid.UUID], downstreams: Iterable[uuid.UUID]
    ) -> None:
        """Record that each of `downstreams` depends on `upstreams`, in their order."""
        model = _edges().model
        rows = [
            model(upstream=up, downstream=down, position=i)
            for down in downstreams
            for i, up in enumerate(upstreams)
        ]
        _edges().using(db).bulk_create(rows)

    def _pending_for(self, db: str, result_id: uuid.UUID) -> tuple[int, list[Job]]:
        """How many of the tasks `result_id` depends on have not succeeded, and those that
        failed for good (their newest attempt failed), locked (_lock_upstreams)."""
        ups = list(
            _edges().using(db).filter(downstream=result_id).values_list("upstream", flat=True)
        )
        newest = self._lock_upstreams(db, ups, missing_ok=True)
        failed = [job for job in newest.values() if job.state == State.FAILED]
        done = sum(job.state == State.SUCCEEDED for job in newest.values())
        return len(ups) - done - (len(ups) - len(newest)), failed

    def _waiting(self, db: str, upstreams: Sequence[uuid.UUID]) -> tuple[list[Job], Counter]:
        """The held dependents of `upstreams`, locked in id order, and how many of
        `upstreams` each depends on."""
        edges = _edges().using(db).filter(upstream__in=upstreams)
        counts = Counter(edges.values_list("downstream", flat=True))
        if not counts:
            return [], counts
        held = self.using(db).filter(result_id__in=counts, state=State.QUEUED, hold=Hold.DEPS)
        return list(held.order_by("pk").select_for_update()), counts

    def _after_successes(self, db: str, upstreams: Sequence[uuid.UUID]) -> None:
        """The tasks `upstreams` succeeded: count them done for each of their dependents,
        and release those that wait for nothing more."""
        waiting, counts = self._waiting(db, upstreams)
        still: dict[int, list[int]] = {}
        ready = []
        for w in waiting:
            done = counts[w.result_id]
            if (w.pending_deps or 0) > done:
                still.setdefault(done, []).append(w.pk)
            else:
                ready.append(w)
        for done, pks in still.items():
            self.using(db).filter(pk__in=pks).update(pending_deps=F("pending_deps") - done)
        if ready:
            self._release(db, ready)

    def _release(self, db: str, ready: list[Job]) -> None:
        # Released through the gate of an enqueue: its slot first, then its rate (limits/).
        plain = [w.pk for w in ready if _next_hold(w) is None and w.receives is None]
        if plain:
            self.using(db).filter(pk__in=plain).update(hold=None, pending_deps=0)
        for w in ready:
            if w.receives is None and _next_hold(w) is None:
                continue
            values: dict[str, Any] = {"pending_deps": 0}
            values["hold"] = _next_hold(w)
            if w.receives is not None:
                values["args"], values["kwargs"] = self._given_results(db, w)
            self.using(db).filter(pk=w.pk).update(**values)
        keys = {w.concurrency_key for w in ready if w.concurrency_key is not None}
        if keys:
            self._release_slots(db, keys)  # limits.py: wakes whoever got a slot
        woken = [w for w in ready if _next_hold(w) != Hold.LIMIT]
        notify.send(connections[db], [(w.queue_name, w.priority, w.run_after) for w in woken])

    def _given_results(self, db: str, job: Job) -> tuple[list[Any], dict[str, Any]]:
        """`job`'s arguments with the results of the tasks it depends on, as it receives
        them ("one:NAME", "list:NAME", "list:"; workflows/fields.py)."""
        edges = _edges().using(db).filter(downstream=job.result_id).order_by("position")
        ups = list(edges.values_list("upstream", flat=True))
        done = self.using(db).filter(result_id__in=ups, state=State.SUCCEEDED)
        values = dict(done.values_list("result_id", "return_value"))
        results = [values.get(up) for up in ups]
        kind, _, name = (job.receives or "").partition(":")
        given: Any = results[0] if kind == "one" and results else results
        if not name:
            return [given, *job.args], dict(job.kwargs)
        return list(job.args), {**job.kwargs, name: given}

    def _after_failure(self, db: str, job: Job, root: Job | None = None) -> None:
        """`job`'s task failed for good (or was cancelled): its waiting dependents fail
        too, never started and never retried, and theirs after them."""
        waiting, _ = self._waiting(db, [job.result_id])
        if not waiting:
            return
        root = root or job
        cancelled = root.failure_reason == FailureReason.CANCELLED
        step = f"{root.task_name} (result id {root.result_id}, job {root.pk})"
        if cancelled:
            error: Exception = UpstreamCancelled(f"the task it depends on, {step}, was cancelled")
        else:
            cause = f"{root.error_class}: {root.error_message}".strip(": ").splitlines()
            error = UpstreamFailed(
                f"the task it depends on, {step}, failed for good"
                + (f" ({cause[0]})" if cause else "")
            )
        reason = FailureReason.CANCELLED if cancelled else FailureReason.UPSTREAM_FAILED
        check_transition(State.QUEUED, State.FAILED, reason)
        values: dict[str, Any] = {"cancel_requested_at": Now()} if cancelled else {}
        pks = [w.pk for w in waiting]
        self.using(db).filter(pk__in=pks, state=State.QUEUED, hold=Hold.DEPS).update(
            state=State.FAILED,
            failure_reason=reason,
            hold=None,
            finished_at=Now(),
            **describe_error(error),
            **values,
        )
        for w in waiting:
            if w.has_dependents:
                self._after_failure(db, w, root)

    def _revive(self, db: str, upstream: uuid.UUID) -> None:
        """An operator retried `upstream`, which had failed for good: its dependents that
        failed because of it come back as new attempts, held again, unless another task
        they depend on failed for good too (they come back when that one is retried)."""
        downs = list(
            _edges().using(db).filter(upstream=upstream).values_list("downstream", flat=True)
        )
        if not downs:
            return
        newest: dict[uuid.UUID, Job] = {}
        for job in self.using(db).filter(result_id__in=downs).order_by("attempt"):
            newest[job.result_id] = job
        for job in newest.values():
            by_upstream = job.failure_reason == FailureReason.UPSTREAM_FAILED or (
                job.failure_reason == FailureReason.CANCELLED
                and job.error_class.endswith(UpstreamCancelled.__name__)
            )
            if (
                job.state == State.FAILED
                and by_upstream
                and not self._pending_for(db, job.result_id)[1]
            ):
                # It never ran: its new attempt does not use up one of the task's.
                self.retry(job, max_attempts=job.max_attempts + 1)  # type: ignore[attr-defined]


def _next_hold(job: Job) -> Hold | None:
    """What holds a dependent once its dependencies succeeded: its concurrency slot, else
    its task's rate, else nothing (runnable)."""
    if job.concurrency_key is not None:
        return Hold.LIMIT
    return Hold.RATE if job.rate_limit else None

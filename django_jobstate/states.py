"""The four states of a job attempt and the only moves between them.

This module is the spec: every state write in the app checks its move here first.
"""

from django.db import models
from django.utils.translation import gettext_lazy as _


class State(models.TextChoices):
    # In: enqueue() and a retry create the row here. Out: a worker's claim (running), or
    # a cancel (failed as cancelled, never started: the one move out that is not a claim).
    QUEUED = "queued", _("Queued")
    # In: claim. Out: the worker that claimed it records the outcome; a timeout, an
    # interrupted worker or the reaper of a lost worker fails it.
    RUNNING = "running", _("Running")
    # In: the worker that owns the attempt, after the task returned. Out: never.
    SUCCEEDED = "succeeded", _("Succeeded")
    # In: the owning worker (the task raised or was interrupted), its supervisor (a timeout,
    # a dead worker process, an attempt handed back before it started, a cancel), the
    # rescuer of a lost worker, or a cancel of a queued attempt. Out: never; a retry is a
    # new attempt row.
    FAILED = "failed", _("Failed")


class FailureReason(models.TextChoices):
    ERROR = "error", _("The task raised an error")
    TIMEOUT = "timeout", _("The task ran past its timeout")
    LOST = "lost", _("Its worker stopped heartbeating")
    INTERRUPTED = "interrupted", _("Its worker was stopped mid-attempt")
    # Claimed but never started: its worker handed it back (it was held behind a slow
    # attempt, or its worker process ended first). The next attempt does not count it.
    RELEASED = "released", _("Never started; handed back to the queue")
    # Someone cancelled it: queued (it never started), or running (asked to stop, then
    # stopped). Whatever ends an attempt after a cancel request, it is this; never retried.
    CANCELLED = "cancelled", _("Cancelled")
    # The task raised Snooze: its next attempt runs after the delay it asked for and, as
    # after RELEASED, does not count this one. Not a failure of the task (get_result()).
    SNOOZED = "snoozed", _("Snoozed; runs again later")
    # A task it depends on (depends_on, a workflow's step) failed for good: it never
    # started, and is never retried (an operator's retry of that task brings it back).
    UPSTREAM_FAILED = "upstream_failed", _("A task it depends on failed")


TRANSITIONS: dict[State, frozenset[State]] = {
    State.QUEUED: frozenset({State.RUNNING, State.FAILED}),
    State.RUNNING: frozenset({State.SUCCEEDED, State.FAILED}),
    State.SUCCEEDED: frozenset(),
    State.FAILED: frozenset(),
}

# Moves allowed only with these failure reasons: a queued attempt fails only as cancelled,
# since it never started, or as failed upstream (the database's failed-fields constraint
# says the same).
ONLY_AS: dict[tuple[State, State], frozenset[FailureReason]] = {
    (State.QUEUED, State.FAILED): frozenset(
        {FailureReason.CANCELLED, FailureReason.UPSTREAM_FAILED}
    ),
}

TERMINAL_STATES = frozenset(state for state, nexts in TRANSITIONS.items() if not nexts)
LIVE_STATES = frozenset(State) - TERMINAL_STATES


class InvalidTransition(Exception):
    """A move that the state machine does not allow."""

    def __init__(self, current: str, new: str, reason: str | None = None) -> None:
        self.current, self.new = State(current), State(new)
        only = ONLY_AS.get((self.current, self.new))
        if only is not None and self.new in TRANSITIONS[self.current]:
            super().__init__(
                f"A job cannot move from {self.current.value!r} to {self.new.value!r} "
                f"with failure reason {str(reason or '')!r}; only as: {', '.join(sorted(only))}."
            )
            return
        allowed = ", ".join(sorted(TRANSITIONS[self.current])) or "none (it is terminal)"
        super().__init__(
            f"A job cannot move from {self.current.value!r} to {self.new.value!r}; "
            f"allowed next states: {allowed}."
        )


def check_transition(current: str, new: str, reason: str | None = None) -> None:
    """Raise InvalidTransition unless a job may move from `current` to `new` (failing,
    with failure reason `reason`)."""
    try:
        allowed = TRANSITIONS[State(current)]
        new = State(new)
    except ValueError as exc:
        raise ValueError(f"Unknown job state: {exc}. Valid states: {', '.join(State)}.") from None
    if new not in allowed:
        raise InvalidTransition(current, new)
    only = ONLY_AS.get((State(current), new))
    if only is not None and reason not in only:
        raise InvalidTransition(current, new, reason)

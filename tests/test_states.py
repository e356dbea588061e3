import itertools

import pytest

from django_jobstate.states import (
    LIVE_STATES,
    ONLY_AS,
    TERMINAL_STATES,
    TRANSITIONS,
    FailureReason,
    InvalidTransition,
    State,
    check_transition,
)

ALLOWED = {
    (State.QUEUED, State.RUNNING),
    (State.RUNNING, State.SUCCEEDED),
    (State.RUNNING, State.FAILED),
    (State.QUEUED, State.FAILED),  # only as cancelled
}
# The failure reasons each move allows (None: not a failure, or any reason).
REASONS = {(State.QUEUED, State.FAILED): {FailureReason.CANCELLED, FailureReason.UPSTREAM_FAILED}}
PAIRS = list(itertools.product(State, State))


def test_the_table_is_the_spec():
    assert {(a, b) for a, nexts in TRANSITIONS.items() for b in nexts} == ALLOWED
    assert set(TRANSITIONS) == set(State)
    assert {State.SUCCEEDED, State.FAILED} == TERMINAL_STATES
    assert {State.QUEUED, State.RUNNING} == LIVE_STATES


@pytest.mark.parametrize(("current", "new"), sorted(ALLOWED))
def test_allowed_moves_pass(current, new):
    for reason in REASONS.get((current, new), [None]):
        check_transition(current, new, reason)
        check_transition(current.value, new.value, reason and reason.value)  # raw values


def test_only_a_cancel_or_a_failed_upstream_fails_a_queued_attempt():
    assert {move: set(reasons) for move, reasons in ONLY_AS.items()} == REASONS
    for reason in [None, *FailureReason]:
        if reason in (FailureReason.CANCELLED, FailureReason.UPSTREAM_FAILED):
            check_transition(State.QUEUED, State.FAILED, reason)
            continue
        with pytest.raises(
            InvalidTransition, match="only as: cancelled, upstream_failed"
        ) as excinfo:
            check_transition(State.QUEUED, State.FAILED, reason)
        assert (excinfo.value.current, excinfo.value.new) == (State.QUEUED, State.FAILED)
    check_transition(State.RUNNING, State.FAILED, FailureReason.CANCELLED)  # both ways


@pytest.mark.parametrize(("current", "new"), [p for p in PAIRS if p not in ALLOWED])
def test_every_other_move_raises_naming_both_states(current, new):
    with pytest.raises(InvalidTransition) as excinfo:
        check_transition(current, new)
    assert f"'{current.value}'" in str(excinfo.value)
    assert f"'{new.value}'" in str(excinfo.value)
    assert (excinfo.value.current, excinfo.value.new) == (current, new)


@pytest.mark.parametrize(("current", "new"), [("queued", "paused"), ("done", "failed")])
def test_unknown_states_are_rejected_clearly(current, new):
    with pytest.raises(ValueError, match="Unknown job state"):
        check_transition(current, new)

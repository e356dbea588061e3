"""Build a Job directly in any state, with the fields that state implies."""

import uuid
from datetime import timedelta

import factory
from django.utils import timezone

from django_jobstate.models import Job
from django_jobstate.states import FailureReason, State


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    class Params:
        running = factory.Trait(
            state=State.RUNNING,
            worker_id="factory-worker",
            started_at=factory.LazyFunction(timezone.now),
        )
        succeeded = factory.Trait(
            state=State.SUCCEEDED,
            worker_id="factory-worker",
            started_at=factory.LazyFunction(lambda: timezone.now() - timedelta(seconds=1)),
            finished_at=factory.LazyFunction(timezone.now),
            return_value="done",
        )
        failed = factory.Trait(
            state=State.FAILED,
            worker_id="factory-worker",
            started_at=factory.LazyFunction(lambda: timezone.now() - timedelta(seconds=1)),
            finished_at=factory.LazyFunction(timezone.now),
            failure_reason=FailureReason.ERROR,
            error_class="builtins.ValueError",
            error_message="boom",
            traceback="Traceback (most recent call last):\nValueError: boom\n",
        )

    result_id = factory.LazyFunction(uuid.uuid4)
    task_path = "tests.tasks.record"
    args = factory.LazyFunction(lambda: ["factory"])
    kwargs = factory.LazyFunction(dict)
    enqueued_at = factory.LazyFunction(timezone.now)
    run_after = factory.LazyFunction(lambda: timezone.now() - timedelta(seconds=1))

    @classmethod
    def in_state(cls, state: str, **kwargs: object) -> Job:
        traits = {} if state == State.QUEUED else {str(state): True}
        return cls(**traits, **kwargs)

"""Which queue names a pause may name (check_known()): a queue that a TASKS alias of this
package's backends lists, one with queued jobs, or one with a row (paused, or paused
once). The last two keep a queue removed from the settings pausable while its jobs
drain, and a paused one resumable for good. Anything else is a typo that would pause
nothing, unless an alias lists no queues at all (QUEUES = []: it accepts any name).
"""

from __future__ import annotations

from .queues import validate_name


def configured_queues() -> tuple[set[str], bool]:
    """The queues the TASKS aliases of this package's backends list, and whether one of
    them lists none, so that it accepts any queue name."""
    from .backend import DummyBackend, ImmediateBackend, JobStateBackend
    from .tasksapi import task_backends

    names: set[str] = set()
    open_ended = False
    for backend in task_backends.all():
        if isinstance(backend, JobStateBackend | ImmediateBackend | DummyBackend):
            names |= set(backend.queues)
            open_ended = open_ended or not backend.queues
    return names, open_ended


def known_queues() -> set[str]:
    """The configured queues, those with queued jobs, and those with a JobQueue row."""
    from .models import Job, JobQueue

    names, _open_ended = configured_queues()
    names |= set(Job.objects.queue_names())
    return names | set(JobQueue.objects.values_list("name", flat=True))


def check_known(name: str) -> None:
    """Raise ValueError, naming the known queues, for a name that no queue has."""
    validate_name(name)
    configured, open_ended = configured_queues()
    if open_ended or name in configured or name in known_queues():
        return
    raise ValueError(
        f"No queue is named {name!r}: no TASKS alias lists it, no job is queued in it, and "
        f"it was never paused. Known queues: {', '.join(sorted(known_queues())) or 'none'}."
    )

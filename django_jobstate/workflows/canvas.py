"""Workflows built from steps: step(), chain(), group(), chord(), and their enqueue.

Each step is an ordinary job (attempts, retries, uniqueness, limits, cancel); a step that
comes after others is held until they succeed (managers/deps.py). `.enqueue()` writes
every step and every edge in one transaction: all or nothing, never half a workflow.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from django.db import router, transaction

from ..tasksapi import Task, send, task_enqueued

if TYPE_CHECKING:
    from ..models import Job
    from .results import WorkflowResult


@dataclass(frozen=True)
class Step:
    """One call of a task in a workflow: step(task, *args, **kwargs).

    `.receive("name")` passes it the result of what comes before it, as keyword argument
    `name`: one return value after a step, the list of them (in order) after a group.
    """

    task: Task
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    receives: str | None = None  # the keyword argument; "" for the first positional one

    def receive(self, name: str) -> Step:
        if not name.isidentifier():
            raise ValueError(f"receive() takes a parameter name of the task, not {name!r}.")
        return replace(self, receives=name)

    def enqueue(self) -> WorkflowResult:
        return _enqueue(self)


@dataclass(frozen=True)
class Chain:
    """Steps (or groups, chains) one after the other: each starts when the one before it
    succeeded."""

    items: tuple[Node, ...]

    def enqueue(self) -> WorkflowResult:
        return _enqueue(self)


@dataclass(frozen=True)
class Group:
    """Steps (or chains, groups) that run side by side."""

    items: tuple[Node, ...]

    def enqueue(self) -> WorkflowResult:
        return _enqueue(self)


@dataclass(frozen=True)
class Chord:
    """A group, then a callback step given the group's results in the group's order."""

    group: Group
    callback: Step

    def enqueue(self) -> WorkflowResult:
        return _enqueue(self)


Node = Step | Chain | Group | Chord


def step(task: Task, /, *args: Any, **kwargs: Any) -> Step:
    """One call of `task` as a step of a workflow."""
    if not isinstance(task, Task):
        raise TypeError(f"step() takes a task (a function decorated with @task), not {task!r}.")
    return Step(task, args, kwargs)


def _nodes(items: Iterable[Any], what: str) -> tuple[Node, ...]:
    nodes = tuple(items)
    for item in nodes:
        if not isinstance(item, Step | Chain | Group | Chord):
            raise TypeError(
                f"{what}() takes steps (step(task, ...)), chains, groups or chords, not {item!r}."
            )
    if not nodes:
        raise ValueError(f"{what}() needs at least one step.")
    return nodes


def chain(*items: Node) -> Chain:
    """Run `items` one after the other."""
    return Chain(_nodes(items, "chain"))


def group(*items: Node | Iterable[Node]) -> Group:
    """Run `items` side by side: group(a, b) or group(step(t, i) for i in range(10))."""
    if len(items) == 1 and not isinstance(items[0], Step | Chain | Group | Chord):
        return Group(_nodes(items[0], "group"))  # an iterable of steps
    return Group(_nodes(items, "group"))


def chord(header: Group | Iterable[Node], callback: Step) -> Chord:
    """Run the group `header`, then `callback` with its results, in order: as keyword
    argument NAME with callback.receive(NAME), else as the first positional argument."""
    if not isinstance(callback, Step):
        raise TypeError(f"chord()'s callback is one step (step(task, ...)), not {callback!r}.")
    header = header if isinstance(header, Group) else group(header)
    if callback.receives is None:
        callback = replace(callback, receives="")
    return Chord(header, callback)


@dataclass
class _Planned:
    """A step placed in the workflow: what it comes after (indexes of steps), in order."""

    step: Step
    after: list[int]
    receives: str | None
    result_id: uuid.UUID | None = None
    has_dependents: bool = False


def _plan(
    node: Node, after: list[int], after_group: bool, steps: list[_Planned]
) -> tuple[list[int], bool]:
    """Place `node`'s steps after `after` (a group's steps if `after_group`); return the
    steps the next one comes after, and whether they are a group's."""
    if isinstance(node, Step):
        receives = None
        if node.receives is not None:
            receives = f"{'list' if after_group else 'one'}:{node.receives}"
            if not after:
                raise ValueError(
                    f"Step {node.task.name} receives a result, but nothing comes before it."
                )
        steps.append(_Planned(node, list(after), receives))
        for i in after:
            steps[i].has_dependents = True
        return [len(steps) - 1], False
    if isinstance(node, Chain):
        for item in node.items:
            after, after_group = _plan(item, after, after_group, steps)
        return after, after_group
    if isinstance(node, Group):
        ends = [i for item in node.items for i in _plan(item, after, after_group, steps)[0]]
        return ends, True
    ends, _ = _plan(node.group, after, after_group, steps)
    return _plan(node.callback, ends, True, steps)


def _enqueue(node: Node) -> WorkflowResult:
    """Write every step of `node` in one transaction; return the workflow's result."""
    from ..backend import JobStateBackend
    from ..conf import get_settings
    from ..managers import uuid7
    from ..managers.deps import Links, as_result_ids
    from ..models import Job
    from ..task_results import to_task_result
    from .results import WorkflowResult

    steps: list[_Planned] = []
    _plan(node, [], False, steps)
    workflow_id = uuid7()
    db = router.db_for_write(Job)
    defaults = get_settings()
    trace_context = None
    span = _span(steps[0].step.task, len(steps)) if defaults.TRACING else None
    with span or _nothing() as traced, transaction.atomic(using=db):
        if traced is not None:
            trace_context = traced[1]
            traced[0].set_attribute("jobstate.workflow_id", str(workflow_id))
        # Level by level (a step after all it comes after), steps alike in one INSERT.
        levels: dict[int, int] = {}
        for i, planned in enumerate(steps):
            levels[i] = 1 + max((levels[j] for j in planned.after), default=-1)
        jobs: dict[int, Job] = {}
        tasks: dict[int, Task] = {}
        for level in sorted(set(levels.values())):
            batches: dict[tuple[Any, ...], list[int]] = {}
            for i in (i for i, at in levels.items() if at == level):
                planned = steps[i]
                key = (planned.step.task, tuple(planned.after), planned.receives)
                batches.setdefault((*key, planned.has_dependents), []).append(i)
            for (task, after, receives, has_dependents), members in batches.items():
                backend = task.get_backend()
                if not isinstance(backend, JobStateBackend):
                    raise TypeError(
                        f"Step {task.name} uses backend {backend.alias!r}, which is not a "
                        f"JobStateBackend: a workflow's steps are rows of django_jobstate."
                    )
                plan = backend._plans.get(task, backend._plan)  # settings applied, checked
                task = plan.task
                upstream = [steps[j].result_id for j in after]
                own = as_result_ids(getattr(task, "depends_on", None) or ())
                links = Links(
                    depends_on=[*upstream, *own],
                    fresh=frozenset(steps[j].result_id for j in after if not jobs[j].deduplicated),
                    workflow_id=workflow_id,
                    has_dependents=has_dependents,
                    receives=receives,
                )
                calls: list[tuple[Sequence[Any], dict[str, Any]]] = [
                    (steps[i].step.args, steps[i].step.kwargs) for i in members
                ]
                written = backend._enqueue(plan, calls, trace_context, links)
                for i, job in zip(members, written, strict=True):
                    jobs[i], steps[i].result_id, tasks[i] = job, job.result_id, task
    for i, job in jobs.items():
        if not job.deduplicated:
            result = to_task_result([job], tasks[i])
            send(task_enqueued, type(tasks[i].get_backend()), task_result=result)
    return WorkflowResult.read(str(workflow_id), [jobs[i].result_id for i in range(len(steps))])


def _span(task: Task, count: int) -> Any:
    from ..telemetry.tracing import producer_span

    return producer_span(task, count)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

"""Enqueue: the first attempt of a task, queued; many in one statement."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import router

from ..limits.concurrency import Hold
from ..payload import ARGS, KWARGS, encode_payload
from ..uniqueness import UniqueScope
from .bulk import PipelinedInserts
from .deps import Dependencies, Links
from .insert import give
from .limits import Limits
from .prepared import PreparedInserts, job_builder
from .progress import check_metadata
from .result_ids import uuid7s
from .unique import Call, EnqueueUnique, Row

if TYPE_CHECKING:
    from uuid import UUID

    from ..models import Job


class Enqueue(EnqueueUnique, PipelinedInserts, Limits, PreparedInserts, Dependencies):
    def enqueue(
        self,
        task_path: str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """Create the first attempt of a task, queued. `options` as for enqueue_many()."""
        unique_key = options.pop("unique_key", None)
        if unique_key is not None:
            options["unique_keys"] = [unique_key]
        return self.enqueue_many(task_path, [(args, kwargs or {})], **options)[0]

    def enqueue_many(
        self,
        task_path: str,
        calls: Iterable[Call],
        *,
        queue_name: str = "default",
        priority: int = 0,
        run_after: datetime | None = None,
        backend: str = "default",
        max_attempts: int = 1,
        backoff: float = 0,
        timeout: float | None = None,
        unique_keys: Sequence[str] | None = None,
        unique_scope: UniqueScope = UniqueScope.LIVE,
        raise_duplicates: bool = False,
        metadata: dict[str, Any] | None = None,
        trace_context: dict[str, Any] | None = None,
        schedule_name: str | None = None,
        scheduled_for: datetime | None = None,
        concurrency_keys: Sequence[str] | None = None,
        concurrency_limit: int | None = None,
        rate_limit: str | None = None,
        links: Links | None = None,
    ) -> Sequence[Job]:
        """Create the first attempts of several calls of one task: all of them, or none.
        Returns their Jobs in the calls' order: for plain jobs (no key, time, schedule or
        link), while nothing listens to Job's pre_init or post_init, a sequence that builds
        each when first read (bulk.py); else a list.

        One INSERT ... SELECT per chunk of calls (insert.py), whose rows differ only in result_id,
        args and kwargs: they travel as one JSON parameter, the rest as one parameter each
        (the ORM's INSERT would compile and adapt every field of every row, which the
        profile showed was most of an enqueue's time). On PostgreSQL, the INSERT also
        wakes listening workers (wakeup.py).

        With `unique_keys` (one per call), a call whose key is held (uniqueness.py) writes
        nothing: its place in the list is the holder, with `deduplicated` set, or with
        `raise_duplicates`, JobAlreadyEnqueued is raised and nothing is written at all.
        `schedule_name` and `scheduled_for` mark the jobs of a schedule's tick (schedules.py).
        With `concurrency_keys` (one per call) and `concurrency_limit`, each job enters held
        and takes a free slot of its key if there is one (limits/concurrency.py).
        With `rate_limit` (the task's, limits/rates.py), each job waits for its rate's
        claim (held "rate"; or "limit" first, when it has a concurrency key too). With
        `links`, the jobs depend on other tasks, or are steps of a workflow (deps.py).
        """
        calls = list(calls)
        if unique_keys is not None and len(unique_keys) != len(calls):
            raise ValueError(
                f"{len(unique_keys)} unique keys for {len(calls)} calls: give one per call."
            )
        options = {
            "queue_name": queue_name,
            "priority": priority,
            "backend": backend,
            "max_attempts": max_attempts,
            "backoff": backoff,
            "timeout": timeout,
            # As it reads back (a tuple a list, an int key a str), and refused if it cannot
            # be stored: the Jobs returned hold what their rows give.
            "metadata": None if metadata is None else check_metadata(metadata),
        }
        db = router.db_for_write(self.model)
        plain = unique_keys is None and concurrency_keys is None and rate_limit is None
        plain = plain and run_after is None and links is None
        if plain and trace_context is None and schedule_name is None and scheduled_for is None:
            return self._enqueue_plain(db, task_path, options, calls)
        # Without run_after (and enqueued_at), the INSERT takes them from its clock.
        template = self.model(
            task_path=task_path,
            **{name: value for name, value in options.items() if name != "metadata"},
            unique_scope=None if unique_keys is None else unique_scope,
            metadata=options["metadata"] or {},
            trace_context=trace_context,
            schedule_name=schedule_name,
            scheduled_for=scheduled_for,
        )
        if run_after is not None:
            template.run_after = run_after
        if rate_limit is not None:
            template.rate_limit, template.hold = rate_limit, Hold.RATE
        write = functools.partial(
            self._enqueue_template,
            db,
            template,
            calls,
            unique_keys,
            raise_duplicates,
            concurrency_keys,
            concurrency_limit,
        )
        if links is not None:  # depends on other tasks, or a step of a workflow (deps.py)
            return self._enqueue_linked(db, template, links, write)
        return write()

    def _enqueue_template(
        self,
        db: str,
        template: Job,
        calls: list[Call],
        keys: Sequence[str] | None,
        raise_duplicates: bool,
        concurrency_keys: Sequence[str] | None,
        concurrency_limit: int | None,
    ) -> list[Job]:
        unique = keys is not None
        rows = self._rows(calls, keys)
        build = job_builder(self.model, db, template)
        jobs = [build(result_id, args, kwargs, key) for result_id, args, _, kwargs, _, key in rows]
        if concurrency_keys is not None:
            if concurrency_limit is None or len(concurrency_keys) != len(calls):
                raise ValueError("Give a concurrency_limit and one concurrency key per call.")
            template.concurrency_limit = concurrency_limit
            # Its slot first (then its rate, rates.py); its dependencies before both (deps.py).
            template.hold = Hold.DEPS if template.hold == Hold.DEPS else Hold.LIMIT
            for job in jobs:
                job.concurrency_limit, job.hold = concurrency_limit, template.hold
            return self._enqueue_limited(
                db, template, rows, jobs, concurrency_keys, unique, raise_duplicates
            )
        if unique:
            return self._enqueue_unique(db, template, rows, jobs, raise_duplicates)
        return give(jobs, self._insert_all(db, template, rows))

    @classmethod
    def _rows(cls, calls: list[Call], keys: Sequence[str | None] | None = None) -> list[Row]:
        """Each call's result id, arguments (as read back, and as JSON) and unique key; the
        result ids in ascending order (bulk.py maps the ids written back by it)."""
        if keys is None:
            keys = [None] * len(calls)
        row = cls._row
        return [
            row(result_id, args, kwargs, key)
            for result_id, (args, kwargs), key in zip(uuid7s(len(calls)), calls, keys, strict=True)
        ]

    @staticmethod
    def _row(result_id: UUID, args: Sequence[Any], kwargs: dict[str, Any], key: str | None) -> Row:
        return (
            result_id,
            *encode_payload(list(args), ARGS),
            *encode_payload(dict(kwargs), KWARGS),
            key,
        )

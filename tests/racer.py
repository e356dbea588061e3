"""A racing process for the race tests, started several times at once.

    python -m tests.racer claim WORKER_ID LIMIT   # claim until nothing is left
                                                  # (from a key, as workers do)
    python -m tests.racer rescue                  # fail lost workers' attempts
    python -m tests.racer enqueue-unique TASK N KEYS  # N enqueues of a unique task over
                                                  # KEYS labels, as fast as it can

Once connected it prints "ready" and waits for a line on its standard input, so that all
racers start together however long each took to start (conftest.run_racers); then it
prints what it won as JSON: the claimed ids, or the number of attempts it failed.
"""

import json
import sys

import django


def main() -> None:
    action, *args = sys.argv[1:]
    django.setup()
    from django_jobstate.managers import claim_key
    from django_jobstate.models import Job

    Job.objects.exists()  # connect before the start line
    print("ready", flush=True)
    sys.stdin.readline()
    if action == "claim":
        worker_id, limit = args[0], int(args[1])
        won: list[int] = []
        key = None  # like Worker.claim(): from the previous full batch's first key
        while batch := Job.objects.claim(worker_id, limit=limit, from_key=key) or (
            key and Job.objects.claim(worker_id, limit=limit)
        ):
            won.extend(job.pk for job in batch)
            key = claim_key(batch[0]) if len(batch) == limit else None
        print(json.dumps(won))
    elif action == "rescue":
        print(json.dumps(Job.objects.rescue_lost(lost_after=60)))
    elif action == "enqueue-unique":
        print(json.dumps(enqueue_unique(args[0], int(args[1]), int(args[2]))))
    else:
        raise SystemExit(f"unknown action {action!r}")


def enqueue_unique(name: str, n: int, keys: int) -> dict[str, object]:
    """Enqueue `name`("key-<i % keys>") n times; say which result id each call got, and
    which of those calls wrote a row (task_enqueued is sent for those only)."""
    from django_jobstate.tasksapi import task_enqueued
    from tests import tasks

    task = getattr(tasks, name)
    inserted: list[str] = []
    task_enqueued.connect(lambda task_result, **_: inserted.append(task_result.id), weak=False)
    got = [[f"key-{i % keys}", task.enqueue(f"key-{i % keys}").id] for i in range(n)]
    return {"got": got, "inserted": inserted}


if __name__ == "__main__":
    main()

"""A claiming process for the race tests: `python -m tests.claimer WORKER_ID LIMIT START_AT`.

Waits until the wall-clock time START_AT so that all claimers start together, claims
until nothing is left, and prints the ids it won as JSON.
"""

import json
import sys
import time

import django


def main() -> None:
    worker_id, limit, start_at = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    django.setup()
    from django_jobstate.models import Job

    Job.objects.exists()  # connect before the start line
    time.sleep(max(0.0, start_at - time.time()))
    won: list[int] = []
    while batch := Job.objects.claim(worker_id, limit=limit):
        won.extend(job.pk for job in batch)
    print(json.dumps(won))


if __name__ == "__main__":
    main()

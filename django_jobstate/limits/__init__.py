"""Limits on how many attempts run at once, and how fast they start.

- `concurrency.py`: a task's limit, and per key of its arguments (`@task(concurrency=N,
  concurrency_key=[...])`): the key a call is limited under, the options' checks, `Hold`.
- `queues.py`: a queue's limits (`QUEUE_LIMITS`, `jobqueues limit`): read, checked, parsed.
- `fields.py`: the columns, constraints and indexes `Job` takes for concurrency limits,
  and `ConcurrencyLock` (MariaDB/MySQL's per-key lock rows).

The writes that enforce them live with every other write, in managers/ (`limits.py`,
`queue_claim.py`).
"""

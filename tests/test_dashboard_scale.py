"""The Dashboard's time with a million finished rows: a measurement, not an assertion.

    JOBSTATE_DASHBOARD_ROWS=1000000 JOBSTATE_DASHBOARD_SPREAD_DAYS=30 \
        JOBSTATE_TEST_DB=postgres pytest -s -m slow tests/test_dashboard_scale.py

prints, per window, the page's time (median of 3, after one to warm the cache) and each
query's. The rows are written by one INSERT ... SELECT (PostgreSQL, SQLite), spread evenly
over the last SPREAD_DAYS days, a thirteenth of them failed, over three queues and twenty
tasks. Skipped unless JOBSTATE_DASHBOARD_ROWS is set: it takes minutes.
"""

import os
import statistics
import time

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_jobstate.models import Job

ROWS = int(os.environ.get("JOBSTATE_DASHBOARD_ROWS", "0"))
SPREAD = float(os.environ.get("JOBSTATE_DASHBOARD_SPREAD_DAYS", "30")) * 86400

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not ROWS, reason="a measurement: set JOBSTATE_DASHBOARD_ROWS to run it"),
]

COLUMNS = (
    "result_id, task_path, args, kwargs, queue_name, run_after, enqueued_at, started_at, "
    "finished_at, state, worker_id, failure_reason, error_class, error_message"
)
POSTGRES = f"""
INSERT INTO {Job._meta.db_table} ({COLUMNS})
SELECT md5(i::text)::uuid, 'tests.tasks.t' || (i %% 20), '[]', '{{}}',
       (ARRAY['default', 'emails', 'reports'])[1 + i %% 3],
       t - interval '3 s', t - interval '3 s', t - make_interval(secs => 0.1 + i %% 50), t,
       CASE WHEN i %% 13 = 0 THEN 'failed' ELSE 'succeeded' END, 'w',
       CASE WHEN i %% 13 = 0 THEN 'error' ELSE '' END,
       CASE WHEN i %% 13 = 0 THEN 'builtins.ValueError' ELSE '' END,
       CASE WHEN i %% 13 = 0 THEN 'boom ' || i ELSE '' END
FROM (SELECT i, now() - make_interval(secs => i * %s) AS t
      FROM generate_series(1, %s) AS i) AS s
"""
SQLITE = f"""
INSERT INTO {Job._meta.db_table} ({COLUMNS})
WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < %s),
s(i, t) AS (SELECT i, julianday('now') - i * %s / 86400.0 FROM seq)
SELECT lower(hex(randomblob(16))), 'tests.tasks.t' || (i %% 20), '[]', '{{}}',
       CASE i %% 3 WHEN 0 THEN 'default' WHEN 1 THEN 'emails' ELSE 'reports' END,
       strftime('%%Y-%%m-%%d %%H:%%M:%%f', t - 3 / 86400.0),
       strftime('%%Y-%%m-%%d %%H:%%M:%%f', t - 3 / 86400.0),
       strftime('%%Y-%%m-%%d %%H:%%M:%%f', t - (0.1 + i %% 50) / 86400.0),
       strftime('%%Y-%%m-%%d %%H:%%M:%%f', t),
       CASE WHEN i %% 13 = 0 THEN 'failed' ELSE 'succeeded' END, 'w',
       CASE WHEN i %% 13 = 0 THEN 'error' ELSE '' END,
       CASE WHEN i %% 13 = 0 THEN 'builtins.ValueError' ELSE '' END,
       CASE WHEN i %% 13 = 0 THEN 'boom ' || i ELSE '' END
FROM s
"""


@pytest.mark.django_db(transaction=True)
def test_the_dashboards_time_with_a_million_finished_rows(client):
    if connection.vendor not in ("postgresql", "sqlite"):
        pytest.skip("the rows are written with PostgreSQL's or SQLite's SQL")
    started = time.monotonic()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(POSTGRES, [SPREAD / ROWS, ROWS])
            cursor.execute(f"VACUUM ANALYZE {Job._meta.db_table}")
        else:
            cursor.execute(SQLITE, [ROWS, SPREAD / ROWS])
            cursor.execute("ANALYZE")
    print(f"\n{connection.vendor}: {ROWS:,} finished rows over {SPREAD / 86400:g} days,")
    print(f"written in {time.monotonic() - started:.1f} s")
    client.force_login(User.objects.create_superuser("admin"))
    url = reverse("admin:django_jobstate_job_dashboard")
    for window in ("hour", "day"):
        assert client.get(f"{url}?window={window}").status_code == 200  # warm the cache
        times, per_query = [], []
        for _ in range(3):
            with CaptureQueriesContext(connection) as queries:
                begun = time.perf_counter()
                assert client.get(f"{url}?window={window}").status_code == 200
                times.append(time.perf_counter() - begun)
            per_query.append([float(q["time"]) for q in queries])
        slowest = [statistics.median(ts) for ts in zip(*per_query, strict=True)]
        print(
            f"  window={window}: page {statistics.median(times) * 1000:.0f} ms (median of 3); "
            f"queries (ms): {', '.join(f'{t * 1000:.0f}' for t in slowest)}"
        )

"""A step's page reads its workflow by indexes (as test_admin_plans.py checks the other
pages): over 20,000 finished attempts and 20,000 dependencies of other workflows, its
reads of the job table and of the dependency table walk neither, by EXPLAIN on each
database."""

import uuid

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_jobstate.models import JobDependency
from tests.plans import analyze_job_table, finished_history, job_table_reads
from tests.test_admin_plans import assert_indexed, full_walks, job_queries
from tests.workflow_rows import chord

# MariaDB/MySQL transactions: ANALYZE TABLE commits.
pytestmark = pytest.mark.django_db(transaction=True)

EDGES = JobDependency._meta.db_table


def other_workflows(n: int = 20_000) -> None:
    """`n` dependencies of other workflows: 400 callbacks after 50 steps each."""
    callbacks = [uuid.uuid4() for _ in range(n // 50)]
    JobDependency.objects.bulk_create(
        (
            JobDependency(upstream=uuid.uuid4(), downstream=c, position=i)
            for c in callbacks
            for i in range(50)
        ),
        batch_size=2000,
    )


def test_a_steps_page_reads_its_workflow_by_indexes(client):
    finished_history()
    other_workflows()
    steps = chord(50)
    analyze_job_table()
    analyze_job_table(EDGES)
    client.force_login(User.objects.create_superuser("operator"))
    url = reverse("admin:django_jobstate_job_change", args=[steps[-1].pk])
    assert_indexed(job_queries(lambda: client.get(url)))
    with CaptureQueriesContext(connection) as captured:
        assert b"jobstate-workflow-picture" in client.get(url).content
    table = connection.ops.quote_name(EDGES)
    reads = [q["sql"] for q in captured if table in q["sql"]]
    assert len(reads) == 1
    found = job_table_reads(reads[0], table=EDGES)
    assert found, reads[0]
    assert not full_walks(found), (found, reads[0])

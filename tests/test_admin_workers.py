"""The Workers page through the Django test client: what it shows, to whom, how cheaply."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_jobstate.backend import JobStateBackend
from django_jobstate.db.clock import Now
from django_jobstate.heartbeats import Process
from django_jobstate.models import Job, WorkerHeartbeat
from django_jobstate.runner.liveness import Pulse
from django_jobstate.states import State
from tests import tasks
from tests.factories import JobFactory
from tests.plans import analyze_job_table, finished_history, job_table_reads

pytestmark = pytest.mark.django_db

URL = reverse("admin:django_jobstate_workerheartbeat_changelist")
SUPERVISOR = Process(supervisor="web-1:4242:abcd1234", supervisor_pid=4242, concurrency=2)


@pytest.fixture(autouse=True)
def _production_intervals(settings):
    """The defaults, not the tests' quarter-second beats: silent after 15 s, lost after 30 s,
    so a loaded machine's slow request cannot make a fresh heartbeat look silent."""
    settings.JOBSTATE_HEARTBEAT_INTERVAL = 5.0
    settings.JOBSTATE_LOST_AFTER = 30.0


def login(client: Client, *perms: str) -> User:
    user = User.objects.create_user(f"user{User.objects.count()}", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=[f"{p}_workerheartbeat" for p in perms])
    )
    client.force_login(user)
    return user


def beat(
    worker_id: str,
    *,
    seconds_ago: float = 0,
    host: str = "web-1",
    queues: list[str] | None = None,
    process: Process = SUPERVISOR,
) -> WorkerHeartbeat:
    """A heartbeat written as runjobs writes it, `seconds_ago` by the database clock."""
    WorkerHeartbeat.objects.beat({worker_id: 4243}, host=host, queues=queues, process=process)
    WorkerHeartbeat.objects.filter(pk=worker_id).update(
        last_seen=Now() - timedelta(seconds=seconds_ago)
    )
    return WorkerHeartbeat.objects.get(pk=worker_id)


def held(worker_id: str, seconds: float = 90, **fields) -> Job:
    job = JobFactory.in_state(State.RUNNING, worker_id=worker_id, **fields)
    Job.objects.filter(pk=job.pk).update(started_at=Now() - timedelta(seconds=seconds))
    return job


def row(html: str, worker_id: str) -> str:
    [found] = [r for r in html.split("<tr")[1:] if f">{worker_id}</a>" in r]
    return found.split("</tr>")[0]


def job_url(job: Job) -> str:
    return reverse("admin:django_jobstate_job_change", args=[job.pk])


def test_a_beat_records_who_runs_the_worker():
    Pulse("test").beat({"w1": 11}, ["emails"], SUPERVISOR)
    Pulse("test").beat({"w2": 12}, None, Process(in_flight=4))
    w1, w2 = WorkerHeartbeat.objects.order_by("pk")
    assert (w1.supervisor, w1.supervisor_pid, w1.concurrency, w1.in_flight) == (
        "web-1:4242:abcd1234",
        4242,
        2,
        1,
    )
    assert (w2.supervisor, w2.supervisor_pid, w2.concurrency, w2.in_flight) == ("", None, None, 4)
    # Later beats change last_seen only.
    WorkerHeartbeat.objects.beat({"w1": 11, "w2": 12}, host="other", queues=None)
    assert WorkerHeartbeat.objects.get(pk="w1").supervisor == "web-1:4242:abcd1234"


def test_the_page_lists_each_worker_and_what_it_holds(client):
    login(client, "view")
    beat("web-1:4242:abcd1234/0.1", queues=["emails", "default"])
    beat("local-worker", host="laptop", process=Process(in_flight=3))
    sending = held("web-1:4242:abcd1234/0.1", task_path="tests.tasks.email", queue_name="emails")
    other = held("web-1:4242:abcd1234/0.1", seconds=5)
    JobFactory.in_state(State.SUCCEEDED, worker_id="web-1:4242:abcd1234/0.1")  # done: not held

    html = client.get(URL).content.decode()

    supervised = row(html, "web-1:4242:abcd1234/0.1")
    for text in ["web-1", "4243", "web-1:4242:abcd1234", "pid 4242", "default, emails"]:
        assert text in supervised
    assert "concurrency 2" in supervised
    assert f'<a href="{job_url(sending)}" title="tests.tasks.email">#{sending.pk} email</a>' in (
        supervised
    )
    assert f'href="{job_url(other)}"' in supervised
    assert "for 1 min 3" in supervised  # 90 s, give or take a slow machine
    assert supervised.count("<li>") == 2
    assert "beating" in supervised
    assert "silent" not in supervised

    local = row(html, "local-worker")
    for text in ["in-process", "laptop", ">all<", "idle"]:
        assert text in local
    assert "in flight 3" in local
    assert "Silent after 15.0 s without a heartbeat" in html


def test_silent_workers_are_marked_by_the_database_clock_with_their_rescue(client):
    login(client, "view")
    beat("alive", seconds_ago=2)
    beat("quiet", seconds_ago=20)  # silent after 15 s, lost after 30
    beat("gone", seconds_ago=60)
    job = held("quiet", seconds=120)
    young = held("gone", seconds=10)  # never rescued before it is 30 s old

    html = client.get(URL).content.decode()

    assert "silent" not in row(html, "alive")
    quiet = row(html, "quiet")
    assert '<span class="jobstate-badge jobstate-failed">silent</span>' in quiet
    assert "failed as lost from" in quiet
    assert "(in 9." in quiet or "(in 10." in quiet  # 30 s after its last beat
    assert f'href="{job_url(job)}"' in quiet
    assert "lost in" in quiet
    gone = row(html, "gone")
    assert f'href="{job_url(young)}"' in gone
    assert "lost in 19." in gone or "lost in 20." in gone  # 30 s after the attempt began

    empty = beat("empty", seconds_ago=45)
    assert "holds nothing: forgotten after 30.0 s of silence" in row(
        client.get(URL).content.decode(), empty.pk
    )


def test_filters_by_host_queue_and_status(client):
    login(client, "view")
    beat("a", host="web-1", queues=["emails"])
    beat("b", host="web-2", queues=["reports"])
    beat("c", host="web-2", queues=None, seconds_ago=40)  # every queue

    def shown(**query: str) -> set[str]:
        response = client.get(URL, query)
        assert response.status_code == 200
        return {w.pk for w in response.context["cl"].result_list}

    assert shown() == {"a", "b", "c"}
    assert shown(host="web-2") == {"b", "c"}
    assert shown(queue="emails") == {"a", "c"}
    assert shown(queue="reports", host="web-2") == {"b", "c"}
    assert shown(status="silent") == {"c"}
    assert shown(status="alive") == {"a", "b"}
    html = client.get(URL).content.decode()
    for link in ["?queue=emails", "?queue=reports", "?host=web-1", "?status=silent"]:
        assert link in html


def test_every_user_and_task_controlled_string_is_escaped(client):
    login(client, "view")
    evil = "<img src=x onerror=alert(1)>"
    process = Process(supervisor=f"s{evil}"[:64], supervisor_pid=1, concurrency=1)
    beat(f"w{evil}", host=f"h{evil}", queues=[f"q{evil}"], process=process)
    held(f"w{evil}", task_path=f"tests.tasks.t{evil}", queue_name=f"q{evil}")

    html = client.get(URL).content.decode()
    detail = client.get(
        reverse("admin:django_jobstate_workerheartbeat_change", args=[f"w{evil}"])
    ).content.decode()

    for page in (html, detail):
        assert "<img src=x" not in page
        assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_view_permission_shows_the_page_and_nothing_is_editable(client):
    beat("w1")
    assert client.get(URL).status_code == 302  # to the login page
    login(client)
    assert client.get(URL).status_code == 403
    login(client, "view")
    response = client.get(URL)
    assert response.status_code == 200
    assert "delete_selected" not in response.content.decode()
    add = reverse("admin:django_jobstate_workerheartbeat_add")
    delete = reverse("admin:django_jobstate_workerheartbeat_delete", args=["w1"])
    change = reverse("admin:django_jobstate_workerheartbeat_change", args=["w1"])
    assert client.get(add).status_code == 403
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert 'name="_save"' not in client.get(change).content.decode()
    # Even with every permission Django has for the model: the rows are the workers'.
    login(client, "view", "add", "change", "delete")
    assert client.get(add).status_code == 403
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert client.post(change, {"host": "x"}).status_code == 403
    assert WorkerHeartbeat.objects.get(pk="w1").host == "web-1"


def test_the_page_costs_the_same_queries_for_one_worker_or_many(client):
    login(client, "view")
    beat("w0")
    held("w0")
    with CaptureQueriesContext(connection) as one:
        assert client.get(URL).status_code == 200
    for n in range(1, 12):
        beat(f"w{n}")
        held(f"w{n}")
        held(f"w{n}")
    with CaptureQueriesContext(connection) as many:
        assert client.get(URL).status_code == 200
    assert len(many) == len(one)
    # What the shown workers hold, and the attempts of workers with no heartbeat row.
    assert sum(Job._meta.db_table in q["sql"] for q in many) == 2


def test_attempts_of_workers_with_no_heartbeat_are_listed_with_their_rescue(client):
    login(client, "view")
    beat("alive")
    held("alive")
    orphan = held("<b>vanished</b>", seconds=10, task_path="tests.tasks.<i>x</i>")

    html = client.get(URL).content.decode()

    [banner] = html.split('<div class="jobstate-unseen">')[1:]
    banner = banner.split("</div>")[0]
    assert f'<a href="{job_url(orphan)}" title="tests.tasks.&lt;i&gt;x&lt;/i&gt;">' in banner
    assert "&lt;b&gt;vanished&lt;/b&gt;" in banner
    assert "lost in 19." in banner or "lost in 20." in banner  # 30 s after it began
    assert banner.count("<li>") == 1


@pytest.mark.django_db(transaction=True)  # MySQL's ANALYZE TABLE commits
def test_the_page_reads_held_attempts_through_an_index_never_history():
    finished_history()
    JobStateBackend("default", {}).bulk_enqueue(tasks.record, [(["live"], {})] * 20)
    Job.objects.claim("web-1/0", limit=3)
    beat("web-1/0")
    beat("w")  # the worker that ran the 20,000: none held now
    mysql = connection.vendor == "mysql"
    analyze_job_table()
    client = Client()
    login(client, "view")

    with CaptureQueriesContext(connection) as queries:
        html = client.get(URL).content.decode()
    assert row(html, "web-1/0").count("<li>") == 3

    sqls = [q["sql"] for q in queries if Job._meta.db_table in q["sql"]]
    assert len(sqls) == 2  # held by the shown workers; held by workers with no heartbeat
    for sql in sqls:
        reads = job_table_reads(sql)
        assert reads, sql
        if connection.vendor == "postgresql":
            assert {index for _, index in reads} == {"jobstate_job_running"}, sql
            assert not any(kind == "Seq Scan" for kind, _ in reads), sql
        elif mysql:  # no partial index: the worker_id index or the claim order's (state first)
            assert all(access != "ALL" and key for access, key in reads), (sql, reads)
        else:
            assert all(index for _, index in reads), (sql, reads)

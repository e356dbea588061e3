"""A bulk enqueue of plain jobs (managers/bulk.py): its Jobs built when first read; on
PostgreSQL with psycopg 3, each chunk's INSERT sent while the next chunk's rows are made,
nothing read back before the last is sent. Whatever fails after a chunk was sent leaves
nothing written."""

import pickle

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.models.signals import post_init

from django_jobstate.exceptions import InvalidPayload
from django_jobstate.managers import bulk
from django_jobstate.managers.bulk import EnqueuedJobs
from django_jobstate.models import Job
from django_jobstate.payload import MAX_PAYLOAD_DEPTH
from django_jobstate.tasksapi import default_task_backend
from tests.tasks import record

postgres_only = pytest.mark.skipif(
    not bulk.pipelined(connection), reason="pipeline mode: PostgreSQL with psycopg 3"
)


@pytest.fixture
def small_chunks(monkeypatch):
    """Two calls a statement: a few calls are several statements, made and sent in turn."""
    monkeypatch.setattr(bulk, "PIPELINED_CHUNK", 2)


@pytest.mark.django_db
def test_the_jobs_are_built_when_first_read_as_they_were_written(small_chunks):
    calls = [(["a"], {}), (["b"], {"n": 1}), ([], {}), (["d"], {}), (["e"], {})]

    jobs = Job.objects.enqueue_many("tests.tasks.record", calls, priority=3)

    assert isinstance(jobs, EnqueuedJobs)
    assert jobs._built == {}  # nothing built that nobody reads
    last = jobs[-1]
    assert jobs[4] is last
    assert jobs._built == {4: last}
    stored = list(Job.objects.order_by("id"))
    read = list(jobs)
    assert [job.pk for job in read] == [row.pk for row in stored]
    fields = [f.attname for f in Job._meta.concrete_fields]
    assert [[getattr(j, f) for f in fields] for j in read] == [
        [getattr(row, f) for f in fields] for row in stored
    ]
    assert all(not job._state.adding and job._state.db == "default" for job in read)
    assert jobs[1:3] == read[1:3]
    assert jobs == tuple(read)
    assert repr(jobs) == "<EnqueuedJobs: 5 jobs>"
    assert pickle.loads(pickle.dumps(jobs)) == read  # as the list it reads as


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_payload_refused_after_a_chunk_was_sent_writes_nothing(small_chunks):
    calls = [(["a"], {}), (["b"], {}), (["c"], {}), ([{1, 2}], {})]

    with pytest.raises(InvalidPayload, match="Task arguments must be JSON"):
        default_task_backend.bulk_enqueue(record, calls)

    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_bulk_enqueue_whose_jobs_cannot_be_built_writes_nothing(small_chunks):
    """With a post_init receiver of the project's, the Jobs are built at once, each
    chunk's after it was sent: a build that raises must leave none written."""

    def refuse(sender, instance, **kwargs):
        if instance.args == ["boom"]:
            raise RuntimeError("refused: boom")

    post_init.connect(refuse, sender=Job)
    try:
        with pytest.raises(RuntimeError, match="refused: boom"):
            default_task_backend.bulk_enqueue(record, [(["a"], {})] * 3 + [(["boom"], {})])
    finally:
        post_init.disconnect(refuse, sender=Job)

    assert not Job.objects.exists()


@pytest.fixture
def trigger(request):
    """A BEFORE INSERT trigger of the test database's on the job table: for a job whose
    first argument is "boom", `body` (PL/pgSQL)."""
    body = request.param
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION on_boom() RETURNS trigger AS $$ BEGIN "
            f"IF NEW.args ->> 0 = 'boom' THEN {body} END IF; "
            "RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            "CREATE TRIGGER on_boom BEFORE INSERT ON django_jobstate_job "
            "FOR EACH ROW EXECUTE FUNCTION on_boom()"
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER on_boom ON django_jobstate_job")
        cursor.execute("DROP FUNCTION on_boom()")


CALLS = [(["a"], {}), (["b"], {}), (["c"], {}), (["d"], {}), (["boom"], {})]


@postgres_only
@pytest.mark.parametrize("trigger", ["RAISE EXCEPTION 'refused: boom';"], indirect=True)
@pytest.mark.django_db(transaction=True)
def test_a_bulk_enqueue_refused_by_a_later_statement_writes_nothing(small_chunks, trigger):
    """A refusal of the third statement still raises Django's error, and nothing stays
    written, whether bulk_enqueue() is the transaction or a part of the caller's."""
    with pytest.raises(DatabaseError, match="refused: boom"):
        default_task_backend.bulk_enqueue(record, CALLS)
    assert not Job.objects.exists()

    with transaction.atomic():
        with pytest.raises(DatabaseError, match="refused: boom"):
            default_task_backend.bulk_enqueue(record, CALLS)
        results = default_task_backend.bulk_enqueue(record, [(["x"], {}), (["y"], {})] * 2)

    assert sorted(Job.objects.values_list("args", flat=True)) == [["x"], ["x"], ["y"], ["y"]]
    stored = {str(job.result_id) for job in Job.objects.all()}
    assert stored == {result.id for result in results}


@postgres_only
@pytest.mark.parametrize("trigger", ["RETURN NULL;"], indirect=True)
@pytest.mark.parametrize(
    ("calls", "said"),
    [([*CALLS, (["f"], {})], "1 of 2 jobs were written"), (CALLS, "0 of 1 jobs were written")],
)
@pytest.mark.django_db(transaction=True)
def test_a_bulk_enqueue_whose_row_a_trigger_skipped_writes_nothing(
    small_chunks, trigger, calls, said
):
    """A BEFORE INSERT trigger that returns NULL skips its row without an error: the ids
    read back would no longer line up with the calls, so the enqueue says so and undoes
    every chunk (also when it skipped a chunk's only row)."""
    with pytest.raises(DatabaseError, match=f"{said}: a trigger on"):
        default_task_backend.bulk_enqueue(record, calls)

    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_jobs_keep_the_metadata_they_were_written_with():
    """The Jobs built when read, and the statement kept for later calls, hold their own copy
    of the caller's metadata: a change to the caller's dict after the enqueue reaches
    neither."""
    metadata = {"tenant": 1}
    jobs = Job.objects.enqueue_many("tests.tasks.record", [(["a"], {})] * 2, metadata=metadata)
    metadata["tenant"] = 2

    later = Job.objects.enqueue_many(
        "tests.tasks.record", [(["b"], {})] * 2, metadata={"tenant": 1}
    )

    assert [job.metadata for job in [*jobs, *later]] == [{"tenant": 1}] * 4
    assert list(Job.objects.values_list("metadata", flat=True)) == [{"tenant": 1}] * 4


@pytest.mark.django_db
def test_unique_keys_must_be_one_per_call():
    with pytest.raises(ValueError, match="1 unique keys for 2 calls: give one per call"):
        Job.objects.enqueue_many("tests.tasks.record", [(["a"], {})] * 2, unique_keys=["k"])

    assert not Job.objects.exists()


@pytest.mark.django_db
def test_every_kind_of_json_value_reads_back_as_sent_from_a_bulk_enqueue():
    """Several rows travel as one JSON array (a JSON_TABLE on MariaDB/MySQL, json_each on
    SQLite, jsonb_array_elements on PostgreSQL): what each row stores is what was sent."""
    values = [
        "",
        'a "quoted" \\ back\\slash',
        "é, 漢字, 😀, \u2028",
        "null",
        0.1,
        1.0000000000000002,
        1e16,
        -1e308,
        1e-7,
        -0.0,
        2**63,
        -(2**63),
        True,
        None,
        [],
        {},
        {"nested": [{"deep": [1, [2, [3]]]}], "": "empty key"},
    ]
    calls = [([value], {"k": value}) for value in values]

    jobs = Job.objects.enqueue_many("tests.tasks.record", calls)

    stored = {job.pk: job for job in Job.objects.all()}
    for job, value in zip(jobs, values, strict=True):
        row = stored[job.pk]
        assert (row.args, row.kwargs) == ([value], {"k": value}) == (job.args, job.kwargs)
        assert [type(v) for v in (row.args[0], row.kwargs["k"])] == [type(value)] * 2


@pytest.mark.django_db
def test_a_bulk_enqueue_stores_the_deepest_arguments_and_percent_signs_in_its_options():
    """Arguments as deep as any database stores (MAX_PAYLOAD_DEPTH), and options whose
    text holds SQL's parameter marks (MariaDB/MySQL quote the options once a statement)."""
    deep: list = []  # nested MAX_PAYLOAD_DEPTH deep once in the arguments' list
    for _ in range(MAX_PAYLOAD_DEPTH - 2):
        deep = [deep]
    metadata = {"note": "100% of %s, %(name)s and %%"}
    calls = [([deep], {}), (["x"], {"k": "%s"})]

    jobs = Job.objects.enqueue_many("tests.tasks.record", calls, metadata=metadata)

    rows = {row.pk: row for row in Job.objects.all()}
    assert [(rows[j.pk].args, rows[j.pk].kwargs) for j in jobs] == [
        ([deep], {}),
        (["x"], {"k": "%s"}),
    ]
    assert [rows[j.pk].metadata for j in jobs] == [metadata, metadata]


@pytest.mark.django_db
def test_unique_keys_of_any_text_are_stored_as_given_by_a_bulk_enqueue():
    keys = ['a "quoted" key', "back\\slash", "%s and %%"]

    jobs = Job.objects.enqueue_many("tests.tasks.record", [(["x"], {})] * 3, unique_keys=keys)

    assert [Job.objects.get(pk=job.pk).unique_key for job in jobs] == keys

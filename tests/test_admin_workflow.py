"""A step's job page shows its workflow (admin/workflow.py, workflow_svg.py): boxes by
state, arrows for dependencies, stages by depth, links to each step's newest attempt, a
table that says the same, a cap for huge workflows, and a cost that does not grow with
the workflow's size. Through the Django test client, on each database."""

import re
import uuid
import xml.etree.ElementTree as ET

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_jobstate.admin.workflow import MAX_BOXES, PER_STAGE
from django_jobstate.models import Job
from django_jobstate.states import State
from tests.factories import JobFactory
from tests.workflow_rows import LOOKS, chain, chord, edges, retried, step_row

pytestmark = pytest.mark.django_db

SVG = "{http://www.w3.org/2000/svg}"


def page(client, job: Job) -> str:
    response = client.get(reverse("admin:django_jobstate_job_change", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def picture(html: str) -> ET.Element:
    found = re.search(r'<svg class="jobstate-workflow-picture".*?</svg>', html, re.S)
    assert found, "no workflow picture on the page"
    return ET.fromstring(found.group(0).replace("<svg ", f'<svg xmlns="{SVG[1:-1]}" ', 1))


def boxes(svg: ET.Element) -> list[dict]:
    """Each box: its link, its state class, its rect's place, its texts."""
    found = []
    for link in svg.iter(f"{SVG}a"):
        rect = link.find(f"{SVG}rect")
        looks = [c[len("jobstate-wf-") :] for c in link.get("class").split()[1:]]
        found.append(
            {
                "href": link.get("href"),
                "look": looks[0],
                "this": "this" in looks,
                "x": float(rect.get("x")),
                "y": float(rect.get("y")),
                "texts": [t.text for t in link.iter(f"{SVG}text")],
                "title": link.find(f"{SVG}title").text,
            }
        )
    return found


def href(job: Job) -> str:
    return reverse("admin:django_jobstate_job_change", args=[job.pk])


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("operator"))
    return client


def test_a_chain_is_drawn_left_to_right_with_a_box_per_state_and_links(operator):
    steps = chain(*LOOKS)
    html = page(operator, steps[1])
    svg = picture(html)
    drawn = boxes(svg)
    assert [b["look"] for b in drawn] == LOOKS  # every state its own class
    assert [b["href"] for b in drawn] == [href(step) for step in steps]
    assert [b["this"] for b in drawn] == [False, True, *[False] * 5]
    xs = [b["x"] for b in drawn]
    assert xs == sorted(xs)
    assert len(set(xs)) == len(xs)
    assert len({b["y"] for b in drawn}) == 1  # one line
    assert [b["texts"][1] for b in drawn] == [
        "succeeded",
        "running",
        "failed",
        "upstream failed",
        "cancelled",
        "waiting for its dependencies",
        "queued",
    ]
    assert len(svg.findall(f".//{SVG}path[@class='jobstate-wf-arrow']")) == len(LOOKS) - 1
    # The text alternative: a title, a description, and the table of steps.
    assert svg.get("role") == "group"
    assert "7 steps: 1 succeeded, 1 running" in svg.find(f"{SVG}desc").text
    rows = re.findall(r"<tr[^>]*>\s*<td>(\d+)</td>\s*<td><a href=\"([^\"]+)\"", html)
    assert rows == [(str(i + 1), href(step)) for i, step in enumerate(steps)]


def test_a_chord_stacks_its_group_in_one_stage_then_the_callback(operator):
    steps = chord(50)
    drawn = boxes(picture(page(operator, steps[0])))
    group, callback = drawn[:50], drawn[50]
    assert len(drawn) == 51
    assert callback["href"] == href(steps[-1])
    assert callback["look"] == "running"
    assert max(b["x"] for b in group) < callback["x"]
    assert len({(b["x"], b["y"]) for b in group}) == 50  # no two boxes in one place
    assert len({b["x"] for b in group}) == 5  # wrapped in columns of 10: readable
    assert all(b["look"] == "succeeded" for b in group)


def test_a_parallel_pair_of_chains_keeps_each_chain_on_its_row(operator):
    workflow_id = uuid.uuid4()
    a1, a2, b1, b2 = (step_row(workflow_id, look) for look in ["succeeded"] * 2 + ["running"] * 2)
    edges([(a1, b2), (a2, b1)])  # b2 after a1, b1 after a2: drawn a1-b2, a2-b1
    drawn = {b["href"]: b for b in boxes(picture(page(operator, a1)))}
    assert drawn[href(a1)]["y"] == drawn[href(b2)]["y"]
    assert drawn[href(a2)]["y"] == drawn[href(b1)]["y"]


def test_a_box_links_to_the_newest_attempt_of_its_step(operator):
    first, second = chain("failed", "waiting")
    again = retried(first)
    drawn = boxes(picture(page(operator, second)))
    assert drawn[0]["href"] == href(again)
    assert drawn[0]["look"] == "queued"
    assert "attempt 2" in drawn[0]["title"]
    # From the failed first attempt's page too, its step is the one marked.
    assert boxes(picture(page(operator, first)))[0]["this"]


def test_a_huge_workflow_is_drawn_in_part_and_says_how_much_is_left_out(operator):
    steps = chord(PER_STAGE + 40)
    html = page(operator, steps[PER_STAGE + 10])  # a step past the stage's cap: still drawn
    drawn = boxes(picture(html))
    assert len(drawn) == PER_STAGE + 1 <= MAX_BOXES
    assert href(steps[PER_STAGE + 10]) in [b["href"] for b in drawn]
    assert drawn[-1]["href"] == href(steps[-1])  # the callback
    assert "101 steps." in html
    assert "61 are drawn (60 succeeded, 1 running); 40 more are" in html


def test_names_are_escaped(operator):
    (step,) = chain("failed")
    Job.objects.filter(pk=step.pk).update(task_path="tests.tasks.<b>bold</b>")
    html = page(operator, step)
    assert "<b>bold" not in html
    assert "&lt;b&gt;bold" in html
    picture(html)  # still well formed


def test_a_job_outside_any_workflow_has_no_picture(operator):
    html = page(operator, JobFactory())
    assert "jobstate-workflow" not in html


def test_the_pages_queries_do_not_grow_with_the_workflow(operator):
    def queries(job: Job) -> int:
        with CaptureQueriesContext(connection) as captured:
            html = page(operator, job)
        steps = Job.objects.filter(workflow_id=job.workflow_id).count()
        assert len(boxes(picture(html))) == min(steps, PER_STAGE + 1)
        return len(captured)

    page(operator, JobFactory())  # Django's caches (the content type) filled
    with CaptureQueriesContext(connection) as captured:  # a running job outside workflows
        page(operator, JobFactory.in_state(State.RUNNING))
    small, large = chain("succeeded", "running"), chord(150)
    assert queries(large[-1]) == queries(small[-1])
    assert queries(large[-1]) <= len(captured) + 2  # the steps, their edges


@pytest.mark.django_db(transaction=True)
def test_a_workflow_enqueued_and_run_through_the_public_api_is_drawn(client):
    from django_jobstate.runner.worker import Worker
    from django_jobstate.workflows import chain, chord, group, step
    from tests import workflow_tasks as t

    client.force_login(User.objects.create_superuser("operator"))
    fan_in = chord(group(step(t.step_value, i) for i in range(3)), step(t.total))
    broken = chain(step(t.boom_step, "x"), step(t.step_value, 1))
    done, failed = fan_in.enqueue(), broken.enqueue()
    Worker(burst=True, poll_interval=0.05).run()
    Worker(burst=True, poll_interval=0.05).run()  # what the first released

    callback = Job.objects.get(result_id=done.steps[-1].id)
    drawn = boxes(picture(page(client, callback)))
    assert [b["look"] for b in drawn] == ["succeeded"] * 4
    assert [b["href"] for b in drawn][-1] == href(callback)
    assert len({b["x"] for b in drawn[:3]}) == 1  # the group in one stage
    downstream = Job.objects.get(result_id=failed.steps[-1].id)
    assert [b["look"] for b in boxes(picture(page(client, downstream)))] == [
        "failed",
        "upstream_failed",
    ]

"""The Workers page in a real browser (Debian's headless Chromium), beside a real `runjobs`.
The browser fixture and its rules are test_admin_browser's."""

import json
from datetime import timedelta

import pytest

from django_jobstate.db.clock import Now
from django_jobstate.models import Job, WorkerHeartbeat
from django_jobstate.states import State
from tests import tasks
from tests.browser import at_sizes, browser, click_and_load, login, staff_user
from tests.factories import JobFactory
from tests.waiting import wait_for

__all__ = ["browser"]  # the fixture


def fits(driver, size: str) -> None:
    """No column of the list is cut off: the table is no wider than what shows it."""
    assert driver.execute_script(
        "const box = document.querySelector('#changelist .results');"
        "return box.scrollWidth <= box.clientWidth"
        " && box.getBoundingClientRect().right <= document.documentElement.clientWidth;"
    ), f"the workers' list is cut off at {size}"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_operator_sees_a_running_worker_and_the_job_it_holds(
    browser, live_server, runjobs, settings
):
    from selenium.webdriver.common.by import By

    # How the page judges silence (the runjobs process keeps the tests' quick beats): a
    # loaded machine's late beat must not make the worker look silent.
    settings.JOBSTATE_HEARTBEAT_INTERVAL = 5.0
    settings.JOBSTATE_LOST_AFTER = 30.0
    driver = browser
    staff_user("view_workerheartbeat", "view_job")
    result = tasks.sleep_then_record.using(queue_name="emails").enqueue("held", 600)
    # Its rescuer must not fail the silent worker's attempt (below) as lost before the page
    # shows it: the tests' own window is 3 s.
    proc = runjobs.start(
        "--queue",
        "emails",
        "--queue",
        "default",
        "--concurrency",
        "2",
        JOBSTATE_TEST_SETTINGS=json.dumps({"JOBSTATE_LOST_AFTER": 300.0}),
    )
    job = wait_for(
        lambda: Job.objects.filter(result_id=result.id, state=State.RUNNING).first(),
        f"the worker to start the job; runjobs said:\n{runjobs.output(proc)}",
    )
    wait_for(lambda: WorkerHeartbeat.objects.count() == 2, "both workers' heartbeats")
    # And a worker elsewhere that went silent 20 s ago, holding an attempt.
    silent = "db-2:77:0badc0de/0.1"
    WorkerHeartbeat.objects.beat({silent: 78}, host="db-2", queues=["reports"])
    WorkerHeartbeat.objects.filter(pk=silent).update(last_seen=Now() - timedelta(seconds=20))
    stuck = JobFactory.in_state(
        State.RUNNING, worker_id=silent, task_path="tests.tasks.record", queue_name="reports"
    )

    login(driver, f"{live_server.url}/admin/django_jobstate/workerheartbeat/")
    rows = {
        row.find_element(By.CSS_SELECTOR, ".field-worker a").text: row
        for row in driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    }
    assert set(rows) == set(WorkerHeartbeat.objects.values_list("worker_id", flat=True))
    holder = rows[job.worker_id]
    assert "BEATING" in holder.find_element(By.CSS_SELECTOR, ".field-worker").text
    assert holder.find_element(By.CSS_SELECTOR, ".field-queue_names").text == "default, emails"
    assert (
        f"pid {WorkerHeartbeat.objects.get(pk=job.worker_id).pid}"
        in holder.find_element(By.CSS_SELECTOR, ".field-process").text
    )
    supervisor = holder.find_element(By.CSS_SELECTOR, ".field-supervised_by").text
    assert f"pid {proc.pid}" in supervisor
    assert "concurrency 2" in supervisor
    link = holder.find_element(By.CSS_SELECTOR, ".field-holds a")
    assert link.text == f"#{job.pk} sleep_then_record"
    [idle] = [row for worker_id, row in rows.items() if worker_id not in (job.worker_id, silent)]
    assert idle.find_element(By.CSS_SELECTOR, ".field-holds").text == "idle"

    lost = rows[silent].text
    assert "SILENT" in lost
    assert "failed as lost from" in lost
    assert f"#{stuck.pk} record" in lost

    at_sizes(
        driver,
        {"laptop": "admin-workers-1366x768.png", "phone": "admin-workers-390.png"},
        check=fits,
    )

    click_and_load(driver, link)
    assert f"/admin/django_jobstate/job/{job.pk}/change/" in driver.current_url

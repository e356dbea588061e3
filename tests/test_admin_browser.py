"""The job admin in a real browser: Debian's headless Chromium against a live test server
(the fixture and the shared helpers are tests/browser.py's)."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_jobstate.models import Job, WorkerHeartbeat
from django_jobstate.states import State
from tests.browser import (
    PASSWORD,
    browser,
    click_and_load,
    login,
    not_available,
    screenshot,
    staff_user,
)
from tests.factories import JobFactory

__all__ = ["browser"]  # the fixture


@pytest.mark.django_db(transaction=True)
def test_operator_finds_a_failed_job_and_retries_it(browser, live_server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    driver = browser
    staff_user("view_job", "change_job")
    first = JobFactory.in_state(State.FAILED, task_path="tests.tasks.boom", max_attempts=3)
    failed = JobFactory.in_state(
        State.FAILED,
        task_path="tests.tasks.boom",
        args=["disk full"],
        kwargs={"retry": True, "to": ["ops@example.com"]},
        result_id=first.result_id,
        attempt=2,
        previous=first,
        max_attempts=3,
        worker_id="web-1:4242",
        error_message="disk full",
        traceback=(
            "Traceback (most recent call last):\n"
            '  File "/app/tests/tasks.py", line 24, in boom\n'
            "    raise ValueError(message)\n"
            "ValueError: disk full\n"
        ),
    )
    succeeded = JobFactory.in_state(State.SUCCEEDED, return_value={"sent": 3})
    JobFactory.in_state(State.RUNNING, task_path="tests.tasks.email", queue_name="emails")
    JobFactory.in_state(State.QUEUED, priority=10)

    # Log in through the login form.
    login(driver, f"{live_server.url}/admin/django_jobstate/job/")
    assert driver.find_element(By.ID, "changelist")
    assert driver.find_element(By.CSS_SELECTOR, ".jobstate-count.jobstate-all").text == "All 5"

    # Filter failed jobs.
    filters = driver.find_element(By.ID, "changelist-filter")
    click_and_load(driver, filters.find_element(By.LINK_TEXT, "Failed"))
    assert "state__exact=failed" in driver.current_url
    rows = driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 2
    assert {badge.text for badge in driver.find_elements(By.CSS_SELECTOR, ".jobstate-badge")} == {
        "FAILED"
    }
    screenshot(driver, "admin-job-list.png")

    # Open the latest attempt: its traceback and the task's attempts.
    click_and_load(driver, driver.find_element(By.LINK_TEXT, str(failed.pk)))
    traceback = driver.find_element(By.CSS_SELECTOR, "pre.jobstate-traceback")
    assert "ValueError: disk full" in traceback.text
    assert "monospace" in traceback.value_of_css_property("font-family")
    history = driver.find_elements(By.CSS_SELECTOR, ".jobstate-history tbody tr")
    assert [row.text.split()[0] for row in history] == ["1/3", "2/3"]
    assert (
        history[0]
        .find_element(By.TAG_NAME, "a")
        .get_attribute("href")
        .endswith(f"/job/{first.pk}/change/")
    )
    assert not driver.find_elements(By.NAME, "_save")
    screenshot(driver, "admin-failed-job.png")

    # Back in the filtered list, select it and run the retry action.
    click_and_load(driver, driver.find_element(By.CSS_SELECTOR, "a.closelink"))
    assert "state__exact=failed" in driver.current_url
    driver.find_element(By.CSS_SELECTOR, f"input.action-select[value='{failed.pk}']").click()
    Select(driver.find_element(By.NAME, "action")).select_by_value("retry_jobs")
    click_and_load(
        driver, driver.find_element(By.CSS_SELECTOR, "#changelist-form button[name=index]")
    )
    # It asks first, saying what will happen; nothing is written until the operator agrees.
    plan = driver.find_element(By.CSS_SELECTOR, ".jobstate-plan").text
    assert plan == "1 failed job will get a new attempt.", plan
    assert not Job.objects.filter(previous=failed).exists()
    screenshot(driver, "admin-retry-confirmation.png")
    click_and_load(driver, driver.find_element(By.CSS_SELECTOR, ".jobstate-confirm [type=submit]"))
    # It lands on the new attempt, which the "failed" filter would have hidden.
    new = Job.objects.get(previous=failed)
    assert (new.state, new.attempt) == (State.QUEUED, 3)
    assert driver.current_url.endswith(f"/job/{new.pk}/change/")
    message = driver.find_element(By.CSS_SELECTOR, ".messagelist .success").text
    expected = (
        f"Queued a new attempt for 1 of 1 selected job: job #{new.pk} (attempt 3); skipped 0."
    )
    assert message == expected, message
    screenshot(driver, "admin-after-retry.png")
    history = driver.find_elements(By.CSS_SELECTOR, ".jobstate-history tbody tr")
    assert [row.text.split()[0] for row in history] == ["1/3", "2/3", "3/3"]
    assert "retried by hand by operator" in history[2].text

    # A succeeded job's page offers neither save nor delete.
    driver.get(f"{live_server.url}/admin/django_jobstate/job/{succeeded.pk}/change/")
    pres = [pre.text for pre in driver.find_elements(By.CSS_SELECTOR, "pre.jobstate-pre")]
    assert '{\n  "sent": 3\n}' in pres
    assert not driver.find_elements(By.CSS_SELECTOR, "input[type=submit]")
    assert not driver.find_elements(By.CSS_SELECTOR, "a.deletelink")
    assert driver.find_element(By.CSS_SELECTOR, "a.closelink")


@pytest.mark.django_db(transaction=True)
def test_retry_button_on_a_failed_jobs_page(browser, live_server):
    from selenium.webdriver.common.by import By

    driver = browser
    staff_user("view_job", "change_job")
    failed = JobFactory.in_state(State.FAILED, task_path="tests.tasks.boom", max_attempts=1)
    login(driver, f"{live_server.url}/admin/django_jobstate/job/{failed.pk}/change/")

    note = driver.find_element(By.CSS_SELECTOR, ".jobstate-note")
    assert note.text.startswith(
        "Attempt 1 of 1 failed (error: ValueError); no further attempt is queued."
    ), note.text
    failure = driver.find_element(By.CSS_SELECTOR, ".jobstate-history .jobstate-failure")
    assert failure.text == "error: ValueError"
    screenshot(driver, "admin-failed-job-retry-button.png")
    click_and_load(driver, note.find_element(By.CSS_SELECTOR, "button.jobstate-retry"))

    new = Job.objects.get(previous=failed)
    assert (new.state, new.attempt, new.max_attempts) == (State.QUEUED, 2, 2)
    assert driver.current_url.endswith(f"/job/{new.pk}/change/")
    message = driver.find_element(By.CSS_SELECTOR, ".messagelist .success")
    assert message.text == f"Retried as attempt 2 (job #{new.pk}): queued to run now."
    link = message.find_element(By.TAG_NAME, "a")
    assert link.get_attribute("href").endswith(f"/job/{new.pk}/change/")
    assert "2/2" in driver.find_element(By.CSS_SELECTOR, ".field-attempt_of").text
    assert (
        "retried by hand by operator" in driver.find_element(By.CSS_SELECTOR, ".field-origin").text
    )
    assert not driver.find_elements(By.CSS_SELECTOR, "button.jobstate-retry")  # it is queued
    screenshot(driver, "admin-after-retry-button.png")

    # The failed attempt's page now says why there is no button.
    driver.get(f"{live_server.url}/admin/django_jobstate/job/{failed.pk}/change/")
    note = driver.find_element(By.CSS_SELECTOR, ".jobstate-note").text
    assert note == f"Retry is not offered: attempt 2 (job #{new.pk}) is queued.", note
    assert not driver.find_elements(By.CSS_SELECTOR, "button.jobstate-retry")


@pytest.mark.django_db(transaction=True)
def test_a_stuck_attempt_is_marked_where_the_operator_looks(browser, live_server, settings):
    from selenium.webdriver.common.by import By

    # Silent after 3 minutes, whatever a loaded machine makes of the page loads.
    settings.JOBSTATE_HEARTBEAT_INTERVAL = 60.0
    settings.JOBSTATE_LOST_AFTER = 600.0
    driver = browser
    User.objects.create_superuser("operator", password=PASSWORD)
    long_ago = timezone.now() - timedelta(minutes=5)
    WorkerHeartbeat.objects.create(
        worker_id="web-1:99", host="web-1", pid=99, started_at=long_ago, last_seen=long_ago
    )
    stuck = JobFactory.in_state(State.RUNNING, worker_id="web-1:99", started_at=long_ago)
    healthy = JobFactory.in_state(State.RUNNING, task_path="tests.tasks.email")
    login(driver, f"{live_server.url}/admin/django_jobstate/job/")

    [mark] = driver.find_elements(By.CSS_SELECTOR, "#result_list .jobstate-stuck")
    assert mark.is_displayed()
    assert "worker silent since" in mark.text
    assert "(5 min" in mark.text
    assert "JOBSTATE_LOST_AFTER" in mark.get_attribute("title")
    assert mark.value_of_css_property("color") == mark.value_of_css_property("border-top-color")
    row = mark.find_element(By.XPATH, "ancestor::tr")
    assert row.find_element(By.LINK_TEXT, str(stuck.pk))
    assert not driver.find_element(By.LINK_TEXT, str(healthy.pk)).find_elements(
        By.XPATH, "ancestor::tr//*[contains(@class, 'jobstate-stuck')]"
    )
    screenshot(driver, "admin-stuck-attempt-list.png")

    click_and_load(driver, row.find_element(By.LINK_TEXT, str(stuck.pk)))
    mark = driver.find_element(By.CSS_SELECTOR, ".field-state_badge .jobstate-stuck")
    assert mark.is_displayed()
    assert "worker silent since" in mark.text
    screenshot(driver, "admin-stuck-attempt-page.png")


def test_a_missing_browser_skips_loudly_but_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must run in CI"):
        not_available("/usr/bin/chromium not found")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="BROWSER TEST NOT RUN"):
        not_available("/usr/bin/chromium not found")

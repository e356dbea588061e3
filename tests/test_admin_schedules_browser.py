"""The schedules' admin in a real browser (Debian's headless Chromium): the list, Disable,
Run now. The browser fixture and its rules are test_admin_browser's."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User

from django_jobstate.models import Job, Schedule
from django_jobstate.schedules.definitions import Definition
from django_jobstate.schedules.scheduler import Scheduler, sync
from tests.test_admin_browser import browser, click_and_load, screenshot

__all__ = ["browser"]  # the fixture

NIGHTLY = Definition(
    name="nightly-report", task_path="tests.tasks.noop", cron="0 3 * * *", timezone="Europe/Paris"
)
POLL = Definition(name="poll-feeds", task_path="tests.tasks.noop", every=300, unique=True)


@pytest.mark.django_db(transaction=True)
def test_operator_sees_the_schedules_disables_one_and_runs_another(browser, live_server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    driver = browser
    operator = User.objects.create_user("operator", password="s3cret-pw", is_staff=True)
    operator.user_permissions.set(
        Permission.objects.filter(codename__in=["view_schedule", "change_schedule", "view_job"])
    )
    sync([NIGHTLY, POLL])
    due = Schedule.objects.get(name="poll-feeds").next_tick_at - timedelta(seconds=300)
    Schedule.objects.filter(name="poll-feeds").update(next_tick_at=due)
    Scheduler("t", {d.name: d for d in (NIGHTLY, POLL)}).run_once()  # a tick of poll-feeds

    driver.get(f"{live_server.url}/admin/django_jobstate/schedule/")
    driver.find_element(By.NAME, "username").send_keys("operator")
    driver.find_element(By.NAME, "password").send_keys("s3cret-pw")
    click_and_load(driver, driver.find_element(By.CSS_SELECTOR, "input[type=submit]"))
    rows = {
        row.find_element(By.CSS_SELECTOR, "th").text: row
        for row in driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    }
    assert set(rows) == {"nightly-report", "poll-feeds"}
    nightly = rows["nightly-report"].text
    assert "0 3 * * * (Europe/Paris)" in nightly
    assert "(in " in nightly
    poll = rows["poll-feeds"]
    assert "every 300 s" in poll.text
    assert "ago)" in poll.find_element(By.CSS_SELECTOR, ".field-last_tick").text
    assert poll.find_element(By.CSS_SELECTOR, ".field-last_job .jobstate-badge").text == "QUEUED"
    screenshot(driver, "admin-schedules.png")

    # Disable the nightly report.
    driver.find_element(By.CSS_SELECTOR, "input.action-select[value='nightly-report']").click()
    Select(driver.find_element(By.NAME, "action")).select_by_value("disable")
    click_and_load(
        driver, driver.find_element(By.CSS_SELECTOR, "#changelist-form button[name=index]")
    )
    message = driver.find_element(By.CSS_SELECTOR, ".messagelist .success").text
    assert message == "1 schedule disabled."
    assert not Schedule.objects.get(name="nightly-report").enabled
    badge = driver.find_element(By.CSS_SELECTOR, "#result_list tbody tr .field-enabled_badge")
    assert badge.text == "DISABLED"

    # Run the feeds now: unique, and its last job is still queued: not run again.
    driver.find_element(By.CSS_SELECTOR, "input.action-select[value='poll-feeds']").click()
    Select(driver.find_element(By.NAME, "action")).select_by_value("run_now")
    click_and_load(
        driver, driver.find_element(By.CSS_SELECTOR, "#changelist-form button[name=index]")
    )
    warning = driver.find_element(By.CSS_SELECTOR, ".messagelist .warning")
    assert warning.text.startswith("Not enqueued, a job with the same unique key is still live")
    assert "poll-feeds" in warning.text
    assert Job.objects.filter(schedule_name="poll-feeds").count() == 1
    screenshot(driver, "admin-schedules-after-actions.png")

"""The schedules' admin in a real browser (Debian's headless Chromium): the list, Disable,
Run now. The browser fixture and its rules are test_admin_browser's."""

from datetime import timedelta

import pytest

from django_jobstate.models import Job, Schedule
from django_jobstate.schedules.definitions import Definition
from django_jobstate.schedules.scheduler import Scheduler, sync
from tests.browser import at_sizes, browser, click_and_load, login, screenshot, staff_user
from tests.test_schedules_race import env

__all__ = ["browser"]  # the fixture

NIGHTLY = Definition(
    name="nightly-report", task_path="tests.tasks.noop", cron="0 3 * * *", timezone="Europe/Paris"
)
POLL = Definition(name="poll-feeds", task_path="tests.tasks.noop", every=300, unique=True)


def columns_in_view(driver, size: str) -> None:
    from selenium.webdriver.common.by import By

    """At 1366x768 every column of the list shows whole; on a phone it scrolls in its box."""
    if size == "laptop":
        assert driver.find_element(By.ID, "nav-sidebar").is_displayed()
        assert driver.find_element(By.ID, "changelist-filter").is_displayed()
        found = driver.execute_script(
            "const box = document.querySelector('#changelist .results');"
            "return [box.scrollWidth, box.clientWidth];"
        )
        assert found[0] <= found[1], f"a column of the schedules is cut off: {found}"


@pytest.mark.django_db(transaction=True)
def test_operator_sees_the_schedules_disables_one_and_runs_another(browser, live_server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    driver = browser
    staff_user("view_schedule", "change_schedule", "view_job")
    sync([NIGHTLY, POLL])
    due = Schedule.objects.get(name="poll-feeds").next_tick_at - timedelta(seconds=300)
    Schedule.objects.filter(name="poll-feeds").update(next_tick_at=due)
    Scheduler("t", {d.name: d for d in (NIGHTLY, POLL)}).run_once()  # a tick of poll-feeds

    login(driver, f"{live_server.url}/admin/django_jobstate/schedule/")
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
    assert " ago" in poll.find_element(By.CSS_SELECTOR, ".field-last_job").text
    assert poll.find_element(By.CSS_SELECTOR, ".field-last_job .jobstate-badge").text == "QUEUED"
    screenshot(driver, "admin-schedules.png")
    # Beside both sidebars (the app navigation and the filters): nothing out of view.
    assert driver.find_element(By.ID, "nav-sidebar").is_displayed()
    assert driver.find_element(By.ID, "changelist-filter").is_displayed()
    at_sizes(driver, "admin-schedules-{width}.png", check=columns_in_view)

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


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_operator_adds_a_schedule_through_the_form_and_sees_its_first_job(
    browser, live_server, runjobs
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    driver = browser
    staff_user("view_schedule", "add_schedule", "change_schedule", "view_job")
    sync([NIGHTLY])  # one of the settings' beside it, which runjobs defines too
    nightly = {"task": NIGHTLY.task_path, "cron": NIGHTLY.cron, "timezone": NIGHTLY.timezone}
    proc = runjobs.start("--concurrency", "1", **env({NIGHTLY.name: nightly}))

    login(driver, f"{live_server.url}/admin/django_jobstate/schedule/add/")
    # First a mistake, which the form names beside its field.
    driver.find_element(By.NAME, "name").send_keys("heartbeat")
    driver.find_element(By.NAME, "task_path").send_keys("tests.tasks.record")
    driver.find_element(By.NAME, "every").send_keys("2")
    kwargs = driver.find_element(By.NAME, "kwargs")
    kwargs.clear()
    kwargs.send_keys('{"lable": "beat"}')
    at_sizes(driver, "admin-schedule-add-{width}.png")
    click_and_load(driver, driver.find_element(By.NAME, "_save"))
    error = driver.find_element(By.CSS_SELECTOR, ".field-args .errorlist").text
    assert "its args and kwargs do not match record()" in error
    at_sizes(driver, "admin-schedule-add-error-{width}.png")
    kwargs = driver.find_element(By.NAME, "kwargs")
    kwargs.clear()
    kwargs.send_keys('{"label": "beat"}')
    click_and_load(driver, driver.find_element(By.NAME, "_save"))
    assert "was added successfully" in driver.find_element(By.CSS_SELECTOR, ".messagelist").text
    row = Schedule.objects.get(name="heartbeat")
    assert (row.origin, row.every, row.kwargs) == ("admin", 2, {"label": "beat"})

    def first_job(driver):
        driver.refresh()
        found = driver.find_elements(
            By.CSS_SELECTOR, "#result_list tr:has(input[value='heartbeat']) .field-last_job a"
        )
        return found[0] if found else False

    # runjobs was running before it was added: no restart (on SQLite and MariaDB its
    # scheduler reads the schedules within 10 s; on PostgreSQL it is woken at once).
    link = WebDriverWait(driver, 90, poll_frequency=1).until(first_job)
    rows = {
        r.find_element(By.CSS_SELECTOR, "th").text: r.text
        for r in driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    }
    assert "admin" in rows["heartbeat"]
    assert "every 2 s" in rows["heartbeat"]
    assert "settings" in rows["nightly-report"]
    at_sizes(driver, "admin-schedules-with-admin-one-{width}.png")
    click_and_load(driver, link)
    ids = Job.objects.filter(schedule_name="heartbeat").values_list("pk", flat=True)
    assert driver.current_url.rstrip("/").split("/")[-2] in {str(pk) for pk in ids}
    assert "tests.tasks.record" in driver.find_element(By.TAG_NAME, "body").text
    at_sizes(driver, "admin-schedule-first-job-{width}.png")
    out = runjobs.stop(proc)
    assert proc.returncode == 0, out

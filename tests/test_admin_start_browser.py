"""The "Start a task" page in a real browser (Debian's headless Chromium), and a real
`runjobs` that runs what it started. The browser fixture and its rules are
test_admin_browser's; screenshots at 1366x768 and 390 px wide go to artifacts/."""

import pytest

from django_jobstate.models import Job
from django_jobstate.states import State
from tests.browser import at_sizes, browser, click_and_load, login, staff_user
from tests.models import Execution
from tests.waiting import wait_for

__all__ = ["browser"]  # the fixture


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_operator_starts_a_task_from_the_form_and_a_real_worker_runs_it(
    browser, live_server, runjobs
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    driver = browser
    staff_user("view_job", "enqueue_task")
    runjobs.start("--queue", "default")

    login(driver, f"{live_server.url}/admin/django_jobstate/job/")
    button = driver.find_element(By.CSS_SELECTOR, ".object-tools a.jobstate-start-link")
    assert button.text == "START A TASK"
    at_sizes(
        driver,
        {
            "laptop": "admin-start-task-button-desktop.png",
            "phone": "admin-start-task-button-phone.png",
        },
        fits=False,
    )
    click_and_load(driver, button)
    assert driver.find_element(By.TAG_NAME, "h1").text == "Start a task"
    at_sizes(
        driver,
        {"laptop": "admin-start-task-form-desktop.png", "phone": "admin-start-task-form-phone.png"},
    )

    # A mistake first: the arguments' JSON is cut short, and the page says so on its field.
    Select(driver.find_element(By.NAME, "task")).select_by_value("tests.tasks.record")
    args = driver.find_element(By.NAME, "args")
    args.clear()
    args.send_keys('["from the browser <b>!</b>"')
    click_and_load(driver, driver.find_element(By.NAME, "_start"))
    error = driver.find_element(By.CSS_SELECTOR, ".field-args .errorlist").text
    assert error.startswith("The arguments are not valid JSON"), error
    assert not Job.objects.exists()
    at_sizes(
        driver,
        {
            "laptop": "admin-start-task-error-desktop.png",
            "phone": "admin-start-task-error-phone.png",
        },
    )

    args = driver.find_element(By.NAME, "args")
    assert args.get_attribute("value") == '["from the browser <b>!</b>"'  # kept, as text
    args.send_keys("]")
    click_and_load(driver, driver.find_element(By.NAME, "_start"))
    job = Job.objects.get()
    assert driver.current_url.endswith(f"/job/{job.pk}/change/")
    message = driver.find_element(By.CSS_SELECTOR, ".messagelist .success")
    assert message.text == (
        f"Started tests.tasks.record: job #{job.pk} (result id {job.result_id})."
    )
    assert (
        message.find_element(By.TAG_NAME, "a")
        .get_attribute("href")
        .endswith(f"/job/{job.pk}/change/")
    )

    # The worker runs it; the page, reloaded, says so and who started it.
    wait_for(lambda: Job.objects.get(pk=job.pk).state == State.SUCCEEDED, "the worker")
    assert list(Execution.objects.values_list("label", flat=True)) == ["from the browser <b>!</b>"]
    driver.refresh()
    assert driver.find_element(By.CSS_SELECTOR, ".field-state_badge .jobstate-badge").text == (
        "SUCCEEDED"
    )
    origin = driver.find_element(By.CSS_SELECTOR, ".field-origin").text
    assert "started by hand by operator" in origin
    at_sizes(
        driver,
        {"laptop": "admin-start-task-done-desktop.png", "phone": "admin-start-task-done-phone.png"},
        fits=False,
    )

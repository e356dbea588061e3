"""The job list, a job's page and the bulk confirmation page at the sizes operators use:
a laptop (1366x768: no clipped column) and a phone (390 px wide: no horizontal page
scroll but the results table's own scroller). Screenshots of each at both sizes go to
artifacts/; the confirmation flow is driven as an operator would."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_jobstate.models import Job, JobQueue, WorkerHeartbeat
from django_jobstate.states import State
from tests.browser import (
    PASSWORD,
    SIZES,
    assert_no_sideways_scroll,
    browser,
    click_and_load,
    login,
    save_page,
    staff_user,
    use_size,
)
from tests.factories import JobFactory

__all__ = ["browser"]  # the fixture

# What overflows, measured in the page: cells whose content is wider than the cell, the
# results table wider than its scroller, and the page wider than the viewport.
MEASURE = """
const clipped = [];
for (const cell of document.querySelectorAll(
    '#result_list th, #result_list td, fieldset .readonly, .jobstate-history td, '
    + '.jobstate-confirm *'
)) {
  if (cell.scrollWidth > cell.clientWidth + 1 && getComputedStyle(cell).overflowX !== 'auto') {
    clipped.push((cell.className || cell.tagName) + ': ' + cell.textContent.trim().slice(0, 60));
  }
}
const results = document.querySelector('#changelist .results');
return {
  viewport: window.innerWidth,
  page: document.documentElement.scrollWidth,
  table: results ? results.scrollWidth : 0,
  scroller: results ? results.clientWidth : 0,
  clipped: clipped,
};
"""


def measure(driver, size: str, name: str) -> dict:
    """Check the page at `size`, and save its screenshot (the whole page's height)."""
    use_size(driver, size)
    found = driver.execute_script(MEASURE)
    save_page(driver, f"admin-{name}-{size}.png")
    assert found["viewport"] == SIZES[size][0], found
    assert_no_sideways_scroll(driver, f"{name} at {size}")
    assert found["clipped"] == [], f"{name} clips at {size}: {found['clipped']}"
    if size == "laptop":
        assert found["table"] <= found["scroller"], f"{name}: a column is cut off: {found}"
    return found


def busy_console() -> dict[str, Job]:
    """A list as an incident shows it: long task paths, every state, stuck marks."""
    long_ago = timezone.now() - timedelta(minutes=7)
    WorkerHeartbeat.objects.create(
        worker_id="web-01.prod.example.com:48213",
        host="web-01.prod.example.com",
        pid=48213,
        started_at=long_ago,
        last_seen=long_ago,
    )
    JobQueue.objects.pause("emails", by="test")
    jobs = {}
    for i in range(6):
        jobs[f"failed{i}"] = JobFactory.in_state(
            State.FAILED,
            task_path="billing.tasks.reconcile_invoices_for_every_customer_account",
            queue_name="billing-reconciliation",
            error_class="billing.errors.PaymentProviderUnavailableError",
            error_message="The payment provider answered 503 " * 5,
            worker_id="web-01.prod.example.com:48213",
            max_attempts=5,
            attempt=1,
        )
    jobs["cancelled"] = JobFactory.in_state(State.QUEUED)
    Job.objects.cancel(jobs["cancelled"])
    jobs["stuck"] = JobFactory.in_state(
        State.RUNNING,
        task_path="reports.tasks.build_quarterly_report",
        worker_id="web-01.prod.example.com:48213",
        started_at=long_ago,
        timeout=60,
        cancel_requested_at=long_ago,
    )
    jobs["paused"] = JobFactory.in_state(State.QUEUED, queue_name="emails", priority=10)
    jobs["done"] = JobFactory.in_state(State.SUCCEEDED, return_value={"rows": 1234})
    return jobs


@pytest.mark.django_db(transaction=True)
def test_list_page_and_confirmation_fit_a_laptop_and_a_phone(browser, live_server, settings):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    settings.JOBSTATE_HEARTBEAT_INTERVAL = 60.0
    settings.JOBSTATE_LOST_AFTER = 600.0
    driver = browser
    staff_user("view_job", "change_job")
    jobs = busy_console()
    login(driver, f"{live_server.url}/admin/django_jobstate/job/")

    for size in SIZES:
        measure(driver, size, "job-list")
    driver.get(f"{live_server.url}/admin/django_jobstate/job/{jobs['failed0'].pk}/change/")
    for size in SIZES:
        measure(driver, size, "failed-job")
    driver.get(f"{live_server.url}/admin/django_jobstate/job/{jobs['stuck'].pk}/change/")
    for size in SIZES:
        measure(driver, size, "stuck-job")

    # Tick every failed job and choose Retry: the confirmation page.
    use_size(driver, "laptop")
    driver.get(f"{live_server.url}/admin/django_jobstate/job/?state__exact=failed")
    driver.find_element(By.ID, "action-toggle").click()
    Select(driver.find_element(By.NAME, "action")).select_by_value("retry_jobs")
    click_and_load(
        driver, driver.find_element(By.CSS_SELECTOR, "#changelist-form button[name=index]")
    )
    plan = driver.find_element(By.CSS_SELECTOR, ".jobstate-plan").text
    assert plan == (
        "6 failed jobs will get a new attempt; 1 is skipped: cancelled (this action never "
        "retries a cancel)."
    ), plan
    assert not Job.objects.filter(state=State.QUEUED, previous__isnull=False).exists()
    for size in SIZES:
        measure(driver, size, "retry-confirmation")

    use_size(driver, "phone")  # confirmed on a phone
    click_and_load(driver, driver.find_element(By.CSS_SELECTOR, ".jobstate-confirm [type=submit]"))
    message = driver.find_element(By.CSS_SELECTOR, ".messagelist .warning").text
    assert message.startswith("Queued a new attempt for 6 of 7 selected jobs: "), message
    assert Job.objects.filter(state=State.QUEUED, previous__isnull=False).count() == 6


@pytest.mark.django_db(transaction=True)
def test_cancel_of_a_running_job_asks_first_in_the_browser(browser, live_server):
    from selenium.webdriver.common.by import By

    driver = browser
    User.objects.create_superuser("operator", password=PASSWORD)
    job = JobFactory.in_state(State.RUNNING, worker_id="web-2:77", task_path="app.tasks.export")
    login(driver, f"{live_server.url}/admin/django_jobstate/job/{job.pk}/change/")

    click_and_load(driver, driver.find_element(By.CSS_SELECTOR, "a.jobstate-cancel-button"))
    plan = driver.find_element(By.CSS_SELECTOR, ".jobstate-plan").text
    assert plan.startswith(f"Job #{job.pk} is running on worker web-2:77: it will be asked")
    assert Job.objects.get(pk=job.pk).cancel_requested_at is None  # nothing written yet
    for size in SIZES:
        measure(driver, size, "cancel-confirmation")

    use_size(driver, "laptop")
    click_and_load(driver, driver.find_element(By.LINK_TEXT, "No, take me back"))
    assert driver.current_url.endswith(f"/job/{job.pk}/change/")
    assert Job.objects.get(pk=job.pk).cancel_requested_at is None

    click_and_load(driver, driver.find_element(By.CSS_SELECTOR, "a.jobstate-cancel-button"))
    click_and_load(driver, driver.find_element(By.CSS_SELECTOR, ".jobstate-confirm [type=submit]"))
    assert driver.current_url.endswith(f"/job/{job.pk}/change/")
    message = driver.find_element(By.CSS_SELECTOR, ".messagelist .success").text
    assert message.startswith(f"Job #{job.pk} is running: it was asked to stop")
    assert Job.objects.get(pk=job.pk).cancel_requested_at is not None


@pytest.mark.django_db(transaction=True)
def test_the_queues_page_fits_a_laptop_and_a_phone(browser, live_server):
    """The page an operator pauses a queue from, mid-incident: counts and who paused it."""
    driver = browser
    staff_user("view_jobqueue", "change_jobqueue", "view_job")
    busy_console()  # "emails" paused, with a queued job; others queued and running
    JobQueue.objects.pause("billing-reconciliation", by="web-01.prod.example.com ops on call")
    login(driver, f"{live_server.url}/admin/django_jobstate/jobqueue/")
    for size in SIZES:
        measure(driver, size, "queues")
    rows = driver.find_elements("css selector", "#result_list tbody tr")
    assert {row.find_element("css selector", "th").text for row in rows} >= {
        "emails",
        "billing-reconciliation",
    }

"""The Dashboard in a real browser (Debian's headless Chromium, as test_admin_browser.py),
after real jobs ran: the charts draw, the figures refresh without a reload, the page fits
at 1366x768 and at 390 px wide (screenshots of both in artifacts/)."""

import pytest

from django_jobstate.runner.worker import Worker
from tests import tasks
from tests.browser import at_sizes, browser, click_and_load, login, staff_user

__all__ = ["browser"]  # the fixture


def run_jobs() -> None:
    Worker(burst=True, poll_interval=0.05).run()


@pytest.mark.django_db(transaction=True)
def test_the_dashboard_draws_refreshes_and_fits_after_real_jobs(browser, live_server):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    driver = browser
    staff_user("view_job")
    for i in range(6):
        tasks.record.enqueue(f"r{i}")
    for _ in range(3):
        tasks.boom.enqueue("disk <b>full</b>")
    tasks.email.enqueue("ops@example.com")
    run_jobs()

    # From the job list, by its link.
    login(driver, f"{live_server.url}/admin/django_jobstate/job/")
    click_and_load(
        driver, driver.find_element(By.CSS_SELECTOR, ".object-tools a[href$='/dashboard/']")
    )
    assert driver.current_url.endswith("/admin/django_jobstate/job/dashboard/")

    charts = driver.find_elements(By.CSS_SELECTOR, "svg.jobstate-chart[role=img]")
    assert len(charts) == 3
    for chart in charts:
        assert chart.size["width"] > 200
        assert chart.size["height"] > 50
        assert chart.find_element(By.TAG_NAME, "title").get_attribute("textContent")
    bars = charts[0].find_elements(By.CSS_SELECTOR, "rect")
    assert {bar.get_attribute("class") for bar in bars} == {
        "jobstate-o-succeeded",
        "jobstate-o-error",
    }
    total = driver.find_element(By.CSS_SELECTOR, ".jobstate-queues tfoot")
    assert total.find_elements(By.TAG_NAME, "td")[0].text == "10"
    failing = driver.find_elements(By.CSS_SELECTOR, ".jobstate-failing tbody tr")
    assert [row.find_element(By.TAG_NAME, "th").text for row in failing] == ["boom"]
    assert "disk <b>full</b>" in failing[0].text  # shown as text, not markup
    at_sizes(
        driver, {"laptop": "admin-dashboard-desktop.png", "phone": "admin-dashboard-phone.png"}
    )

    # The figures follow the jobs without a reload: a marker set on the page survives.
    driver.get(f"{live_server.url}/admin/django_jobstate/job/dashboard/?refresh=2")
    driver.execute_script("window.jobstateNotReloaded = true")
    for i in range(4):
        tasks.record.enqueue(f"more{i}")
    run_jobs()

    def total_finished(driver) -> str:
        cells = driver.find_elements(By.CSS_SELECTOR, ".jobstate-queues tfoot td")
        return cells[0].text if cells else ""

    # A refresh may swap the figures between finding a cell and reading it: look again.
    WebDriverWait(driver, 60, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: total_finished(d) == "14"
    )
    assert driver.execute_script("return window.jobstateNotReloaded") is True
    assert len(driver.find_elements(By.CSS_SELECTOR, "svg.jobstate-chart")) == 3

    # The failing task's link: the job list, filtered to its failed attempts (from the page
    # as first loaded, refreshed only every 15 s: no swap under the click).
    driver.get(f"{live_server.url}/admin/django_jobstate/job/dashboard/")
    link = driver.find_element(By.CSS_SELECTOR, ".jobstate-failing tbody th a")
    click_and_load(driver, link)
    assert "state__exact=failed" in driver.current_url
    assert len(driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == 3

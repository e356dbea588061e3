"""A step's workflow in a real browser (Debian's headless Chromium, as test_admin_browser.py):
the SVG renders with a box per step, and a box is a link to its step's page. Screenshots
at 1366x768 and 390 px wide in artifacts/."""

import pytest

from tests.browser import at_sizes, browser, click_and_load, login, staff_user
from tests.workflow_rows import chord

__all__ = ["browser"]  # the fixture


@pytest.mark.django_db(transaction=True)
def test_the_workflow_renders_and_a_box_leads_to_its_step(browser, live_server):
    from selenium.webdriver.common.by import By

    driver = browser
    staff_user("view_job")
    steps = chord(50, callback="waiting")
    login(driver, f"{live_server.url}/admin/django_jobstate/job/{steps[0].pk}/change/")

    svg = driver.find_element(By.CSS_SELECTOR, "svg.jobstate-workflow-picture")
    assert svg.size["width"] > 400
    assert svg.size["height"] > 200
    links = svg.find_elements(By.CSS_SELECTOR, "a.jobstate-wf")
    assert len(links) == 51
    # Coloured by state (admin.css applies): a succeeded box and the waiting callback differ.
    fill = "return getComputedStyle(arguments[0].querySelector('rect')).fill"
    assert driver.execute_script(fill, links[0]) != driver.execute_script(fill, links[-1])
    at_sizes(driver, "admin-workflow-{size}.png")

    click_and_load(driver, links[-1])  # the callback's box
    assert driver.current_url.endswith(f"/admin/django_jobstate/job/{steps[-1].pk}/change/")
    this = driver.find_element(By.CSS_SELECTOR, "svg.jobstate-workflow-picture a[aria-current]")
    assert this.get_dom_attribute("href").endswith(f"/{steps[-1].pk}/change/")

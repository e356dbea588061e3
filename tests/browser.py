"""The browser tests' shared parts: Debian's headless Chromium (the `browser` fixture),
logging in through the admin's form, and the sizes operators use (a 1366x768 laptop, a
390 px wide phone) with a screenshot of the whole page and the check that nothing scrolls
sideways at each.

Never a downloaded browser or driver: both paths are explicit, so Selenium Manager has
nothing to fetch. Without them a test skips with a loud reason, except under CI=true,
where it fails: CI installs them (.ci/run) and must not skip.
"""

import base64
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


def not_available(reason: str) -> None:
    reason = f"BROWSER TEST NOT RUN: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: browser tests must run in CI)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        not_available(
            f"{' and '.join(missing)} not found. Install Debian's packages: "
            f"apt-get install chromium chromium-driver"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        not_available("selenium is not installed (it is in the test dependency group)")
    # Belt and braces: Selenium Manager must never download a browser or a driver.
    monkeypatch.setenv("SE_OFFLINE", "true")
    monkeypatch.setenv("SE_AVOID_STATS", "true")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1440,1000",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    yield driver
    driver.quit()


def click_and_load(driver, element) -> None:
    """Click something that loads a new page, and wait until the old one is gone."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.wait import WebDriverWait

    html = driver.find_element("tag name", "html")
    element.click()

    def gone(_driver) -> bool:
        try:
            html.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            # Asked in the middle of the navigation, Chromium says so instead of "stale".
            if "does not belong to the document" in str(exc):
                return True
            raise
        return False

    WebDriverWait(driver, 10).until(gone)


def screenshot(driver, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    # The whole page, not just the window: resize to the document's height first.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1440, max(1000, height))
    assert driver.save_screenshot(str(ARTIFACTS / name))
    driver.set_window_size(1440, 1000)


PASSWORD = "s3cret-pw"
# The sizes operators use; the browser's own window (1440x1000) is the rest of each test's.
SIZES = {"laptop": (1366, 768), "phone": (390, 844)}


def staff_user(*codenames: str, username: str = "operator") -> object:
    """A staff user holding the permissions `codenames` ("view_job"), password PASSWORD."""
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def login(driver, url: str, username: str = "operator", password: str = PASSWORD) -> None:
    """Open `url` and log in through the admin's form it leads to."""
    driver.get(url)
    driver.find_element("name", "username").send_keys(username)
    driver.find_element("name", "password").send_keys(password)
    click_and_load(driver, driver.find_element("css selector", "input[type=submit]"))


def use_size(driver, size: str) -> None:
    """Emulate the viewport of `size` exactly (a window's outer size varies by platform)."""
    width, height = SIZES[size]
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": size == "phone"},
    )


def use_window(driver) -> None:
    """Back to the browser's own window (the fixture's 1440x1000)."""
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def widths(driver) -> dict[str, int]:
    """The viewport's width and the page's: wider means a sideways scroll."""
    return driver.execute_script(
        "return {viewport: window.innerWidth, page: document.documentElement.scrollWidth};"
    )


def assert_no_sideways_scroll(driver, what: str) -> None:
    found = widths(driver)
    overflow = found["page"] - found["viewport"]
    assert overflow <= 0, f"{what} scrolls sideways by {overflow} px: {found}"


def save_page(driver, name: str) -> None:
    """A screenshot of the whole page (past the viewport's height) as artifacts/`name`."""
    content = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": content["width"], "height": content["height"], "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / name).write_bytes(base64.b64decode(shot["data"]))


def at_sizes(
    driver,
    names: str | dict[str, str],
    *,
    fits: bool = True,
    check: Callable[[object, str], object] | None = None,
) -> None:
    """The page at each of SIZES: no sideways scroll (unless not `fits`), `check(driver,
    size)` if given, and the whole page saved as artifacts/ `names[size]`, or `names`
    formatted with the size's name and width ("admin-x-{size}.png", "admin-x-{width}.png").
    Then back to the window."""
    for size, (width, _height) in SIZES.items():
        use_size(driver, size)
        # Saved first: a failed check leaves the picture of what failed.
        save_page(
            driver, names[size] if isinstance(names, dict) else names.format(size=size, width=width)
        )
        if fits:
            assert_no_sideways_scroll(driver, f"{names} at {width} px")
        if check is not None:
            check(driver, size)
    use_window(driver)

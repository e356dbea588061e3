"""Fixtures of the Wagtail stage: a runjobs subprocess on this test run's database and media
directory, and Wagtail's own objects."""

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.files.images import ImageFile
from django.db import connection
from PIL import Image as PILImage

ROOT = Path(__file__).resolve().parent.parent


class Runjobs:
    """One `manage.py runjobs` process per test, on the Wagtail site's settings.

    It keeps running between drains: a worker's start (Django and Wagtail set up twice, in the
    supervisor and its spawned worker) costs seconds, a drain only the poll interval.
    """

    def __init__(self, log: Path, media_root: str) -> None:
        self.log = log
        self.media_root = media_root
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *args: str, **env: str) -> None:
        assert self.proc is None, "runjobs runs already"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "runjobs", *args],
                cwd=ROOT,
                env={
                    **os.environ,
                    "DJANGO_SETTINGS_MODULE": "tests_wagtail.settings",
                    "JOBSTATE_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
                    "JOBSTATE_TEST_MEDIA_ROOT": self.media_root,
                    "PYTHONUNBUFFERED": "1",
                    **env,
                },
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def drain(self, timeout: float = 120) -> None:
        """Wait until the worker ran every job enqueued so far (starting it the first time)."""
        from django_jobstate.models import Job
        from django_jobstate.states import State

        if self.proc is None:
            self.start()
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while Job.objects.filter(state__in=[State.QUEUED, State.RUNNING]).exists():
            if self.proc.poll() is not None:
                pytest.fail(f"runjobs exited ({self.proc.returncode}):\n{self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"jobs left after {timeout:g} s; runjobs said:\n{self.output()}")
            time.sleep(0.05)

    def stop(self) -> str:
        """Stop it as a deployment does (SIGTERM) and return its output; it must exit 0."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"runjobs did not stop on SIGTERM:\n{self.output()}")
        assert self.proc.returncode == 0, self.output()
        return self.output()

    def output(self) -> str:
        return self.log.read_text()[-6000:]

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def media_root(settings, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


@pytest.fixture
def runjobs(tmp_path: Path, media_root: Path) -> Iterator[Runjobs]:
    """Stopped with SIGTERM at the end of the test (before the database is flushed), and
    must exit 0 then."""
    runner = Runjobs(tmp_path / "runjobs.log", str(media_root))
    yield runner
    if runner.proc is not None and runner.proc.poll() is None:
        runner.stop()
    runner.cleanup()


@pytest.fixture
def site_root():
    """The root page of the default site, which Wagtail's migrations create."""
    from wagtail.models import Site

    return Site.objects.get(is_default_site=True).root_page.specific


def assert_no_job_failed() -> None:
    """Every attempt so far succeeded, save those a worker handed back unstarted (reason
    `released`: they never ran, and their next attempt was queued at once)."""
    from django_jobstate.models import Job
    from django_jobstate.states import FailureReason, State

    assert Job.objects.exists()
    assert not Job.objects.filter(state__in=[State.QUEUED, State.RUNNING]).exists()
    failed = Job.objects.filter(state=State.FAILED).exclude(failure_reason=FailureReason.RELEASED)
    assert list(failed.values("task_path", "args", "failure_reason", "error_message")) == []


def png(name: str, size: tuple[int, int] = (64, 48)) -> ImageFile:
    buffer = io.BytesIO()
    PILImage.new("RGB", size, "teal").save(buffer, "PNG")
    return ImageFile(buffer, name=name)


@pytest.fixture
def make_image(media_root: Path):
    """Upload an image to Wagtail's image library, as its API does."""
    from wagtail.images.models import Image

    def make(title: str = "a photo"):
        return Image.objects.create(title=title, file=png(f"{title}.png"))

    return make

"""A frontend cache backend that writes each purged URL to a file: the tests read it to see
Wagtail's purge task run in the worker."""

from pathlib import Path

from django.conf import settings
from wagtail.contrib.frontend_cache.backends import BaseBackend


def purged_file() -> Path:
    return Path(settings.MEDIA_ROOT) / "purged.txt"


class RecordingBackend(BaseBackend):
    def purge(self, url: str) -> None:
        purged_file().parent.mkdir(parents=True, exist_ok=True)
        with purged_file().open("a") as out:
            out.write(f"{url}\n")

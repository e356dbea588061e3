"""A router that puts every model on the "jobs" database: the workers must never need
"default" (see test_runjobs.py: "default" is made unreachable there)."""

from typing import Any


class EverythingOnJobs:
    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "jobs"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "jobs"

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db == "jobs"

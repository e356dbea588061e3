from django.db import models


class Execution(models.Model):
    """One row per run of a test task's body: counts how often each job really ran."""

    label = models.CharField(max_length=200)

    class Meta:
        app_label = "tests"

    def __str__(self) -> str:
        return self.label

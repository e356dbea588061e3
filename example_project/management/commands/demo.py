"""`manage.py demo`: create the demo superuser and enqueue a few demo jobs."""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from example_project.tasks import add, divide, send_welcome_email

USERNAME = PASSWORD = "admin"


class Command(BaseCommand):
    help = "Create the demo superuser (admin/admin) and enqueue demo jobs."

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        if not user_model.objects.filter(username=USERNAME).exists():
            user_model.objects.create_superuser(USERNAME, "admin@example.com", PASSWORD)
        results = [
            add.enqueue(2, 3),
            add.enqueue(40, 2),
            send_welcome_email.enqueue("ada@example.com"),
            send_welcome_email.using(priority=20).enqueue("grace@example.com"),
            divide.enqueue(1, 0),
        ]
        for result in results:
            self.stdout.write(f"Enqueued {result.task.name}{tuple(result.args)}: {result.id}")
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo superuser: username {USERNAME!r}, password {PASSWORD!r}. "
                f"divide(1, 0) is meant to fail."
            )
        )

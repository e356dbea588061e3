"""Demo tasks: plain @task functions, nothing specific to django-jobstate."""

import time

import django

if django.VERSION >= (6, 1):
    from django.tasks import task
else:  # Django 5.2 and 6.0: the django-tasks backport (README, Requirements)
    from django_tasks import task


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails", priority=10)
def send_welcome_email(address: str) -> dict[str, str]:
    time.sleep(0.2)  # stands in for talking to a mail server
    return {"sent_to": address}


@task
def divide(a: float, b: float) -> float:
    return a / b  # the demo enqueues divide(1, 0): a job that fails with a traceback

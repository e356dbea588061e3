"""The benchmark's settings for django-jobstate: its app and its backend, nothing else."""

import os

from bench.benchmark.bench_settings import *  # noqa: F403
from bench.benchmark.bench_settings import database

INSTALLED_APPS = ["django_jobstate"]
# Django's default SQLite settings: the app sets WAL and a busy timeout on its connections.
DATABASES = {"default": database()}
TASKS = {"default": {"BACKEND": "django_jobstate.backend.JobStateBackend"}}
# The tasks' module is no app's `tasks` module, which is all a worker imports unasked.
JOBSTATE_TASK_MODULES = ["bench.benchmark.bench_tasks"]

# JOBSTATE_BENCH_OBSERVE=1: what metrics and tracing cost. Tracing on, with the SDK and a
# batch processor whose exporter drops the spans (what a project with an OTLP exporter
# pays, less the network); bench_run.py adds --metrics-port to runjobs.
if os.environ.get("JOBSTATE_BENCH_OBSERVE") == "1":
    from bench.benchmark.bench_observe import install_tracing

    JOBSTATE_TRACING = True
    install_tracing()

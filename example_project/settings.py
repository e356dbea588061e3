"""Settings for the example project: django-jobstate on SQLite, with the admin."""

from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "example-project-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_jobstate",
    "example_project",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "example_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": BASE_DIR / "example.sqlite3",
    }
}

TASKS = {
    "default": {
        "BACKEND": "django_jobstate.backend.JobStateBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            # Periodic jobs: every runjobs enqueues each tick once (README "Periodic jobs").
            "SCHEDULES": {
                "add-every-minute": {
                    "task": "example_project.tasks.add",
                    "cron": "* * * * *",
                    "args": [2, 3],
                    "unique": True,
                },
            },
        },
    }
}
# Prune finished jobs hourly: successes after a week, failures after a month.
JOBSTATE_RETENTION = {"succeeded": "7d", "failed": "30d"}

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_jobstate": {"handlers": ["console"], "level": "INFO"}},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

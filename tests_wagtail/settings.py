"""A stock Wagtail 8 site (its project template's settings, trimmed), with the package as its
TASKS backend and no task setting at all: no JOBSTATE_* name, no QUEUES, no task options.

SQLite by default, PostgreSQL with JOBSTATE_TEST_DB=postgres. A runjobs subprocess reads the
test database's name from JOBSTATE_TEST_DB_NAME and the media directory from
JOBSTATE_TEST_MEDIA_ROOT, which the tests set for it.
"""

import json
import os
import tempfile
from pathlib import Path

SECRET_KEY = "wagtail-site-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "tests_wagtail.home",
    "wagtail.contrib.forms",
    "wagtail.contrib.redirects",
    "wagtail.contrib.frontend_cache",
    "wagtail.embeds",
    "wagtail.sites",
    "wagtail.users",
    "wagtail.snippets",
    "wagtail.documents",
    "wagtail.images",
    "wagtail.search",
    "wagtail.admin",
    "wagtail",
    "modelcluster",
    "taggit",
    "django_filters",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_jobstate",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "wagtail.contrib.redirects.middleware.RedirectMiddleware",
]

ROOT_URLCONF = "tests_wagtail.urls"
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

DB = os.environ.get("JOBSTATE_TEST_DB", "sqlite")
TEST_DB_NAME = os.environ.get("JOBSTATE_TEST_DB_NAME")  # set for runjobs subprocesses
if DB == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": TEST_DB_NAME or os.environ.get("PGDATABASE", "jobstate"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "jobstate"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
        }
    }
    # Wagtail's database search backend on PostgreSQL (its own requirement).
    INSTALLED_APPS.append("django.contrib.postgres")
elif DB == "sqlite":
    # A file, so that runjobs subprocesses share the test database; one per test run.
    sqlite_path = Path(tempfile.gettempdir()) / f"jobstate-wagtail-{os.getpid()}.sqlite3"
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": TEST_DB_NAME or sqlite_path,
            "TEST": {"NAME": sqlite_path},
        }
    }
else:
    raise RuntimeError(f"JOBSTATE_TEST_DB must be 'sqlite' or 'postgres', not {DB!r}")

# The one line this package needs.
TASKS = {"default": {"BACKEND": "django_jobstate.backend.JobStateBackend"}}

STATIC_URL = "/static/"
MEDIA_URL = "/media/"
MEDIA_ROOT = os.environ.get("JOBSTATE_TEST_MEDIA_ROOT") or str(
    Path(tempfile.gettempdir()) / f"jobstate-wagtail-media-{os.getpid()}"
)
DATA_UPLOAD_MAX_NUMBER_FIELDS = 10_000

WAGTAIL_SITE_NAME = "jobstate"
WAGTAILSEARCH_BACKENDS = {"default": {"BACKEND": "wagtail.search.backends.database"}}
WAGTAILADMIN_BASE_URL = "http://localhost"
# Publishing purges the page's URLs through Wagtail's purge task; this backend writes them
# to a file, so the tests see the task run.
WAGTAILFRONTENDCACHE = {"recorder": {"BACKEND": "tests_wagtail.home.cache.RecordingBackend"}}

# Settings a test adds for its runjobs subprocess, as JSON (the task options of the Wagtail
# guide, docs/howto/wagtail.md); none otherwise.
globals().update(json.loads(os.environ.get("JOBSTATE_TEST_SETTINGS", "{}")))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_jobstate": {"handlers": ["console"], "level": "INFO"}},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

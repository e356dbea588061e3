"""System checks: each id fires for its bad setting, none for good ones, and none crash."""

import sys
import types
from dataclasses import fields
from decimal import Decimal

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection, connections
from django.test import override_settings
from django.utils.functional import SimpleLazyObject

from django_jobstate.backend import JobStateBackend
from django_jobstate.checks.settings import NUMBERS
from django_jobstate.conf import Settings
from tests.framework import IMMEDIATE_BACKEND, IMPORT_TASK

pytestmark = pytest.mark.django_db

IMMEDIATE = {"default": {"BACKEND": IMMEDIATE_BACKEND}}


class CustomBackend(JobStateBackend):
    pass


def messages(**overrides):
    with override_settings(**overrides):
        return [m for m in run_checks() if m.id and m.id.startswith("django_jobstate.")]


def ids(**overrides):
    return sorted(m.id.removeprefix("django_jobstate.") for m in messages(**overrides))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"JOBSTATE_LOST_AFTER": 0.25}, ["E001"]),  # the test settings beat every 0.25 s
        ({"JOBSTATE_HEARTBEAT_INTERVAL": 10}, ["E001"]),
        # a judge needs beats at most LOST_AFTER / 2 apart: three intervals, not two
        ({"JOBSTATE_HEARTBEAT_INTERVAL": 1.1}, ["E001"]),
        ({"JOBSTATE_POLL_INTERVAL": 0}, ["E002"]),
        ({"JOBSTATE_HEARTBEAT_INTERVAL": -1}, ["E002"]),
        ({"JOBSTATE_LOST_AFTER": float("inf")}, ["E002"]),
        ({"JOBSTATE_POLL_INTERVAL": float("nan")}, ["E002"]),
        ({"JOBSTATE_MAX_PAYLOAD_BYTES": 0}, ["E002"]),
        ({"JOBSTATE_DEFAULT_TIMEOUT": 0}, ["E002"]),
        ({"JOBSTATE_DEFAULT_BACKOFF": -1}, ["E002"]),
        ({"JOBSTATE_MAX_BACKOFF": -1}, ["E002"]),
        ({"JOBSTATE_POLL_INTERVAL": 1e10}, ["E002"]),  # beyond a day: Event.wait overflows
        ({"JOBSTATE_HEARTBEAT_INTERVAL": 86_401, "JOBSTATE_LOST_AFTER": 1e6}, ["E002"]),
        ({"JOBSTATE_LOST_AFTER": 1e12}, ["E002"]),  # beyond a year: datetimes overflow
        ({"JOBSTATE_MAX_BACKOFF": 1e12}, ["E002"]),
        ({"JOBSTATE_DEFAULT_BACKOFF": 1e9, "JOBSTATE_MAX_BACKOFF": 1e9}, ["E002", "E002"]),
        ({"JOBSTATE_DEFAULT_TIMEOUT": 1e9}, ["E002"]),
        ({"JOBSTATE_CANCEL_GRACE": -1}, ["E002"]),
        ({"JOBSTATE_CANCEL_GRACE": 86_401}, ["E002"]),  # beyond a day: a cancel never stops
        ({"JOBSTATE_CANCEL_GRACE": "30"}, ["E004"]),
        ({"JOBSTATE_LOST_AFTER": "30"}, ["E004"]),
        ({"JOBSTATE_HEARTBEAT_INTERVAL": "5"}, ["E004"]),  # and no E001 comparing it
        ({"JOBSTATE_POLL_INTERVAL": None}, ["E004"]),
        ({"JOBSTATE_MAX_PAYLOAD_BYTES": 1.5}, ["E004"]),
        ({"JOBSTATE_DEFAULT_MAX_ATTEMPTS": True}, ["E004"]),
        ({"JOBSTATE_DEFAULT_TIMEOUT": "60"}, ["E004"]),
        ({"JOBSTATE_DEFAULT_BACKOFF": Decimal("1.5")}, ["E004"]),
        ({"JOBSTATE_DEFAULT_MAX_ATTEMPTS": 0}, ["E005"]),
        ({"JOBSTATE_DEFAULT_MAX_ATTEMPTS": 1001}, ["E005"]),
        ({"JOBSTATE_MAX_BACKOFF": 5, "JOBSTATE_DEFAULT_BACKOFF": 10}, ["W001"]),
        ({"JOBSTATE_LOST_AFTR": 30}, ["W002"]),
        ({"TASKS": IMMEDIATE}, ["W003"]),
        ({"JOBSTATE_TASK_MODULES": "tests.tasks"}, ["E007"]),  # a string, not a list of them
        ({"JOBSTATE_TASK_MODULES": ["tests.tasks", 5]}, ["E007"]),
        ({"JOBSTATE_TASK_MODULES": ["tests.no_such_module"]}, ["E008"]),
        ({"JOBSTATE_TASK_MODULES": ["no_such_package.tasks"]}, ["E008"]),
        ({"JOBSTATE_TASK_MODULES": [""]}, ["E008"]),
        ({"JOBSTATE_LISTEN_DATABASE": "direct"}, ["E013"]),  # not an alias of DATABASES
        ({"JOBSTATE_LISTEN_DATABASE": ["default"]}, ["E013"]),
    ],
)
def test_each_check_fires_for_its_bad_setting(overrides, expected):
    found = messages(**overrides)

    assert sorted(m.id.removeprefix("django_jobstate.") for m in found) == expected
    assert all(m.hint for m in found)
    named = [name for name in overrides if name.startswith("JOBSTATE_")]
    assert all(any(name in m.msg for name in named) for m in found if named)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {f"JOBSTATE_{f.name}": f.default for f in fields(Settings)},
        {"JOBSTATE_LOST_AFTER": 30, "JOBSTATE_HEARTBEAT_INTERVAL": 5},  # ints for seconds
        {"JOBSTATE_DEFAULT_TIMEOUT": 60.5, "JOBSTATE_DEFAULT_MAX_ATTEMPTS": 1000},
        {"JOBSTATE_DEFAULT_BACKOFF": 0, "JOBSTATE_MAX_BACKOFF": 0},  # retry at once
        {"JOBSTATE_DEFAULT_BACKOFF": 60, "JOBSTATE_MAX_BACKOFF": 60},
        {"JOBSTATE_CANCEL_GRACE": 0},  # stop a cancelled attempt at once
        {
            "JOBSTATE_POLL_INTERVAL": 86_400,
            "JOBSTATE_HEARTBEAT_INTERVAL": 86_400,
            "JOBSTATE_LOST_AFTER": 3 * 86_400,
        },
        {"JOBSTATE_LOST_AFTER": 365 * 86_400, "JOBSTATE_MAX_BACKOFF": 365 * 86_400},
        {"TASKS": {**IMMEDIATE, "jobs": {"BACKEND": "tests.test_checks.CustomBackend"}}},
        # The app's own ImmediateBackend, for test settings, counts as using the app.
        {"TASKS": {"default": {"BACKEND": "django_jobstate.backend.ImmediateBackend"}}},
        {"JOBSTATE_TASK_MODULES": ("tests.tasks", "tests.factories")},
    ],
)
def test_good_settings_pass(overrides):
    assert ids(**overrides) == []


def test_the_numeric_settings_are_known_from_their_types():
    expected = {
        "HEARTBEAT_INTERVAL": {float},
        "LOST_AFTER": {float},
        "POLL_INTERVAL": {float},
        "MAX_PAYLOAD_BYTES": {int},
        "DEFAULT_MAX_ATTEMPTS": {int},
        "DEFAULT_BACKOFF": {float},
        "DEFAULT_TIMEOUT": {float, type(None)},
        "MAX_BACKOFF": {float},
    }
    assert {name: NUMBERS.get(name) for name in expected} == expected


@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_every_numeric_setting_is_checked(name):
    found = messages(**{f"JOBSTATE_{name}": "5"})

    assert [m.id for m in found] == ["django_jobstate.E004"]
    assert f"JOBSTATE_{name} must be " in found[0].msg
    assert "not str '5'" in found[0].msg


def test_messages_say_what_and_how_to_fix():
    (error,) = messages(JOBSTATE_LOST_AFTER="30")
    assert error.msg == "JOBSTATE_LOST_AFTER must be a number of seconds, not str '30'."
    assert error.hint == "Write it as a number, without quotes: JOBSTATE_LOST_AFTER = 30.0."

    (error,) = messages(JOBSTATE_POLL_INTERVAL=0)
    assert error.msg == "JOBSTATE_POLL_INTERVAL must be a positive number of seconds, not 0."

    (error,) = messages(JOBSTATE_MAX_BACKOFF=1e12)
    assert error.msg == (
        "JOBSTATE_MAX_BACKOFF must be at most 3.1536e+07 seconds (a year), not 1000000000000.0."
    )


def test_the_listen_database_must_be_a_postgresql_alias():
    (unknown,) = messages(JOBSTATE_LISTEN_DATABASE="direct")
    assert unknown.msg == (
        "JOBSTATE_LISTEN_DATABASE is 'direct', which is not an alias of DATABASES "
        "('default'): workers could not LISTEN for new jobs and cancels."
    )
    assert "directly (not through PgBouncer in transaction mode)" in unknown.hint

    found = messages(JOBSTATE_LISTEN_DATABASE="default")
    if connection.vendor == "postgresql":
        assert found == []
    else:
        (error,) = found
        assert error.id == "django_jobstate.E013"
        assert error.msg == (
            f"JOBSTATE_LISTEN_DATABASE names DATABASES['default'], which is "
            f"{connection.display_name}, not PostgreSQL: only PostgreSQL has LISTEN/NOTIFY."
        )


def test_unknown_name_hint_suggests_the_closest_setting():
    (typo,) = messages(JOBSTATE_LOST_AFTR=30)
    (other,) = messages(JOBSTATE_COLOUR="blue")

    assert typo.msg == "JOBSTATE_LOST_AFTR is not a django-jobstate setting; it has no effect."
    assert typo.hint == "Did you mean JOBSTATE_LOST_AFTER?"
    assert other.hint.startswith("The settings are: JOBSTATE_HEARTBEAT_INTERVAL, ")


def test_missing_backend_hint_shows_the_tasks_setting():
    (warning,) = messages(TASKS=IMMEDIATE)

    assert '"BACKEND": "django_jobstate.backend.JobStateBackend"' in warning.hint


def test_no_backend_warning_when_the_app_is_not_installed():
    from django_jobstate.checks.settings import check_tasks_backend

    with override_settings(
        INSTALLED_APPS=[a for a in settings.INSTALLED_APPS if a != "django_jobstate"],
        TASKS=IMMEDIATE,
    ):
        assert check_tasks_backend() == []


@pytest.mark.parametrize(
    "garbage", ["5", "", None, [], {}, object(), b"1", float("nan"), -1, True, Decimal(1)]
)
def test_check_command_reports_garbage_without_crashing(garbage):
    overrides = {f"JOBSTATE_{f.name}": garbage for f in fields(Settings)}

    with override_settings(**overrides), pytest.raises(SystemCheckError) as error:
        call_command("check")

    assert "django_jobstate.E00" in str(error.value)


@pytest.mark.parametrize("tasks", ["nonsense", {"default": "nonsense"}, {"default": {}}])
def test_backend_check_survives_a_malformed_tasks_setting(tasks):
    from django_jobstate.checks.settings import check_tasks_backend

    with override_settings(TASKS=tasks):
        assert [m.id for m in check_tasks_backend()] == ["django_jobstate.W003"]


@pytest.mark.parametrize(
    ("use_tz", "time_zone", "refused_without_tz"),
    [
        (False, "Europe/Paris", True),  # east of UTC
        (False, "America/New_York", True),  # west of UTC
        (False, "Europe/London", True),  # UTC in winter only
        (False, "UTC", False),
        (False, "Etc/UTC", False),
        (True, "Europe/Paris", False),  # aware times: stored as UTC
    ],
)
def test_naive_local_times_are_refused_where_the_database_has_no_time_zone(
    use_tz, time_zone, refused_without_tz
):
    """SQLite and MariaDB/MySQL store naive times; PostgreSQL's timestamptz does not."""
    found = messages(USE_TZ=use_tz, TIME_ZONE=time_zone)

    refused = refused_without_tz and connection.vendor in ("sqlite", "mysql")
    assert [m.id for m in found] == (["django_jobstate.E006"] if refused else [])
    if refused:
        assert time_zone in found[0].msg
        assert found[0].hint == 'Set USE_TZ = True (Django\'s default), or TIME_ZONE = "UTC".'


@pytest.mark.parametrize(("zone", "refused"), [("Europe/Paris", True), ("Etc/UTC", False)])
def test_a_database_time_zone_is_refused_where_the_database_has_none(zone, refused):
    """SQLite and MariaDB/MySQL: Django stores times in the DATABASES TIME_ZONE, and the
    rescue, prune and (on MariaDB/MySQL) the claim compare them with the clock in UTC."""
    wrapper = connections["default"]
    saved = wrapper.settings_dict["TIME_ZONE"]
    wrapper.settings_dict["TIME_ZONE"] = zone
    try:
        found = messages(USE_TZ=True)
    finally:
        wrapper.settings_dict["TIME_ZONE"] = saved

    refused = refused and connection.vendor in ("sqlite", "mysql")
    assert [m.id for m in found] == (["django_jobstate.E006"] if refused else [])
    if refused:
        assert f"its TIME_ZONE is {zone!r}" in found[0].msg
        assert found[0].hint == (
            "Remove TIME_ZONE from DATABASES['default'] (Django then stores UTC), or set it "
            'to "UTC".'
        )


def test_an_imported_task_that_workers_would_refuse_is_reported(make_module):
    name = make_module("jobs", IMPORT_TASK + "@task\ndef job() -> None: ...\n")
    __import__(name)  # as the project's views would
    found = messages()
    listed = ids(JOBSTATE_TASK_MODULES=[name])

    assert [(m.id, m.msg, m.hint) for m in found] == [
        (
            "django_jobstate.W004",
            f"Workers would refuse the task '{name}.job', and enqueue() raises for it: "
            f"{name!r} is not a task module of this project.",
            f"Define it in an installed app's `tasks` module (or import it there), or add "
            f"{name!r} to JOBSTATE_TASK_MODULES.",
        )
    ]
    assert listed == []


def test_a_lazy_object_in_an_imported_module_is_never_set_up(monkeypatch):
    # The backport's django_stubs_ext imports django.contrib.admin in every project: its
    # `site` raises LookupError when set up without the admin app. W004 reads every module.
    def never_set_up():
        raise LookupError("No installed app with label 'admin'.")

    module = types.ModuleType("jobstate_lazy_site")
    module.site = SimpleLazyObject(never_set_up)
    monkeypatch.setitem(sys.modules, module.__name__, module)

    assert messages() == []

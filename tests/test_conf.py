"""The settings object: defaults, and project values that override them."""

from django.conf import settings
from django.test import override_settings

from django_jobstate.conf import MAXIMUM, Settings, get_settings


def test_defaults_apply_to_names_the_project_does_not_set():
    conf = get_settings()

    assert not hasattr(settings, "JOBSTATE_MAX_BACKOFF")
    assert conf.MAX_BACKOFF == Settings.MAX_BACKOFF == 3600.0
    assert conf.DEFAULT_TIMEOUT is None
    assert conf.LOST_AFTER == settings.JOBSTATE_LOST_AFTER == 3.0  # the test settings' value


def test_overrides_apply_and_are_undone():
    with override_settings(JOBSTATE_LOST_AFTER=99, JOBSTATE_DEFAULT_TIMEOUT=5):
        conf = get_settings()
        assert (conf.LOST_AFTER, conf.DEFAULT_TIMEOUT) == (99, 5)

    assert (get_settings().LOST_AFTER, get_settings().DEFAULT_TIMEOUT) == (3.0, None)


def test_values_past_their_maximum_are_clamped_so_nothing_overflows():
    huge = {"POLL_INTERVAL": 1e10, "MAX_BACKOFF": 1e12, "LOST_AFTER": float("nan")}
    with override_settings(**{f"JOBSTATE_{name}": value for name, value in huge.items()}):
        conf = get_settings()
        assert (
            MAXIMUM["POLL_INTERVAL"],
            MAXIMUM["MAX_BACKOFF"],
            MAXIMUM["LOST_AFTER"],
        ) == (conf.POLL_INTERVAL, conf.MAX_BACKOFF, conf.LOST_AFTER)
        assert MAXIMUM["POLL_INTERVAL"] == 86_400  # a day
        assert MAXIMUM["MAX_BACKOFF"] == 365 * 86_400  # a year


def test_a_bad_value_is_left_for_the_system_checks_to_report():
    with override_settings(JOBSTATE_LOST_AFTER="30"):
        assert get_settings().LOST_AFTER == "30"  # no crash here; the checks report E004

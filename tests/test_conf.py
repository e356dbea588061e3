"""The settings object: defaults, and project values that override them."""

from django.conf import settings
from django.test import override_settings

from django_jobstate.conf import Settings, get_settings


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


def test_a_bad_value_is_left_for_the_system_checks_to_report():
    with override_settings(JOBSTATE_LOST_AFTER="30"):
        assert get_settings().LOST_AFTER == "30"  # no crash here; the checks report E004

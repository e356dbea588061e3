"""The version the package reports, and the changelog that goes with it."""

import re
from pathlib import Path

from packaging.version import Version

import django_jobstate

ROOT = Path(__file__).resolve().parent.parent


def test_the_version_is_a_pep_440_version():
    assert str(Version(django_jobstate.__version__)) == django_jobstate.__version__


def test_the_changelog_has_an_unreleased_section_and_one_for_the_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (\S+)", changelog, flags=re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert django_jobstate.__version__ in headings

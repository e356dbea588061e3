"""The version the package reports, and the changelog that goes with it."""

import re
import tomllib
from pathlib import Path

import django_jobstate

ROOT = Path(__file__).resolve().parent.parent


def pyproject_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def test_the_package_reports_the_pyproject_version():
    assert django_jobstate.__version__ == pyproject_version()


def test_the_changelog_has_an_unreleased_section_and_one_for_the_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (\S+)", changelog, flags=re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert pyproject_version() in headings

"""Sphinx configuration of the documentation site: Markdown pages (MyST) under docs/, built
by scripts/docs into docs/_build/html, a folder that opens offline (furo bundles its assets).
"""

import re
from pathlib import Path

# The version as pyproject.toml reads it, without importing the package (that needs Django
# and settings; the site needs neither).
_init = (Path(__file__).parent.parent / "django_jobstate" / "__init__.py").read_text()
found = re.search(r'^__version__ = "(.+)"$', _init, re.M)
assert found, "no __version__ in django_jobstate/__init__.py"
release = found[1]
version = release

project = "django-jobstate"
author = "django-jobstate contributors"
copyright = "django-jobstate contributors"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
# Every link to a heading (`page.md#heading`, GitHub's anchors, as tests/test_readme.py
# checks them) resolves or warns; scripts/docs makes warnings errors.
myst_heading_anchors = 4
nitpicky = True

html_theme = "furo"
html_title = f"django-jobstate {release}"
# Nothing loaded from the network: no fonts, scripts or CDNs (scripts/docs checks the build).
html_copy_source = False
html_show_sourcelink = False

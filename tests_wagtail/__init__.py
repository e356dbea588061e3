"""A Wagtail 8 site on this package's backend, for the Wagtail stage of scripts/test.

It runs in its own venv (.venv-matrix/wagtail, made by scripts/lib.sh ensure_wagtail_venv):
scripts/test-wagtail.
"""

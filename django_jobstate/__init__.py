"""Background jobs for Django's Tasks framework, stored in your database."""

# The one place the version is written: pyproject.toml reads it from here, as Django's
# does (setuptools parses it without importing the package).
__version__ = "0.1.0"

"""Background jobs for Django's Tasks framework, stored in your database."""

from importlib.metadata import PackageNotFoundError, version

try:
    # pyproject.toml holds the version; the installed distribution reports it.
    __version__ = version("django-jobstate")
except PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"

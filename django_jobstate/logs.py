"""The public path of the JSON log formatter (see django_jobstate/telemetry/logs.py)."""

from .telemetry.logs import JsonFormatter

__all__ = ["JsonFormatter"]

"""The public path of the metrics view (see django_jobstate/telemetry/gauges.py)."""

from .telemetry.gauges import metrics_view

__all__ = ["metrics_view"]

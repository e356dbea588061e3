"""The public path of the metrics view (see django_jobstate/telemetry/metrics.py)."""

from .telemetry.metrics import metrics_view

__all__ = ["metrics_view"]

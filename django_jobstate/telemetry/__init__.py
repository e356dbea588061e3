"""What the package tells operators: Prometheus metrics (metrics.py), OpenTelemetry spans
(tracing.py) and JSON log lines (logs.py). Their public names keep their first paths:
django_jobstate.metrics.metrics_view and django_jobstate.logs.JsonFormatter."""

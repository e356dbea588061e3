from django.contrib import admin
from django.urls import path

from django_jobstate.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("jobs/metrics", metrics_view, name="jobstate-metrics"),
]

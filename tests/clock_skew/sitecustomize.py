"""Skew this process's clock by JOBSTATE_TEST_CLOCK_SKEW seconds, for the clock tests.

Only on the PYTHONPATH of the subprocesses those tests start (tests.conftest.skewed_env):
Python imports `sitecustomize` at startup, before Django, so every later reader of the
time (time.time(), django.utils.timezone.now()) sees the skewed clock. The database's
clock is left alone.
"""

import os
import time
from datetime import timedelta

SKEW = float(os.environ.get("JOBSTATE_TEST_CLOCK_SKEW", "0"))

if SKEW:
    from django.utils import timezone

    _time, _time_ns, _now = time.time, time.time_ns, timezone.now
    time.time = lambda: _time() + SKEW
    time.time_ns = lambda: _time_ns() + int(SKEW * 1e9)
    timezone.now = lambda: _now() + timedelta(seconds=SKEW)

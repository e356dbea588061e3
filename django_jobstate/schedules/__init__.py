"""Periodic jobs: definitions.py (parsing a schedule, its next tick, catch-up), model.py
(the Schedule table), settings.py (the schedules of the settings, JOBSTATE_RETENTION and
their checks), writes.py (storing definitions, a tick's job) and scheduler.py (the thread
of each runjobs supervisor that enqueues each tick exactly once)."""

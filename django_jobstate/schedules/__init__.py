"""Periodic jobs: definitions.py (parsing a schedule, its next tick, catch-up), model.py
(the Schedule table), settings.py (the schedules of the settings, JOBSTATE_RETENTION and
their checks), edits.py (the schedules made in the admin: validation and conditional
writes), writes.py (storing the settings' definitions, a tick's job), scheduler.py (what
each runjobs supervisor does to enqueue each tick exactly once) and thread.py (its thread).
"""

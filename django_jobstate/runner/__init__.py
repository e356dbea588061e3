"""The processes behind `manage.py runjobs`.

supervisor.py starts and replaces worker processes; monitor.py is its database thread
(heartbeats, rescue, cancel requests); relay.py its one LISTEN connection. worker.py is
each worker's loop: claim, run (attempts.py; several at once: inflight.py), record the
outcome (recording.py, flushing.py). ledger.py is what a worker holds, in memory its
supervisor reads; liveness.py, watchdog.py, cancels.py, wakeup.py, burst.py and stuck.py
are the parts of that loop named by their files. They write through managers/ only.
"""

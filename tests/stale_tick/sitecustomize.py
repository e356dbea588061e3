"""Stop this process (SIGSTOP) once, inside the scheduler, between reading a due tick and
its compare-and-set, for the race tests: when resumed, its write is stale and must lose.
With JOBSTATE_TEST_TICK_GATE=<a file's path>, only the scheduler's thread waits there,
until that file exists. Or (JOBSTATE_TEST_PAUSE_BEFORE_STORE=<a file's path>) pause the
scheduler's thread alone, before its first write of a definition over a stored one (a
rolling deploy's sync, after it read the rows), until that file exists: then what it
read is stale. Only that thread waits, so that on SQLite no other thread of the process
is stopped holding the write lock.

Only on the PYTHONPATH of the subprocesses those tests start (JOBSTATE_TEST_STOP_BEFORE_TICK
set): Python imports `sitecustomize` at startup, before Django, so the scheduler module is
wrapped when it is first imported.
"""

import importlib.abc
import importlib.util
import os
import signal
import sys
import time


class _WrapScheduler(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "django_jobstate.schedules.scheduler":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            tick = module.Scheduler._tick

            def stopping_tick(scheduler, *args):
                module.Scheduler._tick = tick  # once
                module.logger.warning("Stopping before the compare-and-set of %s", args[1].name)
                if gate := os.environ.get("JOBSTATE_TEST_TICK_GATE"):
                    # The scheduler's thread alone (no lock held on SQLite), until it exists.
                    deadline = time.monotonic() + 120  # a safety net: the test opens it
                    while not os.path.exists(gate) and time.monotonic() < deadline:
                        time.sleep(0.05)
                else:
                    os.kill(os.getpid(), signal.SIGSTOP)
                return tick(scheduler, *args)

            module.Scheduler._tick = stopping_tick

        spec.loader.exec_module = exec_module
        return spec


class _WrapUpdate(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "django_jobstate.schedules.scheduler":
            return None
        sys.meta_path.remove(self)
        import logging
        import time

        from django.db.models import QuerySet

        update = QuerySet.update
        gate = os.environ["JOBSTATE_TEST_PAUSE_BEFORE_STORE"]

        def pausing_update(queryset, **kwargs):
            if queryset.model.__name__ == "Schedule" and "definition_hash" in kwargs:
                QuerySet.update = update  # once
                logging.getLogger("django_jobstate.scheduler").warning(
                    "Pausing before the store of %s", kwargs.get("task_path")
                )
                deadline = time.monotonic() + 120  # a safety net: the test opens the gate
                while not os.path.exists(gate) and time.monotonic() < deadline:
                    time.sleep(0.05)
            return update(queryset, **kwargs)

        QuerySet.update = pausing_update
        return None  # imported as usual


if os.environ.get("JOBSTATE_TEST_STOP_BEFORE_TICK"):
    sys.meta_path.insert(0, _WrapScheduler())
if os.environ.get("JOBSTATE_TEST_PAUSE_BEFORE_STORE"):
    sys.meta_path.insert(0, _WrapUpdate())

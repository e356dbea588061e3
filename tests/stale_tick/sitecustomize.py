"""Stop this process (SIGSTOP) once, inside the scheduler, between reading a due tick and
its compare-and-set, for the race tests: when resumed, its write is stale and must lose.

Only on the PYTHONPATH of the subprocesses those tests start (JOBSTATE_TEST_STOP_BEFORE_TICK
set): Python imports `sitecustomize` at startup, before Django, so the scheduler module is
wrapped when it is first imported.
"""

import importlib.abc
import importlib.util
import os
import signal
import sys


class _WrapScheduler(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "django_jobstate.scheduler":
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
                os.kill(os.getpid(), signal.SIGSTOP)
                return tick(scheduler, *args)

            module.Scheduler._tick = stopping_tick

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("JOBSTATE_TEST_STOP_BEFORE_TICK"):
    sys.meta_path.insert(0, _WrapScheduler())

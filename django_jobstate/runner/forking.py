"""How the supervisor starts worker processes: forked from a server that set Django up once.

Spawned workers (a fresh interpreter each) import Django and the project again: on a
2-core machine, four of them at once took about 3 s before the first could claim. Where
the platform has it (Linux, macOS), the supervisor starts multiprocessing's fork server
first thing, preloaded with preload.py (Django set up, the worker's modules imported, no
database connection open), and each worker is a fork of it: ready in milliseconds. The
fork server is a fresh process with no thread and no connection of the supervisor's, so a
fork of it inherits neither (forking the supervisor itself would copy its threads' locks
and its open connections). Elsewhere, and if the fork server cannot start, workers are
spawned as before.

As with Celery's prefork pool, AppConfig.ready() runs once, in the fork server, not in
each worker: a thread it starts is not running in the workers (libraries that start
threads, such as OpenTelemetry's span processors and Sentry's transport, restart them
after a fork).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext

PRELOAD = "django_jobstate.runner.preload"


def worker_context() -> ForkServerContext | SpawnContext:
    """The multiprocessing context the supervisor starts workers with."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([PRELOAD])
        return context
    return multiprocessing.get_context("spawn")


def start_server(context: BaseContext) -> None:
    """Start the fork server now, so that it sets Django up while the supervisor starts its
    threads. (It inherits this process's environment as it is now: call it once
    everything the workers must inherit is set, e.g. the metrics directory.)"""
    if context.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def parents(context: BaseContext) -> tuple[int, ...]:
    """The pids a worker's parent may have while its supervisor lives: the supervisor's,
    and the fork server's (which exits when the supervisor does)."""
    pids = [os.getpid()]
    if context.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        server = getattr(forkserver._forkserver, "_forkserver_pid", None)
        if server:
            pids.append(server)
    return tuple(pids)


def on_sigterm(stop: Callable[[], Any]) -> None:
    """In a worker: call `stop` for each SIGTERM from now on, the one that came while it
    started included (a fork is born with SIGTERM blocked: preload.py).

    `stop` runs in a thread of its own, never in the signal handler: a handler runs in the
    main thread between two of its bytecodes, wherever it is, and one that set the
    worker's threading.Event came, once in a while at load, while the main thread held
    that Event's lock inside Event.wait(): it waited for that lock for ever, and the
    worker, then runjobs, never exited. The handler only writes a byte to a pipe, which
    takes no lock; the thread reads it and stops the worker as any thread would. (SIGTERM
    stays unblocked in the main thread: a process a task starts inherits the mask.)"""
    read_end, write_end = os.pipe()

    def pass_on() -> None:
        while os.read(read_end, 1):
            stop()

    threading.Thread(target=pass_on, name="sigterm", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda signum, frame: os.write(write_end, b"."))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def release_server() -> None:
    """In a worker forked from the fork server: let go of the fork server's "alive" pipe.

    multiprocessing hands each fork a copy of the write end, and the fork server exits
    only once every copy is closed: with the workers' copies open, a supervisor killed
    outright would leave its fork server and workers running, unsupervised. Without them,
    the server exits with the supervisor and its workers with it (child.py's parent
    death signal, and Worker.orphaned())."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        os.close(fd)
        setattr(server, "_forkserver_alive_fd", None)  # noqa: B010  (private: no stub)


def send(process: BaseProcess, signum: int) -> None:
    """SIGTERM or SIGKILL a worker process that may have ended meanwhile.

    A fork server reaps its children as they die, before this process hears of it: a
    worker killed at one attempt's deadline, found past another's the next turn, was gone
    by the second os.kill(), whose ProcessLookupError ended the supervisor (seen in a
    torture run). multiprocessing's kill() and terminate() pass over a process gone."""
    if signum == signal.SIGKILL:
        process.kill()
    else:
        process.terminate()

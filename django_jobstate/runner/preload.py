"""Imported by the fork server that worker processes are forked from (forking.py): Django
set up once, the worker's modules imported, and no database connection left open for the
forks to share.

The fork server must outlive a SIGTERM sent to every process (a process group's, as
`kill -TERM -PGID` sends, or a cgroup's, as systemd stops a unit): its workers die with
it, and they must finish their attempts in hand first. So it blocks SIGTERM, and each
worker is born with SIGTERM blocked: one sent while the worker starts stays pending in the
kernel until the worker has set its handler (child.py, forking.on_sigterm()), and then
stops it. (A Python handler would not do: CPython forgets the signals that arrive between
fork() and its after-fork hook, and under load a supervisor stopping at that instant sent
its SIGTERM there, and the worker never heard it: it ran on, unsupervised.)

If the setup fails here, the fork server starts all the same and keeps the traceback:
each worker forked from it prints that traceback and exits, as a spawned worker whose
setup failed did (a second setup in the fork would only say "populate() isn't
reentrant", not why).
"""

import signal
import sys
import traceback
from types import FrameType

failure: str | None = None


def _in_fork_server() -> bool:
    """Whether multiprocessing's fork server is importing this module (and not, say, a
    documentation tool): its main() is on the stack."""
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith("forkserver.py"):
            return True
        frame = frame.f_back
    return False


if _in_fork_server():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        import django

        django.setup()
        from django.db import connections

        from . import child, worker  # noqa: F401  (what every worker imports next)

        connections.close_all()
    except Exception:
        failure = traceback.format_exc()
